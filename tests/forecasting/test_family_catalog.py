"""The built-in families' catalogue: equal to what models/builtin.py lists, enough to read a campaign file without
importing torch, and replaced by the real family the first time one is built."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpufill.forecasting.models import registry
from gpufill.forecasting.models.catalog import BUILT_IN
from tests.helpers import TESTS, load_script

ROOT = TESTS.parent


def test_the_catalogue_is_what_the_built_in_list_names():
    assert BUILT_IN == registry.describe_built_in()
    assert sorted(BUILT_IN) == ["comb", "ets", "gru", "lgbm", "linear", "lstm", "mlp", "nbeats", "rf", "snaive", "tcn", "theta", "transformer", "xgb"]
    assert load_script(ROOT / "tools" / "family_catalog.py").text() == (ROOT / "src/gpufill/forecasting/models/catalog.py").read_text()


@pytest.mark.slow  # an interpreter that imports torch
def test_a_fresh_process_reads_every_family_from_the_catalogue_without_torch_and_builds_one_with_it():
    code = """
import json, sys
from gpufill.forecasting.models import registry
lstm, ets = registry.resolve("lstm"), registry.resolve("ets@weekly")
described = {"lstm": [lstm.kind, dict(lstm.defaults), lstm.fits_series], "ets": [ets.kind, ets.fits_series, ets.deterministic],
             "neural": registry.families("neural"), "checked": registry.check_params("mlp", {"hidden_size": 8})["num_layers"],
             "torch_before_build": "torch" in sys.modules}
model = registry.build("mlp", n_features=1, lookback=4, horizon=2, params={"hidden_size": 8})
described["built"] = [type(model).__name__, sum(p.numel() for p in model.parameters())]
described["real_after_build"] = registry.resolve("mlp").factory.__name__
print(json.dumps(described))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out["torch_before_build"] is False
    assert out["lstm"] == ["neural", {"hidden_size": 64, "num_layers": 1, "dropout": 0.0, "last_value_norm": True}, False]
    assert out["ets"] == ["classical", True, True]
    assert out["neural"] == ["gru", "lstm", "mlp", "nbeats", "tcn", "transformer"]
    assert out["checked"] == 2
    # 4 -> 8 -> 8 -> 2 with biases: (4*8+8) + (8*8+8) + (8*2+2) = 130
    assert out["built"] == ["MLPForecaster", 130]
    assert out["real_after_build"] == "MLPForecaster"
