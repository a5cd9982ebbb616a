"""estimate, global mode, and classical families through `gpufill train` (the demo: tests/cli/test_demo.py)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from gpufill.campaign.run.estimate import estimate
from gpufill.campaign.run.runner import Campaign, read_results
from tests.helpers import run_cli, write_campaign


@pytest.mark.slow
def test_estimate_times_each_shape_and_predicts_per_lane(tmp_path, capsys):
    path = write_campaign(tmp_path, projects=3, epochs=10, models="mlp: {hidden_size: [8, 16]}\n  rf: {n_estimators: 40}")
    result = estimate(Campaign.from_yaml(path)).to_dict()
    assert result["lanes"]["cpu"]["trials"] == 3 * (2 + 1)
    assert {s["family"] for s in result["shapes"]} == {"mlp", "rf"}
    mlp_shapes = [s for s in result["shapes"] if s["family"] == "mlp"]
    assert len(mlp_shapes) == 2 and all(s["trials"] == 3 and s["seconds_per_trial"] > 0 for s in mlp_shapes)
    rf = next(s for s in result["shapes"] if s["family"] == "rf")
    assert "1 fit(s) timed, x 1 project(s)" in rf["how"] and "trees" not in rf["how"]  # 40 trees: timed as they are
    trial_seconds = sum(s["trials"] * s["seconds_per_trial"] for s in result["shapes"])
    lane = result["lanes"]["cpu"]
    assert lane["seconds"] == pytest.approx(trial_seconds / lane["slots"], rel=1e-3, abs=0.1)
    assert result["total_seconds"] == pytest.approx(lane["seconds"] + result["startup_seconds"], abs=0.11) and result["startup_seconds"] > 0
    code, out, _ = run_cli(capsys, "estimate", path, "--json")
    assert code == 0 and json.loads(out)["lanes"]["cpu"]["trials"] == 9


@pytest.mark.parametrize(("patience", "every", "refit", "validated", "bounds"), [
    (None, 1, False, True, (30, 30)),   # no early stopping: every epoch
    (None, 1, True, True, (60, 60)),    # and a refit as long
    (5, 1, False, True, (6, 30)),       # a best first epoch, then 5 without improvement
    (5, 1, True, True, (7, 60)),        # ... and a refit of that 1 epoch (the forecasting recipe's: middle 20.5)
    (5, 2, True, True, (14, 60)),       # validated every 2nd epoch: the first at 2, stopped at 12, refit 2
    (40, 1, True, True, (31, 60)),      # patience longer than the epochs: every epoch, a refit of at least 1
    (5, 1, True, False, (60, 60)),      # no validation windows: nothing stops early
])
def test_the_epochs_a_trial_trains_lie_between_the_fewest_and_most_early_stopping_allows(patience, every, refit, validated, bounds):
    from types import SimpleNamespace

    from gpufill.campaign.run.estimate import epochs_trained

    config = SimpleNamespace(epochs=30, patience=patience, validate_every=every, max_steps=None)
    assert epochs_trained(config, refit=refit, validated=validated) == bounds


def test_a_step_budget_ends_the_epochs_an_estimate_counts():
    """max_steps 250 at 100 steps an epoch: 2.5 epochs a training, whatever `epochs` allows (a refit as long)."""
    from types import SimpleNamespace

    from gpufill.campaign.run.estimate import epochs_trained

    config = SimpleNamespace(epochs=30, patience=None, validate_every=1, max_steps=250)
    assert epochs_trained(config, refit=True, steps_per_epoch=100) == (5.0, 5.0)
    assert epochs_trained(config, refit=False, steps_per_epoch=1000) == (0.25, 0.25)
    assert epochs_trained(SimpleNamespace(epochs=2, patience=None, validate_every=1, max_steps=250), refit=False, steps_per_epoch=100) == (2.0, 2.0)
    stopping = SimpleNamespace(epochs=30, patience=5, validate_every=1, max_steps=250)  # the fewest: a best first epoch, 5 without gain
    assert epochs_trained(stopping, refit=True, steps_per_epoch=100) == (2.5 + 1, 5.0)


def test_a_refit_over_more_windows_and_the_validation_pass_are_counted():
    """M1 under the recipe (two horizons of validation): a refit trains on 1.8x the training windows, and a first
    training's epoch costs 1.1 with its validation pass. Six epochs and a refit as long: 6 x 1.1 + 6 x 1.8 training
    epochs; early stopping at patience 5 the fewest 6 x 1.1 + 1 x 1.8; a step budget ends the refit as it ends the first."""
    from types import SimpleNamespace

    from gpufill.campaign.run.estimate import epochs_trained

    fixed = SimpleNamespace(epochs=6, patience=None, validate_every=1, max_steps=None)
    assert epochs_trained(fixed, refit=True, refit_scale=1.8, validation_scale=1.1) == pytest.approx((6 * 1.1 + 6 * 1.8,) * 2)
    assert epochs_trained(fixed, refit=False, refit_scale=1.8, validation_scale=1.1) == pytest.approx((6 * 1.1,) * 2)
    stopping = SimpleNamespace(epochs=6, patience=5, validate_every=1, max_steps=None)
    assert epochs_trained(stopping, refit=True, refit_scale=1.8, validation_scale=1.1) == pytest.approx((6 * 1.1 + 1.8, 6 * 1.1 + 6 * 1.8))
    budget = SimpleNamespace(epochs=6, patience=None, validate_every=1, max_steps=250)  # 2.5 epochs of steps either way
    assert epochs_trained(budget, refit=True, steps_per_epoch=100, refit_scale=1.8) == pytest.approx((5.0, 5.0))


def test_an_estimates_sample_epoch_trains_at_the_whole_datas_batch(monkeypatch):
    """3,000 windows train at the reference batch of 128; a 256-window sample left to choose would take 64 (four steps
    an epoch). The sample is 8 of the whole data's batches at that batch, and its second epoch's time per step scales
    to the whole data's 24 steps."""
    from types import SimpleNamespace

    import torch

    from gpufill.engine.config import FitConfig
    from gpufill.forecasting import run

    seen = {}

    def fake_fit(model, train, val, config):
        seen.update(windows=train[0].shape[0], validated=val[0].shape[0], batch=config.batch_size, epochs=config.epochs)
        epoch = SimpleNamespace(seconds=0.08, steps=train[0].shape[0] // config.batch_size, val_loss=1.0)
        return SimpleNamespace(history=[epoch, epoch], timings={"val_s": 0.02})

    monkeypatch.setattr(run, "fit", fake_fit)
    monkeypatch.setattr(run, "build_model", lambda trial, windows, loss=None: None)
    windows = [SimpleNamespace(x_train=torch.zeros(n, 4, 1), y_train=torch.zeros(n, 1), x_val=torch.zeros(n // 2, 4, 1), y_val=torch.zeros(n // 2, 1))
               for n in (1000, 2000)]
    cost = run.epoch_seconds(None, windows, FitConfig(), sample=256)
    assert seen == {"windows": 1024, "validated": 1024, "batch": 128, "epochs": 2} and (cost.timed, cost.batch) == (1024, 128)
    assert cost.train_s == pytest.approx(0.08 / 8 * 24)
    assert cost.val_s == pytest.approx(0.02 / 2 * 1500 / 1024)  # two validations of 1,024 windows, scaled to all 1,500


@pytest.mark.slow
def test_an_estimate_with_early_stopping_gives_the_geometric_middle_and_its_range(tmp_path, capsys):
    """patience 3 of 12 epochs, no refit: each trial 4 to 12 epochs; the estimate's epochs sqrt(48) = 6.93, its range
    the two ends, every figure the same steady epoch times them."""
    path = write_campaign(tmp_path, projects=2, epochs=12, models="mlp: {hidden_size: 8}")
    path.write_text(path.read_text().replace("early_stopping: null", "early_stopping: {patience: 3}"))
    result = estimate(Campaign.from_yaml(path)).to_dict()
    (shape,) = result["shapes"]
    low, high = shape["range_per_trial"]
    assert high / low == pytest.approx(3, rel=0.01) and shape["seconds_per_trial"] == pytest.approx((low * high) ** 0.5, abs=2e-4)  # kept to 4 decimals
    assert "x 6.93 epochs: the geometric middle of the 4 to 12 that early stopping allows" in shape["how"]
    slots = result["lanes"]["cpu"]["slots"]
    assert result["range_seconds"] == [pytest.approx(2 * low / slots + result["startup_seconds"], abs=0.11),
                                       pytest.approx(2 * high / slots + result["startup_seconds"], abs=0.11)]
    code, out, _ = run_cli(capsys, "estimate", path)
    assert code == 0 and "early stopping decides between" in " ".join(out.split())


def test_global_mode_trains_one_model_over_all_projects(tmp_path):
    path = write_campaign(tmp_path, projects=3, epochs=3, models="mlp: {hidden_size: 16}\n  linear: {}")
    path.write_text(path.read_text().replace("task: {lookback: [12], horizon: 1}", "task: {lookback: [12], horizon: 1, mode: global}"))
    campaign = Campaign.from_yaml(path, tmp_path / "work")
    outcome = campaign.run(executor="inline")
    assert outcome.done == 2  # one trial per family, not per project
    results = read_results(tmp_path / "work")
    assert list(results["project"]) == ["*", "*"] and (results["status"] == "done").all()
    with sqlite3.connect(tmp_path / "work" / "gpufill.db") as con:
        metrics = {family: json.loads(m) for family, m in con.execute("SELECT family, metrics FROM trials")}
    for family, m in metrics.items():
        per_project = m["per_project"]
        assert sorted(per_project) == ["p000", "p001", "p002"]
        mean_mae = sum(p["test"]["mae"] for p in per_project.values()) / 3
        assert m["test"]["mae"] == pytest.approx(mean_mae)
        assert m["test"]["mae"] < m["naive"]["mae"], family


@pytest.mark.parametrize("family", ["linear", "rf", "xgb", "lgbm"])
@pytest.mark.slow
def test_train_runs_classical_families(capsys, family):
    code, out, _ = run_cli(capsys, "train", "--model", family, "--param", "n_estimators=30" if family != "linear" else "alpha=0.0", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["family"] == family and result["history"] == []
    assert result["plan"]["device"]["value"] == "cpu" and result["plan"]["threads"]["value"] >= 1
    assert result["metrics"]["test"]["mae"] < result["metrics"]["naive"]["mae"]


def test_each_run_writes_a_log_file_and_verbose_logs_every_trial(tmp_path, capsys):
    path = write_campaign(tmp_path, projects=2, epochs=2, models="linear: {}\n  tests.campaign_models:always_raises: {}", retries=0)
    code, _, _ = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--verbose", "--executor", "inline")
    assert code == 1
    log = (tmp_path / "work" / "logs" / "run-1.log").read_text()
    assert "lane cpu: 2 slots x 1 threads" in log
    assert log.count(" DEBUG gpufill.scheduler: done ") == 2  # the two linear trials
    assert log.count("failed, attempt 1/1: ValueError: this model always fails") == 2
    assert "run 1 ended: 2 done, 2 failed" in log
    code, _, _ = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    second = (tmp_path / "work" / "logs" / "run-2.log").read_text()
    assert " DEBUG " not in second  # without --verbose


def test_a_run_samples_the_host_into_the_store(tmp_path):
    path = write_campaign(tmp_path, projects=2, epochs=30, models="mlp: {hidden_size: 32}")
    Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    from gpufill.campaign.store.store import Store

    store = Store.open(tmp_path / "work")
    try:
        samples = store.samples()
    finally:
        store.close()
    host = samples[samples["source"] == "host"]
    assert len(host) >= 1  # at least the sample taken as the sampler starts
    assert host["cpu_percent"].between(0, 100).all() and (host["ram_total"] > 0).all()
    assert (samples["source"] != "gpu0").all()  # no GPU here: host rows only, no crash


READERS = """name: readers
data: {source: synthetic, projects: 2, length: 200, seed: 1}
task: {lookback: [6], horizon: 3, split: {val: 20, test: 20}}
models:
  linear: {}
  snaive: {}
ensemble: {families: [linear, snaive]}
seeds: [0, 1]
resources: {retries: 0}
"""


@pytest.mark.parametrize("command", [["status"], ["results"], ["results", "--summary"]])
def test_status_and_results_read_the_store_without_torch_pandas_or_numpy(tmp_path, command):
    """What keeps them fast on a 36,000-trial store (bench/campaign_scale.py): torch alone takes seconds to import.
    The summary shows the declared ensemble's kept rows: reading them needs neither numpy nor the metrics."""
    import subprocess
    import sys

    path = tmp_path / "readers.yaml"
    path.write_text(READERS)
    assert Campaign.from_yaml(path, tmp_path / "work").run(executor="inline").done == 2 * (2 + 1)  # snaive is deterministic: one seed
    code = ("import sys; from gpufill.cli import main\nsys.argv = ['gpufill', *sys.argv[1:]]\ntry:\n    main()\nexcept SystemExit as end:\n    assert not end.code\n"
            "print('loaded:', sorted(m for m in ('torch', 'pandas', 'numpy', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *command, "--workdir", str(tmp_path / "work")], capture_output=True, text=True, check=True).stdout
    assert out.rstrip().endswith("loaded: []")
    if command[-1] == "--summary":
        assert "ensemble (median" in out  # the declared ensemble's rows were read
