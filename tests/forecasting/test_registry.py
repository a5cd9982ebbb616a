"""Model registry: built-in names, parameters, user factories as 'package.module:factory'."""

from __future__ import annotations

import pytest
import torch

from gpufill.errors import InputError
from gpufill.forecasting.models import (
    GRUForecaster,
    LSTMForecaster,
    MLPForecaster,
    TCNForecaster,
    TransformerForecaster,
    build,
    check_params,
    families,
    register,
    resolve,
)
from gpufill.forecasting.models import registry
from tests.helpers import TESTS, registry_restored

NEURAL = {
    "gru": GRUForecaster,
    "lstm": LSTMForecaster,
    "mlp": MLPForecaster,
    "tcn": TCNForecaster,
    "transformer": TransformerForecaster,
}


@pytest.fixture(autouse=True)
def restore_registry():
    """Families registered by a test do not leak into the next one."""
    with registry_restored():
        yield


@pytest.fixture
def user_modules(monkeypatch, tmp_path):
    """tests/ (for custom_model_fixture) and a scratch folder for user modules on sys.path."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


# --- built-in families -----------------------------------------------------------------------


def test_neural_families_are_registered():
    neural = families("neural")
    assert set(NEURAL) <= set(neural)
    assert neural == sorted(neural)
    assert all(resolve(name).kind == "classical" for name in families("classical"))
    assert families() == sorted(families())
    for name, cls in NEURAL.items():
        family = resolve(name)
        assert (family.name, family.kind, family.factory) == (name, "neural", cls)


def test_defaults_are_read_from_the_signature():
    assert dict(resolve("lstm").defaults) == {
        "hidden_size": 64,
        "num_layers": 1,
        "dropout": 0.0,
        "last_value_norm": True,
    }
    assert dict(resolve("tcn").defaults) == {
        "channels": 64,
        "kernel_size": 3,
        "num_levels": None,
        "dropout": 0.0,
        "last_value_norm": True,
    }
    assert dict(resolve("transformer").defaults) == {
        "d_model": 64,
        "nhead": 4,
        "num_layers": 2,
        "dim_feedforward": None,
        "dropout": 0.0,
        "last_value_norm": True,
    }
    assert resolve("mlp").defaults["hidden_size"] == 128
    with pytest.raises(TypeError):
        resolve("lstm").defaults["hidden_size"] = 1  # read-only


def test_check_params_merges_defaults():
    params = {"hidden_size": 8, "dropout": 0.1}
    merged = check_params("gru", params)
    assert merged == {"hidden_size": 8, "num_layers": 1, "dropout": 0.1, "last_value_norm": True}
    assert params == {"hidden_size": 8, "dropout": 0.1}  # not mutated
    assert check_params("mlp", {}) == dict(resolve("mlp").defaults)


def test_build_applies_params_over_defaults():
    model = build("lstm", n_features=2, lookback=5, horizon=3, params={"hidden_size": 8})
    assert isinstance(model, LSTMForecaster)
    assert (model.rnn.input_size, model.rnn.hidden_size, model.head.out_features) == (2, 8, 3)
    default = build("transformer", n_features=1, lookback=4, horizon=1)
    assert (default.d_model, default.nhead, len(default.layers), default.dim_feedforward) == (64, 4, 2, 256)


def test_build_passes_on_bad_values_from_the_model():
    with pytest.raises(InputError, match=r"^tcn\.channels: channels must be a whole number >= 1, got -3; fix:"):
        build("tcn", n_features=1, lookback=8, horizon=1, params={"channels": -3})


# --- errors for names and parameters ---------------------------------------------------------


def test_unknown_family_lists_known_ones_and_the_path_form():
    with pytest.raises(InputError) as info:
        resolve("lstn")
    message = str(info.value)
    assert message.startswith("model: unknown model family 'lstn' (did you mean 'lstm'?); known: ")
    assert "ets, gru, lgbm, linear, lstm, mlp, nbeats, rf, snaive, tcn, theta, transformer, xgb" in message
    assert "'package.module:factory'" in message
    with pytest.raises(InputError, match=r"unknown model family 'LSTM' \(did you mean 'lstm'\?\)"):
        build("LSTM", n_features=1, lookback=4, horizon=1)
    with pytest.raises(InputError, match=r"unknown model family 'zzz'; known: "):
        check_params("zzz", {})


def test_a_variant_is_its_built_in_family_under_a_second_name():
    """`nbeats@mean` builds nbeats with nbeats' parameters and recipe; a bad base or tag is one line naming the fix."""
    from gpufill.forecasting.family_names import base_name
    from gpufill.forecasting.recipes import recipe

    assert resolve("nbeats@mean") is resolve("nbeats") and base_name("nbeats@mean") == "nbeats" and base_name("pkg.mod:make") == "pkg.mod:make"
    model = build("nbeats@mean", n_features=1, lookback=6, horizon=2, params={"width": 8, "blocks": 1})
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in build("nbeats", n_features=1, lookback=6, horizon=2, params={"width": 8, "blocks": 1}).parameters())
    assert recipe("nbeats@std").scaling == recipe("nbeats").scaling == "mean" and recipe("nbeats@std", scaling="standard").scaling == "standard"
    with pytest.raises(InputError, match=r"unknown model family 'nbeatz' in 'nbeatz@x' \(did you mean 'nbeats'\?\).*fix: a variant is a built-in family"):
        resolve("nbeatz@x")
    with pytest.raises(InputError, match=r"variant tag 'a b' in 'nbeats@a b' may hold only letters"):
        resolve("nbeats@a b")
    with pytest.raises(InputError, match=r"variant tag '' in 'nbeats@'"):
        check_params("nbeats@", {})


def test_family_name_must_be_a_string():
    with pytest.raises(InputError, match=r"^model: model family must be a string, got int; fix: give a family"):
        resolve(3)


def test_unknown_parameter_lists_accepted_ones():
    with pytest.raises(InputError) as info:
        check_params("lstm", {"hidden_size": 8, "lr": 1e-3})
    message = str(info.value)
    assert message.startswith("lstm.lr: unknown parameter(s) lr for model family 'lstm'; ")
    assert "accepted: hidden_size, num_layers, dropout, last_value_norm" in message
    assert "training settings such as lr belong to train:" in message
    with pytest.raises(InputError, match=r"unknown parameter\(s\) channel, kernel for model family 'tcn'"):
        build("tcn", n_features=1, lookback=8, horizon=1, params={"kernel": 3, "channel": 8})


def test_params_must_be_a_mapping():
    with pytest.raises(InputError, match=r"^mlp: parameters must be a mapping of name to value, got list"):
        check_params("mlp", [("hidden_size", 8)])


def test_families_rejects_an_unknown_kind():
    with pytest.raises(InputError, match=r"^kind: model kind must be one of neural, classical, got 'gpu'; fix:"):
        families("gpu")


# --- register --------------------------------------------------------------------------------


def test_register_adds_and_replaces():
    @register("tiny")
    def first(n_features, lookback, horizon, *, width=4):
        return ("first", width)

    assert first(1, 2, 3) == ("first", 4)  # the decorator returns the factory unchanged
    assert "tiny" in families("neural")
    assert build("tiny", n_features=1, lookback=2, horizon=1, params={"width": 9}) == ("first", 9)

    @register("tiny", kind="classical")
    def second(n_features, lookback, horizon, *, depth=2):
        return ("second", depth)

    assert "tiny" not in families("neural") and "tiny" in families("classical")
    assert build("tiny", n_features=1, lookback=2, horizon=1) == ("second", 2)
    assert dict(resolve("tiny").defaults) == {"depth": 2}


def test_a_registered_name_hides_the_built_in_family_of_that_name_until_it_is_removed():
    with registry_restored():
        @register("lstm")
        def mine(n_features, lookback, horizon, *, width=4):
            return ("mine", width)

        assert build("lstm", n_features=1, lookback=2, horizon=1) == ("mine", 4)
        assert len(registry.load_built_in()) == 14  # the built-ins loading later does not take the name back
        assert resolve("lstm").factory is mine and dict(resolve("lstm").defaults) == {"width": 4}
        assert type(build("gru", n_features=1, lookback=4, horizon=2)) is GRUForecaster
    assert resolve("lstm").factory is LSTMForecaster
    assert dict(resolve("lstm").defaults) == {"hidden_size": 64, "num_layers": 1, "dropout": 0.0, "last_value_norm": True}


@pytest.mark.parametrize("name", ["", "a:b", " lstm", 7])
def test_register_rejects_bad_names(name):
    with pytest.raises(InputError, match=r"^model: family name must be a non-empty string without ':'"):
        register(name)


def test_register_rejects_bad_kind_and_factories():
    with pytest.raises(InputError, match=r"^kind: model kind must be one of neural, classical, got 'cpu'"):
        register("x", kind="cpu")
    with pytest.raises(InputError, match=r"model factory 'x' is a int, not callable"):
        register("x")(5)
    with pytest.raises(InputError, match=r"model factory 'x' parameter 'width' needs a default.*; fix: give every"):
        register("x")(lambda n_features, lookback, horizon, width: None)
    with pytest.raises(InputError, match=r"model factory 'x' does not take lookback, horizon; fix: give the factory"):
        register("x")(lambda n_features, *, width=1: None)
    assert "x" not in families()


# --- user factories: package.module:factory --------------------------------------------------


def test_custom_factory_resolves_and_builds(user_modules):
    family = resolve("custom_model_fixture:make_tiny")
    assert (family.name, family.kind) == ("custom_model_fixture:make_tiny", "neural")
    assert dict(family.defaults) == {"scale": 1.0, "bias": True}
    assert check_params("custom_model_fixture:make_tiny", {"scale": 2.0}) == {"scale": 2.0, "bias": True}
    torch.manual_seed(0)
    model = build("custom_model_fixture:make_tiny", n_features=2, lookback=3, horizon=4, params={"scale": 0.0})
    assert model.linear.in_features == 6 and model.scale == 0.0
    assert torch.equal(model(torch.randn(5, 3, 2)), torch.zeros(5, 4))
    assert "custom_model_fixture:make_tiny" not in families()  # resolved on demand, not registered


def test_custom_factory_kind_and_nested_attributes(user_modules):
    classical = resolve("custom_model_fixture:MeanForecaster")
    assert (classical.kind, dict(classical.defaults)) == ("classical", {"alpha": 0.5})
    model = build("custom_model_fixture:MeanForecaster", n_features=1, lookback=4, horizon=2, params={"alpha": 0.1})
    assert (model.horizon, model.alpha) == (2, 0.1)
    built = build("custom_model_fixture:Factories.make", n_features=1, lookback=4, horizon=2)
    assert built == {"n_features": 1, "lookback": 4, "horizon": 2, "depth": 2}


def test_custom_factory_with_kwargs_accepts_any_param(user_modules):
    assert resolve("custom_model_fixture:make_any").defaults == {}
    built = build("custom_model_fixture:make_any", n_features=1, lookback=4, horizon=2, params={"whatever": 3})
    assert built == {"n_features": 1, "lookback": 4, "horizon": 2, "whatever": 3}


@pytest.mark.parametrize("path", [":make_tiny", "custom_model_fixture:", "a:b:c"])
def test_malformed_path(path):
    with pytest.raises(InputError) as info:
        resolve(path)
    assert str(info.value) == (
        f"model: model path {path!r} is not of the form 'package.module:factory'; "
        "fix: write it as e.g. 'mypkg.models:make_model'"
    )


def test_missing_module(user_modules):
    with pytest.raises(InputError) as info:
        resolve("no_such_pkg.models:make")
    message = str(info.value)
    assert message.startswith("model: cannot import module 'no_such_pkg.models' for model 'no_such_pkg.models:make': ")
    assert "ModuleNotFoundError: No module named 'no_such_pkg'" in message
    assert "fix: check the module path and that its package is installed or on PYTHONPATH" in message


def test_module_failing_on_import(user_modules):
    (user_modules / "broken_user_model.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(InputError, match=r"cannot import module 'broken_user_model' .*: RuntimeError: boom at import"):
        resolve("broken_user_model:make")


def test_missing_attribute(user_modules):
    with pytest.raises(InputError) as info:
        resolve("custom_model_fixture:make_tyni")
    message = str(info.value)
    assert "module 'custom_model_fixture' has no attribute 'make_tyni' (model 'custom_model_fixture:make_tyni')" in message
    assert "fix: check the factory name after ':'; the module defines " in message
    assert "make_tiny" in message
    with pytest.raises(InputError, match=r"has no attribute 'Factories.nope'"):
        resolve("custom_model_fixture:Factories.nope")


@pytest.mark.parametrize(
    ("factory", "text"),
    [
        ("NOT_CALLABLE", "model factory 'custom_model_fixture:NOT_CALLABLE' is a int, not callable"),
        ("needs_default", "parameter 'width' needs a default and a keyword"),
        ("no_lookback", "model factory 'custom_model_fixture:no_lookback' does not take lookback"),
        ("odd_kind", "model factory 'custom_model_fixture:odd_kind' has gpufill_kind='quantum'"),
    ],
)
def test_unusable_factories(user_modules, factory, text):
    with pytest.raises(InputError) as info:
        build(f"custom_model_fixture:{factory}", n_features=1, lookback=4, horizon=1)
    message = str(info.value)
    assert message.startswith("model: ") and text in message and "; fix: " in message


def test_a_factory_that_hands_back_a_module_it_returned_before_is_refused_in_one_line():
    """Issue 37 item 2: a `module:factory` caching its module per shape would start each later trial from the weights
    an earlier trial trained (metrics depending on what the worker ran before); sharing a trainable part does too."""
    shape = {"n_features": 1, "lookback": 4, "horizon": 2}
    first = registry.build("tests.campaign_models:cached_linear", **shape)
    with pytest.raises(InputError) as caught:
        registry.build("tests.campaign_models:cached_linear", **shape)
    assert caught.value.field == "tests.campaign_models:cached_linear" and "\n" not in str(caught.value)
    assert "returned before" in str(caught.value) and "build a new module inside the factory" in caught.value.fix
    registry.build("tests.campaign_models:shared_part", **shape)
    with pytest.raises(InputError, match="returned before"):
        registry.build("tests.campaign_models:shared_part", **shape)
    fresh = [registry.build("mlp", **shape) for _ in range(2)]
    assert fresh[0] is not fresh[1] and first is not None  # a factory that builds anew each call is never refused


def test_a_percentage_loss_takes_the_scalings_that_keep_the_origin_and_refuses_the_others():
    """sMAPE and MAPE on scaled values are those errors of the forecast only where the scaled zero is the series' zero:
    mean scaling and raw values; standard scaling (which moves the origin) is one line naming the fix."""
    from gpufill.forecasting.recipes import recipe

    assert [recipe("nbeats", scaling=s, loss="smape").scaling for s in ("mean", "raw")] == ["mean", "raw"]
    assert recipe("lstm", scaling="raw", loss="mape").loss == "mape"
    with pytest.raises(InputError, match=r"loss smape with scaling standard for nbeats.*fix: use scaling: mean \(or raw\) with loss: smape"):
        recipe("nbeats", scaling="standard", loss="smape")
