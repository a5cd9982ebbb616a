"""The campaign file: valid files load to the right values; every bad one fails at file:line with field and fix."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from gpufill.engine.config import FitConfig
from gpufill.forecasting.training import FORECAST_EPOCHS, FORECAST_PATIENCE
import torch

from gpufill.campaign import expand, load_campaign
from gpufill.campaign.spec.spec import TRAIN_KEYS, CampaignSpec, DataSpec, TrainSpec
from gpufill.forecasting.data import Split
from gpufill.errors import InputError
from gpufill.forecasting.models import registry
from gpufill.forecasting.run import trial_setup
from tests.helpers import TESTS, registry_restored

EXAMPLES = TESTS.parent / "examples"

FULL = """\
name: ablation
data: {source: synthetic, projects: 3, length: 400, seed: 0, target: target, project_column: project, time_column: null, fill: none}
task: {lookback: [30, 60], horizon: 1, split: {val: 0.1, test: 0.2}, metric: mae, mode: local, stride: 1}
models:
  lstm:        {hidden_size: [16, 32], num_layers: [1, 2], lr: [1.0e-3, 3.0e-4]}
  fake_classical: {n_estimators: [20]}
train: {epochs: 50, batch_size: auto, precision: auto, compile: auto, lr: 1.0e-3, weight_decay: 0.0, early_stopping: {patience: 5, min_delta: 0.0}, validate_every: 1}
seeds: [0, 1, 2]
resources: {gpu_slots: auto, cpu_slots: auto, retries: 2, memory_margin: 0.85}
"""


class FakeClassical:
    """A CPU-lane family with one parameter, checked like a real one."""

    def __init__(self, n_features: int, lookback: int, horizon: int, *, n_estimators: int = 10, epochs: int = 1):
        if n_estimators < 1:
            raise InputError(f"n_estimators must be >= 1, got {n_estimators}", fix="set n_estimators >= 1", field="fake_classical.n_estimators")
        self.n_estimators = n_estimators


class NoEpochs:
    def __init__(self, n_features: int, lookback: int, horizon: int, *, alpha: float = 1.0):
        self.alpha = alpha


def exploding(n_features: int, lookback: int, horizon: int, *, width: int = 4):
    if width > 100:
        raise RuntimeError("out of ideas")
    return torch.nn.Linear(lookback, horizon)


@pytest.fixture(autouse=True)
def fake_families():
    """fake_classical / plain_classical / exploding registered for each test, then the registry restored."""
    with registry_restored():
        registry.register("fake_classical", kind="classical")(FakeClassical)
        registry.register("plain_classical", kind="classical")(NoEpochs)
        registry.register("exploding")(exploding)
        yield


def write(tmp_path: Path, text: str, name: str = "campaign.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(tmp_path: Path, text: str) -> InputError:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_campaign(path)
    return info.value


# --- valid files ---------------------------------------------------------------------------------


def test_full_file_loads_every_value(tmp_path):
    spec = load_campaign(write(tmp_path, FULL))
    assert spec.name == "ablation"
    assert spec.path == tmp_path / "campaign.yaml" and spec.base_dir == tmp_path
    assert (spec.data.source, spec.data.projects, spec.data.length, spec.data.fill) == ("synthetic", 3, 400, "none")
    assert spec.task.lookback == [30, 60]
    assert spec.task.split.to_split() == Split(val=0.1, test=0.2)
    assert spec.models == {
        "lstm": {"hidden_size": [16, 32], "num_layers": [1, 2], "lr": [1e-3, 3e-4]},
        "fake_classical": {"n_estimators": [20]},
    }
    assert spec.train.early_stopping.patience == 5 and spec.train.epochs == 50
    assert spec.seeds == [0, 1, 2]
    assert (spec.resources.retries, spec.resources.memory_margin, spec.resources.threads_per_trial) == (2, 0.85, "auto")


def test_defaults_and_shorthands(tmp_path):
    spec = load_campaign(write(tmp_path, """\
        name: tiny
        task: {lookback: 12}
        models:
          lstm: {hidden_size: 8, lr: 1e-3, dropout: [0.0, 0.1]}
          fake_classical:
        seeds: 4
        """))
    assert spec.task.lookback == [12]  # a single lookback is a one-item list
    assert spec.seeds == [4]
    # scalars become one-item axes; `fake_classical:` (null) is the family with its defaults;
    # YAML reads 1e-3 (no dot) as a string: the training value is coerced to a float.
    assert spec.models == {"lstm": {"hidden_size": [8], "lr": [0.001], "dropout": [0.0, 0.1]}, "fake_classical": {}}
    assert (spec.task.horizon, spec.task.metric, spec.task.mode, spec.task.stride) == (1, "mae", "local", 1)
    # The campaign's training defaults are fit's (one home: engine/config.py).
    # A forecaster's length: an upper bound that early stopping (patience 5) ends, not fit's 10 epochs.
    assert (spec.train.epochs, spec.train.batch_size, spec.train.precision, spec.train.compile) == (FORECAST_EPOCHS, "auto", "auto", "auto")
    assert spec.train.early_stopping.patience == FORECAST_PATIENCE == 5 and FORECAST_EPOCHS == 100 > FitConfig().epochs
    assert spec.train.fit_config({}, seed=0).lr == FitConfig().lr
    assert spec.data == DataSpec()
    assert (spec.resources.gpu_slots, spec.resources.cpu_slots) == ("auto", "auto")


def test_dump_round_trips_without_the_path(tmp_path):
    spec = load_campaign(write(tmp_path, FULL))
    payload = spec.model_dump(mode="json")
    assert "path" not in payload and "path" not in spec.model_dump_json()
    again = CampaignSpec.model_validate(payload)  # what a worker process does
    assert again.model_dump() == spec.model_dump()
    names = ["p000", "p001"]
    assert [t.trial_id for t in expand(again, names)] == [t.trial_id for t in expand(spec, names)]


def test_loading_leaves_the_global_rng_alone(tmp_path):
    path = write(tmp_path, FULL)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_campaign(path)  # builds every grid point, which initialises weights
    assert torch.equal(torch.rand(3), expected)


def test_where_names_file_and_line(tmp_path):
    spec = load_campaign(write(tmp_path, FULL))
    assert spec.where("models", "lstm", "hidden_size") == f"{tmp_path / 'campaign.yaml'}:5"
    assert spec.where("data", "projects") == f"{tmp_path / 'campaign.yaml'}:2"
    assert spec.where("resources", "nope") == f"{tmp_path / 'campaign.yaml'}:9"  # deepest key present


def test_user_factory_family(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    spec = load_campaign(write(tmp_path, """\
        name: custom
        models:
          "custom_model_fixture:make_tiny": {scale: [1.0, 2.0], lr: [0.01]}
          "custom_model_fixture:MeanForecaster": {alpha: [0.1, 0.9]}
        """))
    trials = expand(spec, ["p000"])
    assert [(t.family, t.kind, t.params, t.train) for t in trials] == [
        ("custom_model_fixture:make_tiny", "neural", {"scale": 1.0}, {"lr": 0.01}),
        ("custom_model_fixture:make_tiny", "neural", {"scale": 2.0}, {"lr": 0.01}),
        ("custom_model_fixture:MeanForecaster", "classical", {"alpha": 0.1}, {}),
        ("custom_model_fixture:MeanForecaster", "classical", {"alpha": 0.9}, {}),
    ]


def test_classical_factory_may_declare_a_training_named_parameter(tmp_path):
    # fake_classical's own `epochs` parameter is a model parameter, not a training setting.
    spec = load_campaign(write(tmp_path, "name: x\nmodels:\n  fake_classical: {epochs: [3]}\n"))
    assert expand(spec, ["p000"])[0].params == {"epochs": 3}


# --- training settings -----------------------------------------------------------------------------


def test_fit_config_maps_train_settings_and_overrides(tmp_path):
    spec = load_campaign(write(tmp_path, FULL))
    config = spec.train.fit_config({"lr": 3e-4, "batch_size": 64}, seed=7)
    assert (config.epochs, config.lr, config.batch_size, config.weight_decay) == (50, 3e-4, 64, 0.0)
    assert (config.patience, config.min_delta, config.validate_every, config.seed) == (5, 0.0, 1, 7)
    assert (config.precision, config.compile) == ("auto", "auto")
    assert spec.train.fit_config({}, seed=0).lr == 1e-3
    assert config.batch_search == "auto"
    off = TrainSpec(early_stopping=None, precision="fp32", compile=False, batch_search=True).fit_config({}, seed=1)
    assert (off.patience, off.precision, off.compile, off.batch_search) == (None, "fp32", False, True)
    margin = CampaignSpec.model_validate({**spec.model_dump(), "resources": {"memory_margin": 0.5}})
    trial = expand(margin, ["p000"])[0]
    setup = trial_setup(trial, margin.recipe(trial.family, trial.train), margin.base_config(trial.train, trial.seed), threads=1,
                        memory_margin=margin.resources.memory_margin)
    assert setup.config.memory_margin == 0.5 and setup.config.loss == margin.recipe(trial.family, trial.train).loss


def test_fit_config_rejects_bad_overrides():
    with pytest.raises(InputError, match="'dropout' is not a training setting") as info:
        TrainSpec().fit_config({"dropout": 0.1}, seed=0)
    assert info.value.fix and info.value.field == "train"
    with pytest.raises(InputError, match="expected a value > 0, got -1") as info:
        TrainSpec().fit_config({"lr": -1}, seed=0)
    assert info.value.field == "train.lr"
    with pytest.raises(InputError, match="expected an integer or 'auto', got 'big'"):
        TrainSpec().fit_config({"batch_size": "big"}, seed=0)
    assert TRAIN_KEYS == {"lr", "weight_decay", "batch_size", "epochs", "max_steps", "loss", "schedule", "optimizer"}
    with pytest.raises(InputError, match="lbfgs") as info:
        TrainSpec().fit_config({"optimizer": "lbfgs"}, seed=0)
    assert info.value.field == "train.optimizer" and "adamw" in info.value.fix
    assert TrainSpec().fit_config({"optimizer": "sgd"}, seed=0).optimizer == "sgd"


# --- data selection --------------------------------------------------------------------------------


def test_synthetic_count_list_glob_and_default():
    assert list(DataSpec(projects=3, length=200).load(Path("."))) == ["p000", "p001", "p002"]
    assert list(DataSpec(projects=["p012", "p003"], length=200).load(Path("."))) == ["p003", "p012"]
    assert list(DataSpec(projects="p00[13]", length=200).load(Path("."))) == ["p001", "p003"]
    assert len(DataSpec(length=200).load(Path("."))) == 10
    loaded = DataSpec(projects=2, length=300, seed=5).load(Path("."))
    assert loaded["p001"].length == 300


@pytest.fixture
def csv_dir(tmp_path):
    """stores.csv next to the campaign file: four projects split by the project column."""
    rows = [{"project": name, "time": t, "target": float(t + i)} for i, name in enumerate(["store_a", "store_b", "shop_c", "store_d"]) for t in range(50)]
    (tmp_path / "data").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "data" / "stores.csv", index=False)
    return tmp_path


def test_file_source_resolves_against_the_campaign_folder(csv_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)  # not the campaign's folder
    spec = load_campaign(write(csv_dir, "name: x\ndata: {source: data/stores.csv, projects: 'store_*'}\nmodels: {lstm: {}}\ntask: {lookback: 5}\n"))
    projects = spec.load_projects()
    assert list(projects) == ["store_a", "store_b", "store_d"]
    assert projects["store_b"].target[:3].tolist() == [1.0, 2.0, 3.0]
    assert list(DataSpec(source="data/stores.csv", projects=2).load(csv_dir)) == ["shop_c", "store_a"]


@pytest.mark.parametrize(
    ("projects", "problem"),
    [
        (5, "asks for 5 projects but the source has 4"),
        ("shop_z*", "pattern 'shop_z*' matches no project"),
        (["store_a", "store_x"], "unknown project(s) 'store_x'"),
    ],
)
def test_selection_errors_name_data_projects(csv_dir, projects, problem):
    spec = load_campaign(write(csv_dir, f"name: x\ndata:\n  source: data/stores.csv\n  projects: {projects!r}\nmodels: {{lstm: {{}}}}\ntask: {{lookback: 5}}\n"))
    with pytest.raises(InputError) as info:
        spec.load_projects()
    err = info.value
    assert problem in err.problem
    assert err.field == "data.projects"
    assert err.where == f"{csv_dir / 'campaign.yaml'}:4"
    assert "data.projects" in err.fix or "projects" in err.fix


# --- errors: file, line, field, fix ------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(InputError) as info:
        load_campaign(tmp_path / "nope.yaml")
    assert info.value.where == str(tmp_path / "nope.yaml")
    assert "not found" in info.value.problem and "check the path" in info.value.fix


def test_directory_is_not_a_campaign(tmp_path):
    with pytest.raises(InputError, match="is a directory") as info:
        load_campaign(tmp_path)
    assert info.value.fix


GOOD = "name: x\nmodels:\n  lstm: {hidden_size: [8]}\n"  # lines 1-3; cases below add from line 4

CASES = [
    # id, text, line, field, problem contains, fix contains
    ("invalid_yaml", "name: x\nmodels: {lstm: [1\ntrain: {}\n", 3, None, "not valid YAML: while parsing a flow sequence expected ',' or ']', but got ':' (what it parses began at line 2)", "YAML syntax at line 3"),
    ("unclosed_at_end", "name: x\nmodels: [lstm\n", 2, None, "not valid YAML", "YAML syntax at line 2"),
    ("bad_indent", "name: x\n  oops: 1\nmodels: {}\n", 2, None, "not valid YAML", "line 2"),
    ("top_level_list", "- name\n- models\n", 1, None, "top level is a list", "name: my_campaign"),
    ("empty_file", "# only a comment\n", 1, None, "file is empty", "name, models"),
    ("missing_name", "# the study\nmodels:\n  lstm: {}\n", 2, "name", "missing required key 'name'", "add 'name:'"),
    ("missing_models", "name: x\nseeds: [0]\n", 1, "models", "missing required key 'models'", "add 'models:'"),
    ("typo_models", "name: x\nseeds: [0]\nmodel:\n  lstm: {}\n", 3, "model", "unknown key 'model'", "did you mean 'models'?"),
    ("unknown_nested", GOOD + "train:\n  epochs: 3\n  early_stopping:\n    patiense: 2\n", 7, "train.early_stopping.patiense", "unknown key 'patiense'", "did you mean 'patience'?"),
    ("unknown_data_key", GOOD + "data: {source: synthetic, projcts: 3}\n", 4, "data.projcts", "unknown key 'projcts'", "did you mean 'projects'?"),
    ("path_in_file", GOOD + "path: /tmp\n", 4, "path", "unknown key 'path'", "remove it"),
    ("wrong_type", GOOD + "train:\n  lr: 0.01\n  epochs: many\n", 6, "train.epochs", "expected an integer, got 'many'", "set train.epochs to an integer"),
    ("auto_or_int", GOOD + "train: {batch_size: big}\n", 4, "train.batch_size", "expected an integer or 'auto', got 'big'", "'auto'"),
    ("literal", GOOD + "train:\n  precision: fp8\n", 5, "train.precision", "one of 'auto', 'bf16', 'fp16' or 'fp32'", "set train.precision to"),
    ("epochs_range", GOOD + "train: {epochs: 0}\n", 4, "train.epochs", "expected a value >= 1, got 0", "train.epochs"),
    ("retries_range", GOOD + "resources:\n  gpu_slots: 2\n  retries: -1\n", 6, "resources.retries", "expected a value >= 0, got -1", "set resources.retries to a value >= 0"),
    ("margin_range", GOOD + "resources: {memory_margin: 1.5}\n", 4, "resources.memory_margin", "<= 1", "memory_margin"),
    ("bool_is_not_int", GOOD + "resources: {cpu_slots: true}\n", 4, "resources.cpu_slots", "got True", "cpu_slots"),
    ("lookback_zero", GOOD + "task:\n  lookback:\n    - 30\n    - 0\n", 7, "task.lookback", "expected a value >= 1, got 0", "task.lookback"),
    ("lookback_twice", GOOD + "task: {lookback: [30, 60, 30]}\n", 4, "task.lookback", "lookback 30 is listed twice", "once"),
    ("lookback_too_long", GOOD + "data: {length: 100}\ntask: {lookback: [90]}\n", 5, "task.lookback", "does not fit the 70 training steps", "data.length"),
    ("split_sum", GOOD + "task:\n  split: {val: 0.4, test: 0.6}\n", 5, "task.split.val", "leaves nothing to train on", "less than 1"),
    ("split_no_test", GOOD + "task:\n  split:\n    test: 0\n", 6, "task.split.test", "nothing to score", "test"),
    ("metric", GOOD + "task: {metric: mape}\n", 4, "task.metric", "'mae', 'rmse', 'smape' or 'mase'", "task.metric"),
    ("name_chars", "name: my study\nmodels: {lstm: {}}\n", 1, "name", "only letters, digits", "my_study"),
    ("seeds_twice", GOOD + "seeds:\n  - 0\n  - 1\n  - 0\n", 7, "seeds", "seed 0 is listed twice", "once"),
    ("seeds_empty", GOOD + "seeds: []\n", 4, "seeds", "no seeds", "seeds: [0]"),
    ("grid_not_mapping", "name: x\nmodels:\n  lstm: [64]\n", 3, "models.lstm", "expected a mapping, got [64]", "e.g. {hidden_size: [64, 128], num_layers: 2}"),
    ("no_families", "name: x\nmodels: {}\n", 2, "models", "no model families", "add at least one family"),
    ("unknown_family", GOOD + "  lsmt: {hidden_size: [8]}\n", 4, "models.lsmt", "unknown model family 'lsmt' (did you mean 'lstm'?); known: ", "package.module:factory"),
    ("bad_factory_path", GOOD + "  'no_such_pkg.models:make': {}\n", 4, "models.no_such_pkg.models:make", "cannot import module 'no_such_pkg.models'", "PYTHONPATH"),
    ("unknown_param", "name: x\nmodels:\n  lstm:\n    num_layers: [1]\n    hiden_size: [8]\n", 5, "models.lstm.hiden_size", "unknown parameter 'hiden_size' for model family 'lstm'; accepted: hidden_size", "did you mean 'hidden_size'?"),
    ("empty_grid", "name: x\nmodels:\n  lstm:\n    hidden_size: []\n", 4, "models.lstm.hidden_size", "empty grid", "hidden_size: [64]"),
    ("duplicate_grid_value", "name: x\nmodels:\n  lstm:\n    hidden_size: [8, 16, 8]\n", 4, "models.lstm.hidden_size", "value 8 appears twice", "once"),
    ("train_key_classical", "name: x\nmodels:\n  lstm: {}\n  plain_classical:\n    alpha: [1.0]\n    lr: [0.1]\n", 6, "models.plain_classical.lr", "'lr' is a training setting, but 'plain_classical' is a classical model", "remove lr"),
    ("bad_train_override", "name: x\nmodels:\n  lstm:\n    lr:\n      - 0.01\n      - -1\n", 6, "models.lstm.lr", "expected a value > 0, got -1", "models.lstm.lr"),
    ("build_divisibility", "name: x\nmodels:\n  transformer:\n    nhead: [4]\n    d_model: [32, 30]\n", 5, "models.transformer.d_model", "{'nhead': 4, 'd_model': 30}: d_model (30) must be divisible by nhead (4)", "multiple of nhead"),
    ("build_negative", "name: x\nmodels:\n  lstm: {hidden_size: [8, -4]}\n", 3, "models.lstm.hidden_size", "hidden_size must be a whole number >= 1, got -4", "hidden_size"),
    ("build_classical", "name: x\nmodels:\n  fake_classical:\n    n_estimators: 0\n", 4, "models.fake_classical.n_estimators", "n_estimators must be >= 1", "n_estimators >= 1"),
    ("build_any_exception", "name: x\nmodels:\n  exploding:\n    width: [8, 500]\n", 3, "models.exploding", "building exploding with {'width': 500} failed: RuntimeError: out of ideas", "exploding's grid"),
    ("duplicate_key", "name: x\nmodels:\n  lstm: {}\n  gru: {}\n  lstm: {hidden_size: 8}\n", 5, "models.lstm", "duplicate key 'lstm' (also at line 3)", "keep one"),
    ("early_stopping_false", GOOD + "train: {early_stopping: false}\n", 4, "train.early_stopping", "not a setting", "early_stopping: null"),
    ("length_not_synthetic", GOOD + "data: {source: data.csv, length: 100}\n", 4, "data.length", "only to source: synthetic", "remove length"),
    ("smape_needs_mean", "name: x\nmodels:\n  lstm:\n    scaling: [mean, standard]\n    loss: smape\n", 5, "models.lstm.loss", "loss smape with scaling standard for lstm", "scaling: mean"),
    ("mape_needs_mean", "name: x\nmodels:\n  nbeats:\n    scaling: [mean, standard]\n    loss: mape\n", 5, "models.nbeats.loss", "loss mape with scaling standard for nbeats", "scaling: mean"),
    ("smape_train_level", "name: x\nmodels:\n  lstm: {}\n  mlp: {}\ntrain: {loss: smape}\n", 5, "train.loss", "loss smape with scaling last for mlp", "scaling: mean"),
    ("quantile_interpretable_train", "name: x\nmodels:\n  nbeats: {stacks: [generic, interpretable], blocks: 2}\ntrain: {loss: quantile}\n", 4, "train.loss", "nbeats with {'stacks': 'interpretable', 'blocks': 2}: nbeats's forecast is a basis over the horizon's steps", "stacks: generic"),
    ("quantile_interpretable_grid", "name: x\nmodels:\n  nbeats:\n    stacks: interpretable\n    blocks: 2\n    loss: [mae, quantile]\n", 6, "models.nbeats.loss", "which a loss of 5 outputs per step would stretch", "one output per step"),
    ("scaling_unknown", "name: x\nmodels:\n  gru: {scaling: [max]}\n", 3, "models.gru.scaling", "'auto', 'project', 'last', 'mean', 'standard' or 'raw'", "models.gru.scaling"),
    ("scaling_series_model", "name: x\nmodels:\n  theta: {scaling: [last]}\n", 3, "models.theta.scaling", "'theta' fits each series itself", "remove scaling"),
    ("projects_not_names", GOOD + "data:\n  projects: [store_a, 7]\n", 5, "data.projects", "project names are strings, got 7", "'7'"),
]


@pytest.mark.parametrize(("text", "line", "field", "problem", "fix"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_file_fails_at_file_line_field_with_fix(tmp_path, text, line, field, problem, fix):
    err = load_error(tmp_path, text)
    assert err.where == f"{tmp_path / 'campaign.yaml'}:{line}", str(err)
    assert err.field == field, str(err)
    assert problem in err.problem, str(err)
    assert fix in err.fix, str(err)
    assert "\n" not in str(err) and str(err).startswith(f"{tmp_path / 'campaign.yaml'}:{line}")


def test_first_error_in_file_order_is_reported(tmp_path):
    err = load_error(tmp_path, GOOD + "resources: {retries: -1}\ntrain: {epochs: 0}\n")
    assert (err.field, err.where) == ("resources.retries", f"{tmp_path / 'campaign.yaml'}:4")


# --- the examples --------------------------------------------------------------------------------------


CLASSICAL_STAND_INS = {"linear": {}, "rf": {"n_estimators": 100}, "xgb": {"n_estimators": 100, "max_depth": 6}, "lgbm": {"n_estimators": 100, "num_leaves": 31}}


def _stand_in(defaults):
    def factory(n_features, lookback, horizon, **params):
        unknown = set(params) - set(defaults)
        assert not unknown, unknown
        return params

    return factory


@pytest.fixture
def classical_families(monkeypatch):
    """The real classical families if they are registered, else stand-ins with their parameters."""
    # Building rf imports scikit-learn, which sets KMP_INIT_AT_FORK: restore the environment after.
    monkeypatch.setenv("KMP_INIT_AT_FORK", os.environ.get("KMP_INIT_AT_FORK", "FALSE"))
    for name, defaults in CLASSICAL_STAND_INS.items():
        if name not in registry.families():
            registry.register(name, kind="classical")(_stand_in(defaults))


@pytest.mark.usefixtures("classical_families")
def test_examples_load_with_their_trial_counts():
    demo = load_campaign(EXAMPLES / "demo.yaml")
    assert list(demo.models) == ["lstm", "gru", "tcn", "transformer", "linear", "rf", "xgb", "lgbm", "snaive", "theta"]
    demo_trials = expand(demo, [f"p{i:03d}" for i in range(demo.data.projects)])
    # 8 projects x (8 families + 2 references) x 1 grid point x 1 lookback x 1 seed
    assert len(demo_trials) == 8 * 10 == 80
    assert sum(t.kind == "neural" for t in demo_trials) == 32

    ablation = load_campaign(EXAMPLES / "ablation.yaml")
    assert (ablation.data.projects, ablation.data.length, ablation.task.lookback, ablation.seeds) == (100, 2000, [30, 60, 90], [0, 1, 2])
    trials = expand(ablation, [f"p{i:03d}" for i in range(100)])
    # grid points: lstm 2x2x2 = 8, gru 2x2 = 4, tcn 2, transformer 2 (neural: 16); linear, rf, xgb, lgbm 1 each (4)
    # x 3 lookbacks x 3 seeds x 100 projects
    assert len(trials) == 100 * 3 * 3 * (8 + 4 + 2 + 2 + 4) == 18_000
    assert sum(t.kind == "neural" for t in trials) == 100 * 3 * 3 * 16 == 14_400
    assert len({t.trial_id for t in trials}) == 18_000
    # shapes: lstm 4 model shapes (lr is per model in a pack) + gru 4 + tcn 2 + transformer 2, + 4 classical, x 3 lookbacks
    assert len({t.shape for t in trials}) == (4 + 4 + 2 + 2 + 4) * 3


def test_batch_search_takes_auto_or_a_boolean(tmp_path):
    path = write(tmp_path, FULL.replace("train: {", "train: {batch_search: sometimes, ", 1))
    with pytest.raises(InputError) as info:
        load_campaign(path)
    assert "train.batch_search" in str(info.value) and f"{path.name}:" in str(info.value)


def test_batch_search_does_not_change_trial_ids(tmp_path):
    from gpufill.campaign.trials.trials import expand

    plain = load_campaign(write(tmp_path, FULL))
    searched = load_campaign(write(tmp_path, FULL.replace("train: {", "train: {batch_search: true, ", 1)))
    assert [t.trial_id for t in expand(plain, ["p0"])] == [t.trial_id for t in expand(searched, ["p0"])]


def test_the_spec_accepts_every_regression_loss_the_engine_names():
    from typing import get_args

    from gpufill.campaign.spec.ensemble_spec import LossName
    from gpufill.campaign.spec.train_spec import TrainSpec
    from gpufill.engine.config import REGRESSION_LOSSES

    assert get_args(LossName) == REGRESSION_LOSSES
    assert get_args(TrainSpec.model_fields["loss"].annotation) == ("auto", *REGRESSION_LOSSES)
