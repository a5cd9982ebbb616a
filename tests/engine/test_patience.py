"""Patience has one meaning everywhere (issue 37, item 13): 0 or None (null in a campaign file) turns early stopping off in
`gpufill.fit`, `gpufill train --patience` and a campaign's `train.early_stopping.patience`; a negative patience is
refused in all three with the same words."""

from __future__ import annotations

import pytest

from gpufill.campaign.spec.spec import load_campaign
from gpufill.campaign.trials.trials import expand
from gpufill.engine.config import PATIENCE_OFF, FitConfig
from gpufill.engine.loop import fit
from gpufill.errors import InputError
from tests.engine.test_fit import make_data, model
from tests.helpers import run_cli

REFUSED = "patience must be a whole number >= 0 ({off}), got -2"


def _worsening_fit(patience: int | None):  # noqa: ANN202 - a FitResult
    """Validation targets are the negated train targets: every epoch makes validation worse."""
    x, y = make_data()
    return fit(model(), (x[:200], y[:200]), (x[200:], -y[200:]), epochs=5, lr=1e-2, patience=patience, verbose=False)


@pytest.mark.parametrize("off", [0, None])
def test_fit_with_patience_0_or_none_trains_every_epoch(off):
    assert FitConfig(patience=off).patience is None  # one setting: 0 is kept as None
    result = _worsening_fit(off)
    assert result.metrics["epochs_run"] == 5 and result.status != "early_stopped"
    assert not any(event.startswith("early stop") for event in result.events)
    assert _worsening_fit(1).metrics["epochs_run"] < 5  # with patience the same training stops early


@pytest.mark.parametrize("bad", [-2, -1])
def test_fit_refuses_a_negative_patience_in_one_line(bad):
    x, y = make_data(32)
    with pytest.raises(InputError) as error:
        fit(model(), (x, y), patience=bad)
    assert error.value.field == "patience"
    assert error.value.problem == REFUSED.format(off=PATIENCE_OFF).replace("-2", str(bad))
    assert "or 0 to turn early stopping off" in error.value.fix


@pytest.mark.parametrize("bad", [-2, -7])
def test_train_refuses_a_negative_patience_with_the_same_words(capsys, bad):
    code, out, err = run_cli(capsys, "train", "--model", "mlp", "--epochs", 1, "--patience", bad)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"gpufill: error: command line: --patience: {REFUSED.format(off='0 turns early stopping off').replace('-2', str(bad))}; "
        "fix: pass --patience a whole number such as 5, or 0 to turn early stopping off"]


def test_train_help_says_what_0_means(capsys):
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0 and "0 turns early stopping off" in " ".join(out.replace("│", " ").split())


CAMPAIGN = """name: pat
data: {source: synthetic, projects: 1, length: 200, seed: 1}
task: {lookback: [6], horizon: 1}
models:
  mlp: {hidden_size: 8}
train:
  epochs: 2
  early_stopping: STOPPING
"""


@pytest.mark.parametrize("off", ["{patience: 0}", "{patience: null}", "{patience: 0, min_delta: 0.1}"])
def test_a_campaign_patience_of_0_or_null_is_early_stopping_off(tmp_path, off):
    path = tmp_path / "pat.yaml"
    path.write_text(CAMPAIGN.replace("STOPPING", off))
    spec = load_campaign(path)
    assert spec.train.early_stopping is None and spec.base_config({}, 0).patience is None
    path.write_text(CAMPAIGN.replace("STOPPING", "null"))
    plain = load_campaign(path)
    assert [t.trial_id for t in expand(spec, ["p000"])] == [t.trial_id for t in expand(plain, ["p000"])]  # the same trials
    path.write_text(CAMPAIGN.replace("STOPPING", "{patience: 3}"))
    assert load_campaign(path).base_config({}, 0).patience == 3


@pytest.mark.parametrize("bad", [-2, -1])
def test_a_campaign_refuses_a_negative_patience_with_the_same_words(tmp_path, capsys, bad):
    path = tmp_path / "pat.yaml"
    path.write_text(CAMPAIGN.replace("STOPPING", f"{{patience: {bad}}}"))
    with pytest.raises(InputError) as error:
        load_campaign(path)
    assert (error.value.where, error.value.field) == (f"{path}:8", "train.early_stopping.patience")
    assert error.value.problem == REFUSED.format(off="0 or null turns early stopping off").replace("-2", str(bad))
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and out == "" and err.strip().splitlines() == [f"gpufill: error: {error.value.one_line()}"]
    assert not (tmp_path / "work").exists()


def test_a_bool_is_not_a_patience():
    config = FitConfig(patience=False)
    assert config.patience is False  # not read as 0 (off) ...
    with pytest.raises(InputError, match="patience must be a whole number >= 0"):
        config.validate()  # ... but refused
