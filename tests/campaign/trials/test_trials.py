"""Trial expansion: counts, order, stable ids (across edits and processes), shapes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from gpufill.campaign import Trial, expand, load_campaign, trial_id
from gpufill.errors import InputError
from gpufill.forecasting.models import registry
from tests.helpers import registry_restored

BASE = """\
name: study
data: {source: synthetic, projects: 3, length: 400}
task: {lookback: [30, 60], horizon: 1}
models:
  lstm: {hidden_size: [16, 32], num_layers: [1, 2]}
  fake_classical: {}
train: {epochs: 10}
seeds: [0, 1]
resources: {retries: 2}
"""
PROJECTS = ["p000", "p001", "p002"]


class FakeClassical:
    def __init__(self, n_features: int, lookback: int, horizon: int, *, n_estimators: int = 10):
        self.n_estimators = n_estimators


@pytest.fixture(autouse=True)
def fake_classical():
    with registry_restored():
        registry.register("fake_classical", kind="classical")(FakeClassical)
        yield


@pytest.fixture
def spec_of(tmp_path):
    """Load campaign text (BASE with replacements applied) from a fresh file."""
    count = iter(range(1000))

    def load(text: str = BASE, **replace: str):
        for old, new in replace.items():
            old = old.replace("__", " ")
            assert old in text, old
            text = text.replace(old, new)
        path = tmp_path / f"campaign{next(count)}.yaml"
        path.write_text(textwrap.dedent(text))
        return load_campaign(path)

    return load


def ids(trials: list[Trial]) -> list[str]:
    return [t.trial_id for t in trials]


# --- counts and order --------------------------------------------------------------------------


def test_a_family_that_fits_the_series_runs_once_per_project_not_per_lookback(spec_of):
    spec = spec_of(fake_classical="snaive: {}\n  ets: {}\n  fake_classical")
    trials = expand(spec, PROJECTS)
    by_family = {family: [t for t in trials if t.family == family] for family in ("lstm", "snaive", "ets", "fake_classical")}
    # A window model trains at each lookback; snaive and ets read no window: the shortest lookback only.
    assert {t.lookback for t in by_family["lstm"]} == {t.lookback for t in by_family["fake_classical"]} == {30, 60}
    assert {t.lookback for t in by_family["snaive"]} == {t.lookback for t in by_family["ets"]} == {30}
    # ... and they are deterministic: one seed (the smallest) per project, whatever the seeds.
    assert len(by_family["snaive"]) == len(by_family["ets"]) == 3 and {t.seed for t in by_family["ets"]} == {min(spec.seeds)}
    assert len(trials) == 3 * ((2 * 2 * 2 + 2) * 2 + 1 + 1)
    # The trial at the shortest lookback keeps the id it had when every lookback ran one.
    at_30 = by_family["snaive"][0]
    assert at_30.trial_id == trial_id(project=at_30.project, family="snaive", params={}, train={}, seed=at_30.seed, lookback=30, spec=spec)


def test_counts_local_mode(spec_of):
    trials = expand(spec_of(), PROJECTS)
    # 3 projects x (lstm 2x2 grid x 2 lookbacks + fake_classical 1 x 2 lookbacks) x 2 seeds
    assert len(trials) == 3 * (2 * 2 * 2 + 1 * 2) * 2 == 60
    assert sum(t.kind == "neural" for t in trials) == 3 * 8 * 2 == 48
    assert {t.project for t in trials} == set(PROJECTS)


def test_counts_global_mode(spec_of):
    trials = expand(spec_of(**{"horizon: 1": "horizon: 1, mode: global"}), PROJECTS)
    # one trial per (family, grid point, lookback, seed) over all projects
    assert len(trials) == (2 * 2 * 2 + 1 * 2) * 2 == 20
    assert {t.project for t in trials} == {"*"}
    local = expand(spec_of(), PROJECTS)
    assert not set(ids(trials)) & set(ids(local))


def test_global_ids_follow_the_project_set(spec_of):
    spec = spec_of(**{"horizon: 1": "horizon: 1, mode: global"})
    trials = expand(spec, PROJECTS)
    assert ids(expand(spec, list(reversed(PROJECTS)))) == ids(trials)
    # every global trial trains on all projects: one more project changes every id
    assert not set(ids(expand(spec, [*PROJECTS, "p003"]))) & set(ids(trials))
    t = trials[3]
    fields = {"project": t.project, "family": t.family, "params": t.params, "train": t.train, "seed": t.seed, "lookback": t.lookback, "spec": spec}
    assert trial_id(**fields, projects=PROJECTS) == t.trial_id
    with pytest.raises(InputError, match="global-mode trial id depends on all"):
        trial_id(**fields)


def test_order_is_project_family_lookback_grid_seed(spec_of):
    trials = expand(spec_of(), ["p002", "p000", "p001"])  # given out of order: sorted
    keys = [(t.project, t.family, t.lookback, t.params.get("hidden_size"), t.params.get("num_layers"), t.seed) for t in trials]
    assert keys[:10] == [
        ("p000", "lstm", 30, 16, 1, 0),
        ("p000", "lstm", 30, 16, 1, 1),
        ("p000", "lstm", 30, 16, 2, 0),  # the last grid key varies fastest
        ("p000", "lstm", 30, 16, 2, 1),
        ("p000", "lstm", 30, 32, 1, 0),
        ("p000", "lstm", 30, 32, 1, 1),
        ("p000", "lstm", 30, 32, 2, 0),
        ("p000", "lstm", 30, 32, 2, 1),
        ("p000", "lstm", 60, 16, 1, 0),
        ("p000", "lstm", 60, 16, 1, 1),
    ]
    assert keys[16:20] == [("p000", "fake_classical", 30, None, None, 0), ("p000", "fake_classical", 30, None, None, 1),
                           ("p000", "fake_classical", 60, None, None, 0), ("p000", "fake_classical", 60, None, None, 1)]
    assert keys[20] == ("p001", "lstm", 30, 16, 1, 0)
    assert trials == expand(spec_of(), PROJECTS)


def test_family_order_follows_the_file(spec_of):
    text = BASE.replace("  lstm: {hidden_size: [16, 32], num_layers: [1, 2]}\n  fake_classical: {}\n",
                        "  fake_classical: {}\n  gru: {hidden_size: 8}\n  lstm: {hidden_size: 8}\n")
    families = list(dict.fromkeys(t.family for t in expand(spec_of(text), ["p000"])))
    assert families == ["fake_classical", "gru", "lstm"]


def test_training_keys_split_from_model_params(spec_of):
    spec = spec_of(**{"num_layers: [1, 2]}": "lr: [1.0e-3, 3.0e-4], dropout: 0.1, batch_size: 64}"})
    trials = [t for t in expand(spec, ["p000"]) if t.family == "lstm"]
    assert len(trials) == 2 * 2 * 2 * 2  # hidden x lr x lookback x seed
    first = trials[0]
    assert first.params == {"dropout": 0.1, "hidden_size": 16}
    assert list(first.params) == sorted(first.params)
    assert first.train == {"batch_size": 64, "lr": 1e-3}
    assert {t.train["lr"] for t in trials} == {1e-3, 3e-4}
    config = spec.base_config(first.train, first.seed)
    assert (config.lr, config.batch_size, config.epochs, config.seed) == (1e-3, 64, 10, 0)


# --- ids -----------------------------------------------------------------------------------------


def test_ids_are_16_hex_unique_and_repeatable(spec_of):
    trials = expand(spec_of(), PROJECTS)
    assert all(re.fullmatch(r"[0-9a-f]{16}", t) for t in ids(trials))
    assert len(set(ids(trials))) == len(trials)
    assert ids(expand(spec_of(), PROJECTS)) == ids(trials)  # same file, another load


def test_trial_id_function_matches_expand(spec_of):
    spec = spec_of(**{"num_layers: [1, 2]}": "lr: [0.01]}"})
    for t in expand(spec, PROJECTS)[::7]:
        assert trial_id(project=t.project, family=t.family, params=t.params, train=t.train, seed=t.seed, lookback=t.lookback, spec=spec) == t.trial_id


@pytest.mark.slow
def test_ids_are_the_same_in_another_process(spec_of, tmp_path):
    spec = spec_of(BASE.replace("  fake_classical: {}\n", "  mlp: {hidden_size: 8, lr: [0.01, 0.001]}\n"))
    code = (
        "import json, sys\n"
        "from gpufill.campaign import expand, load_campaign\n"
        "print(json.dumps([t.trial_id for t in expand(load_campaign(sys.argv[1]), ['p000', 'p001', 'p002'])]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different str hash than this process's
    out = subprocess.run([sys.executable, "-c", code, str(spec.path)], capture_output=True, text=True, env=env, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ids(expand(spec, PROJECTS))


@pytest.mark.parametrize(
    ("edit", "added"),
    [
        ({"seeds: [0, 1]": "seeds: [0, 1, 2]"}, 3 * 10),
        ({"lookback: [30, 60]": "lookback: [30, 60, 90]"}, 3 * 5 * 2),
        ({"hidden_size: [16, 32]": "hidden_size: [16, 32, 64]"}, 3 * 2 * 2 * 2),
        ({"fake_classical: {}": "fake_classical: {}\n  gru: {hidden_size: 8}"}, 3 * 2 * 2),
    ],
    ids=["seed", "lookback", "grid_value", "family"],
)
def test_growing_the_campaign_keeps_every_old_id(spec_of, edit, added):
    old = ids(expand(spec_of(), PROJECTS))
    new = ids(expand(spec_of(**edit), PROJECTS))
    assert set(old) <= set(new)
    assert len(new) == len(old) + added


def test_adding_a_project_keeps_every_old_id(spec_of):
    old = ids(expand(spec_of(), PROJECTS))
    grown = spec_of(**{"projects: 3": "projects: 4"})  # data.projects is not part of an id
    new = ids(expand(grown, [*PROJECTS, "p003"]))
    assert set(old) <= set(new) and len(new) == len(old) + 20


@pytest.mark.parametrize("edit", [{"epochs: 10": "epochs: 11"}, {"epochs: 10": "epochs: 10, optimizer: sgd"}], ids=["epochs", "optimizer"])
def test_train_settings_change_neural_ids_only(spec_of, edit):
    before = expand(spec_of(), PROJECTS)
    after = expand(spec_of(**edit), PROJECTS)
    for a, b in zip(before, after, strict=True):
        assert (a.trial_id != b.trial_id) == (a.kind == "neural")  # classical models have no epochs


def test_an_optimizer_grid_splits_shapes_a_pack_shares_one_optimizer(spec_of):
    spec = spec_of(**{"num_layers: [1, 2]}": "optimizer: [adam, sgd]}"})
    lstm = [t for t in expand(spec, ["p000"]) if t.family == "lstm"]
    assert {t.train["optimizer"] for t in lstm} == {"adam", "sgd"}
    assert "lstm[lookback=30 batch_size=auto epochs=10 optimizer=sgd | hidden_size=16]" in {t.shape for t in lstm}
    assert len({t.shape for t in lstm}) == 2 * 2 * 2  # hidden x optimizer x lookback
    assert spec.base_config(lstm[0].train, 0).optimizer == "adam"


@pytest.mark.parametrize(
    "edit",
    [
        {"resources: {retries: 2}": "resources: {retries: 0, gpu_slots: 3, cpu_slots: 1, memory_margin: 0.5, threads_per_trial: 2}"},
        {"horizon: 1": "horizon: 1, metric: smape"},  # the metric only ranks results
        {"name: study": "name: renamed"},
        {"lookback: [30, 60]": "lookback: [60, 30]"},
        {"train: {epochs: 10}": "train: {epochs: 10, cuda_graph: false, batch_search: true}"},  # how steps are launched and split
        {"train: {epochs: 10}": "train: {epochs: 10, optimizer: adamw}"},  # the optimizer every file had before the setting
    ],
    ids=["resources", "metric", "name", "lookback_order", "step_mechanics", "optimizer_default"],
)
def test_edits_that_change_no_result_change_no_id(spec_of, edit):
    assert set(ids(expand(spec_of(**edit), PROJECTS))) == set(ids(expand(spec_of(), PROJECTS)))


@pytest.mark.parametrize(
    "edit",
    [
        {"length: 400": "length: 500"},
        {"horizon: 1": "horizon: 2"},
        {"horizon: 1": "horizon: 1, split: {val: 0.1, test: 0.25}"},
        {"horizon: 1": "horizon: 1, stride: 2"},
    ],
    ids=["data_length", "horizon", "split", "stride"],
)
def test_edits_that_change_results_change_every_id(spec_of, edit):
    assert not set(ids(expand(spec_of(**edit), PROJECTS))) & set(ids(expand(spec_of(), PROJECTS)))


# --- shapes --------------------------------------------------------------------------------------


def test_shapes_group_what_can_be_fused(spec_of):
    spec = spec_of(**{"num_layers: [1, 2]}": "lr: [0.01, 0.001]}"})
    trials = expand(spec, PROJECTS)
    lstm = [t for t in trials if t.family == "lstm"]
    by_shape: dict[str, list[Trial]] = {}
    for t in lstm:
        by_shape.setdefault(t.shape, []).append(t)
    # hidden_size x lookback; seeds, projects and lr share a pack
    assert len(by_shape) == 2 * 2
    for group in by_shape.values():
        assert len({(t.params["hidden_size"], t.lookback) for t in group}) == 1
        assert {t.project for t in group} == set(PROJECTS) and {t.seed for t in group} == {0, 1}
        assert {t.train["lr"] for t in group} == {0.01, 0.001}
    a, b = lstm[0], next(t for t in lstm if t.params["hidden_size"] == 32 and t.lookback == lstm[0].lookback)
    assert a.shape != b.shape
    assert a.shape == "lstm[lookback=30 batch_size=auto epochs=10 | hidden_size=16]"
    classical = {t.shape for t in trials if t.kind == "classical"}
    assert classical == {"fake_classical[lookback=30]", "fake_classical[lookback=60]"}


def test_batch_and_epoch_overrides_split_shapes(spec_of):
    spec = spec_of(**{"num_layers: [1, 2]}": "batch_size: [32, 64], epochs: 5}"})
    shapes = {t.shape for t in expand(spec, ["p000"]) if t.family == "lstm"}
    assert len(shapes) == 2 * 2 * 2  # hidden x batch x lookback
    assert "lstm[lookback=60 batch_size=64 epochs=5 | hidden_size=32]" in shapes


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("projects", "problem"),
    [([], "no projects"), (["p000", "p000"], "given twice"), (["*"], "reserved"), ("p000", "not one string")],
)
def test_bad_project_lists(spec_of, projects, problem):
    with pytest.raises(InputError, match=problem) as info:
        expand(spec_of(), projects)
    assert info.value.fix
