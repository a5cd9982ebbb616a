"""Trial ids and data fingerprints are the same on every machine (issue 34).

numpy and OpenBLAS choose their kernels by CPU feature, so generated values differ in the last bit from one CPU
to the next (here: the synthetic AR(1) noise through np.convolve, i.e. BLAS ddot). The demo's ids were once
hashed from those bytes and differed on every machine kind. Two stand-ins for another machine: each kernel
setting this machine can be forced into (numpy's baseline SIMD, OpenBLAS's baseline kernel, torch's default
kernels), each in its own process; and, on any machine, kernels whose every result is one ulp off.
"""

from __future__ import annotations

import json
import shutil
import sqlite3

import numpy as np
import pytest

from gpufill.campaign import expand, load_campaign
from gpufill.campaign.run.runner import demo_campaign_path
from gpufill.forecasting.data import load_projects, synthetic, synthetic_projects
from tests.other_cpu import kernel_settings, run_python

DEMO_IDS = """\
import hashlib, json, sys
import numpy as np
from gpufill.campaign import expand, load_campaign
spec = load_campaign(sys.argv[1])
projects = spec.data.load(spec.path.parent)
prints = {name: project.fingerprint() for name, project in projects.items()}
values = {name: hashlib.sha256(np.column_stack([p.target, p.covariates]).tobytes()).hexdigest()[:16] for name, p in projects.items()}
print(json.dumps({"ids": sorted(t.trial_id for t in expand(spec, prints)), "fingerprints": prints, "values": values}))
"""


@pytest.mark.slow
def test_the_demo_ids_and_fingerprints_are_the_same_under_every_kernel_setting():
    settings = kernel_settings()
    seen = {name: json.loads(run_python("-c", DEMO_IDS, str(demo_campaign_path()), env=env).stdout.splitlines()[-1]) for name, env in settings.items()}
    found = seen["as found"]
    assert len(found["ids"]) == len(set(found["ids"])) == 80  # 8 projects x 10 families x 1 seed
    for name, outcome in seen.items():
        assert outcome["fingerprints"] == found["fingerprints"], f"{name}: the data's fingerprints depend on the CPU's kernels"
        assert outcome["ids"] == found["ids"], f"{name}: trial ids depend on the CPU's kernels"
    # Where the values themselves moved (this machine: OpenBLAS's kernels sum in another order), the ids held all the same.
    moved = sorted(name for name, outcome in seen.items() if outcome["values"] != found["values"])
    print(f"settings whose generated values differ in their last bits: {moved or 'none'}")


def one_ulp_off(function):
    """A kernel whose every result is one ulp above numpy's: what another CPU's SIMD or BLAS code may compute."""
    def kernel(*args, **kwargs):
        return np.nextafter(function(*args, **kwargs), np.inf)
    return kernel


def test_values_one_ulp_off_keep_every_fingerprint_and_id(monkeypatch):
    spec = load_campaign(demo_campaign_path())
    exact = spec.data.load(demo_campaign_path().parent)
    monkeypatch.setattr(synthetic.np, "convolve", one_ulp_off(np.convolve))
    monkeypatch.setattr(synthetic.np, "exp", one_ulp_off(np.exp))
    off = spec.data.load(demo_campaign_path().parent)
    monkeypatch.undo()
    assert all(not np.array_equal(exact[name].target, off[name].target) for name in exact)  # the values did move
    assert max(float(np.max(np.abs(off[n].target / exact[n].target - 1))) for n in exact) < 1e-12  # by rounding only
    assert {n: p.fingerprint() for n, p in off.items()} == {n: p.fingerprint() for n, p in exact.items()}
    ids = [t.trial_id for t in expand(spec, {n: p.fingerprint() for n, p in exact.items()})]
    assert [t.trial_id for t in expand(spec, {n: p.fingerprint() for n, p in off.items()})] == ids


def test_a_synthetic_fingerprint_names_the_generator_its_version_and_every_argument(monkeypatch):
    def print_of(**kwargs) -> str:
        arguments = {"n_projects": 2, "length": 300, "seed": 0, "n_covariates": 2, **kwargs}
        return synthetic_projects(**arguments)["p001"].fingerprint()

    base = print_of()
    assert synthetic_projects(n_projects=5, length=300)["p001"].fingerprint() == base  # the project count is not its data
    assert synthetic_projects(n_projects=2, length=300)["p000"].fingerprint() != base  # another project, another index
    changed = [print_of(length=301), print_of(seed=1), print_of(n_covariates=3)]
    monkeypatch.setattr(synthetic, "GENERATOR_VERSION", synthetic.GENERATOR_VERSION + 1)
    changed.append(print_of())
    assert len({base, *changed}) == 5


def test_a_file_project_is_fingerprinted_by_its_cells_as_read_and_the_fill_by_the_ids(tmp_path):
    frame = {"time": list(range(8)), "target": [1.0, 2.0, None, 4.0, 5.0, 6.5, 7.0, 8.25], "x": [0.5] * 8}
    import pandas as pd

    pd.DataFrame(frame).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame(frame).to_parquet(tmp_path / "b.parquet", index=False)  # the same cells, another format
    a = load_projects(str(tmp_path / "a.csv"), fill="ffill")["a"]
    b = load_projects(str(tmp_path / "b.parquet"), fill="ffill")["b"]
    interpolated = load_projects(str(tmp_path / "a.csv"), fill="interpolate")["a"]
    assert a.target[2] == 2.0 and interpolated.target[2] == 3.0  # the fills differ ...
    assert a.fingerprint() == b.fingerprint() == interpolated.fingerprint()  # ... the cells as read do not
    pd.DataFrame({**frame, "target": [*frame["target"][:-1], 8.5]}).to_csv(tmp_path / "a.csv", index=False)
    assert load_projects(str(tmp_path / "a.csv"), fill="ffill")["a"].fingerprint() != a.fingerprint()  # an edited cell
    # The fill reaches the trial ids through the campaign's data settings.
    (tmp_path / "a.csv").unlink()
    (tmp_path / "b.parquet").unlink()
    pd.DataFrame(frame).to_csv(tmp_path / "a.csv", index=False)
    ids = {}
    for fill in ("ffill", "interpolate"):
        path = tmp_path / f"{fill}.yaml"
        path.write_text(f"name: f\ndata: {{source: a.csv, fill: {fill}}}\ntask: {{lookback: [2], split: {{val: 0.25, test: 0.25}}}}\n"
                        "models: {linear: {}}\nseeds: [0]\n")
        spec = load_campaign(path)
        ids[fill] = [t.trial_id for t in expand(spec, {n: p.fingerprint() for n, p in spec.data.load(tmp_path).items()})]
    assert len(ids["ffill"]) == len(ids["interpolate"]) == 1 and ids["ffill"] != ids["interpolate"]


CAMPAIGN = """\
name: moved
data: {source: synthetic, projects: 2, length: 300}
task: {lookback: [14], split: {val: 0.1, test: 0.2}}
models:
  linear: {}
  snaive: {}
seeds: [0]
resources: {cpu_slots: 1}
"""


@pytest.mark.slow
def test_a_workdir_run_on_one_kernel_setting_is_finished_on_another(tmp_path):
    """`gpufill run`, the workdir copied to a machine whose kernels differ, `gpufill run` again: nothing re-runs."""
    (tmp_path / "moved.yaml").write_text(CAMPAIGN)
    first = run_python("-m", "gpufill", "run", str(tmp_path / "moved.yaml"), "--workdir", str(tmp_path / "here"), "--yes", env={}).stdout
    shutil.copytree(tmp_path / "here", tmp_path / "there")
    again = run_python("-m", "gpufill", "run", str(tmp_path / "moved.yaml"), "--workdir", str(tmp_path / "there"), "--yes",
                       env=kernel_settings()["all baseline"]).stdout
    with sqlite3.connect(tmp_path / "there" / "gpufill.db") as db:
        rows = db.execute("SELECT status, run_id, COUNT(*) FROM trials GROUP BY status, run_id").fetchall()
    assert rows == [("done", 1, 4)], rows  # 2 projects x 2 families, all from the first run
    assert "4 done, nothing to run" in again, (first, again)
