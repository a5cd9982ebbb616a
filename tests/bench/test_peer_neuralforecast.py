"""bench/_peer_neuralforecast.py: the settings a peer run changes from neuralforecast's defaults are the ones it says."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# In a child: neuralforecast's import brings Lightning and Ray into the process (their variables, threads, warnings).
PROGRAM = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from _peer_neuralforecast import peer_forecasts

rng = np.random.default_rng(0)
histories = {f"s{i}": 100 + np.cumsum(rng.normal(size=40)) for i in range(3)}  # each long enough: no start padding
forecasts, seconds, changed = peer_forecasts(histories, 6, "nbeats", max_steps=2, seed=3, full_windows=True,
                                             settings={"num_lr_decays": 0})
_, _, default = peer_forecasts(histories, 6, "nbeats", max_steps=2)
print(json.dumps({"changed": changed, "default": default, "seconds": seconds,
                  "forecasts": {key: [float(v) for v in values] for key, values in forecasts.items()}}))
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("neuralforecast") is None, reason="needs neuralforecast (the dev extra)")
def test_full_windows_another_seed_and_a_set_argument_are_the_only_changes_and_each_series_gets_its_horizon():
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(BENCH)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["changed"] == {"max_steps": 2, "random_seed": 3, "training_data_availability_threshold": [0.0, 1.0], "num_lr_decays": 0}
    assert got["default"] == {"max_steps": 2}  # the documented defaults otherwise: seed 1, partial windows kept
    assert sorted(got["forecasts"]) == ["s0", "s1", "s2"] and all(len(f) == 6 for f in got["forecasts"].values())
    assert got["seconds"] > 0


def test_a_peer_seed_count_below_one_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, str(BENCH / "forecast_quality.py"), "--smoke", "--peers", "nbeats", "--peer-seeds", "0"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("error: --peer-seeds takes a count of at least 1, got 0")


@pytest.mark.parametrize(("given", "said"), [
    (["--peer-set", "num_lr_decays"], "error: --peer-set takes KEY=VALUE (e.g. num_lr_decays=0), got 'num_lr_decays'"),
    (["--peer-set", "num_lr_decays=0"], "error: --peer-set changes the peers' settings: give --peers too (e.g. --peers nbeats)"),
])
def test_a_malformed_peer_setting_is_one_line_and_exit_2(given, said):
    done = subprocess.run([sys.executable, str(BENCH / "forecast_quality.py"), "--smoke", *given], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(said)


@pytest.mark.skipif(importlib.util.find_spec("neuralforecast") is None, reason="needs neuralforecast (the dev extra)")
def test_a_peer_setting_no_peer_takes_is_refused_before_anything_trains():
    done = subprocess.run([sys.executable, str(BENCH / "forecast_quality.py"), "--smoke", "--peers", "nbeats,nhits", "--peer-set", "n_harmonics=3"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr  # NBEATS takes n_harmonics, NHITS does not
    assert done.stderr.strip().splitlines()[-1].endswith("error: --peer-set: n_harmonics is not an argument of neuralforecast's NBEATS, NHITS")
