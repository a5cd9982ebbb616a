"""tools/demo_metrics.py (issue 27): the demo campaign's metrics equal the reference saved before the restructuring,
and the comparison itself reports what it should."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.shared_runs import DEMO_WORKDIR, demo_metrics_tool, finished_demo

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
REFERENCE = ROOT / "tools" / "demo_reference.json"
LAST_LINE = re.compile(r"^max relative difference: (\S+) \((\d+) trials\)$")


tool = demo_metrics_tool()


def trial(family: str = "lstm", kind: str = "neural", **metrics: float) -> dict:
    return {"family": family, "kind": kind, "project": "p000", "seed": 0, "status": "done", "metrics": metrics, "choices": {"pack_size": 2}}


@pytest.mark.slow
def test_the_demo_matches_the_reference_saved_before_the_restructuring(tmp_path_factory, capsys):
    """The session's finished demo (tests/shared_runs.py: `gpufill run` of the demo at the reference's pinned pack size, a
    fresh process, about 20-30 s on 2 cores), its every trial's metrics compared by the tool's own `compare`."""
    workdir = finished_demo(tmp_path_factory) / DEMO_WORKDIR
    code = tool.main(["compare", str(REFERENCE), "--finished", str(workdir)])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert code == 0, out + err
    match = LAST_LINE.match(lines[-1])
    assert match is not None, lines[-1]
    reference = json.loads(REFERENCE.read_text())["trials"]
    if any("the reference's numerics are this machine's" in line for line in lines):  # the same kernels: bit for bit
        assert float(match.group(1)) == 0.0
    else:  # another CPU or library: within what rounding moves (tools/demo_metrics.py ACROSS_MACHINES)
        assert any(line.startswith(f"tolerance: {tool.ACROSS_MACHINES} (numerics differ") for line in lines), lines
    assert int(match.group(2)) == len(reference) == 80  # 8 projects x 10 families x 1 seed
    assert "missing now (in the reference only): none" in lines
    assert "missing in the reference (new now): none" in lines


def test_the_reference_holds_every_demo_trial_with_its_metrics():
    saved = json.loads(REFERENCE.read_text())
    assert saved["pack_size"] == tool.DEFAULT_PACK_SIZE
    assert set(saved["numerics"]) == set(tool.numerics()) and saved["numerics"]["settings"] == {}  # saved on the CPU's own kernels
    assert {t["kind"] for t in saved["trials"].values() if t["family"] in ("lstm", "gru", "tcn", "transformer")} == {"neural"}
    families = sorted({t["family"] for t in saved["trials"].values()})
    assert families == ["gru", "lgbm", "linear", "lstm", "rf", "snaive", "tcn", "theta", "transformer", "xgb"]
    assert {t["status"] for t in saved["trials"].values()} == {"done"}
    names = {f"{part}.{m}" for part in ("test", "naive") for m in ("mae", "rmse", "smape", "mase")}
    assert all(set(t["metrics"]) == names for t in saved["trials"].values())
    assert {t["choices"].get("pack_size") for t in saved["trials"].values() if t["family"] in ("lstm", "gru", "tcn", "transformer")} == {2}


def test_identical_metrics_compare_as_zero():
    ref = {"a": trial(**{"test.mae": 1.5, "naive.mae": 2.0}), "b": trial("rf", **{"test.mae": 0.25})}
    outcome = tool.compare(ref, json.loads(json.dumps(ref)))
    assert outcome["per_metric"] == {"naive.mae": 0.0, "test.mae": 0.0}
    assert (outcome["max"], outcome["trials"], outcome["missing_current"], outcome["missing_reference"]) == (0.0, 2, [], [])
    assert tool.passes(outcome, 0.0)
    assert tool.report_lines(outcome)[-1] == "max relative difference: 0.0 (2 trials)"


def test_a_known_relative_difference_is_reported_exactly():
    ref = {"a": trial(**{"test.mae": 4.0, "test.rmse": 3.0}), "b": trial(**{"test.mae": 1.0, "test.rmse": 3.0})}
    cur = {"a": trial(**{"test.mae": 5.0, "test.rmse": 3.0}), "b": trial(**{"test.mae": 1.0, "test.rmse": 3.0})}
    outcome = tool.compare(ref, cur)
    assert outcome["per_metric"] == {"test.mae": 0.2, "test.rmse": 0.0}  # |4 - 5| / max(4, 5)
    assert outcome["max"] == 0.2
    assert tool.passes(outcome, 0.2) and not tool.passes(outcome, 0.19)
    lines = tool.report_lines(outcome)
    assert "test.mae     max relative difference 0.2" in lines
    assert LAST_LINE.match(lines[-1]).groups() == ("0.2", "2")


def test_a_missing_trial_fails_whatever_the_tolerance():
    ref = {"a": trial(**{"test.mae": 1.0}), "b": trial(**{"test.mae": 1.0})}
    cur = {"a": trial(**{"test.mae": 1.0}), "c": trial(**{"test.mae": 1.0})}
    outcome = tool.compare(ref, cur)
    assert (outcome["missing_current"], outcome["missing_reference"], outcome["trials"], outcome["max"]) == (["b"], ["c"], 1, 0.0)
    assert not tool.passes(outcome, math.inf)
    lines = tool.report_lines(outcome)
    assert "missing now (in the reference only): b" in lines and "missing in the reference (new now): c" in lines


def test_a_changed_choice_and_a_lost_metric_are_reported():
    ref = {"a": trial(**{"test.mae": 1.0, "test.mase": 0.5})}
    cur = {"a": {**trial(**{"test.mae": 1.0}), "choices": {"pack_size": 4}}}
    outcome = tool.compare(ref, cur)
    assert outcome["per_metric"] == {"test.mae": 0.0, "test.mase": math.inf}
    assert dict(outcome["choices"]) == {"lstm pack_size: 2 -> 4": 1}
    assert "plan choices that differ from the reference: lstm pack_size: 2 -> 4 (1 trials)" in tool.report_lines(outcome)


@pytest.mark.parametrize(("a", "b", "expected"), [(2.0, 2.0, 0.0), (-1.0, 1.0, 2.0), (0.0, 0.0, 0.0), (None, None, 0.0),
                                                  (float("nan"), float("nan"), 0.0), (1.0, None, math.inf), (1.0, float("nan"), math.inf)])
def test_relative_difference(a, b, expected):
    assert tool.relative_difference(a, b) == expected


def test_the_reference_ids_are_the_ids_this_machine_gives_the_demo():
    """Ids are never compared with a tolerance: on every CPU the demo's trials have the reference's ids (issue 34)."""
    from gpufill.campaign import expand, load_campaign
    from gpufill.campaign.run.runner import demo_campaign_path

    spec = load_campaign(demo_campaign_path())
    prints = {name: project.fingerprint() for name, project in spec.data.load(demo_campaign_path().parent).items()}
    assert sorted(t.trial_id for t in expand(spec, prints)) == sorted(json.loads(REFERENCE.read_text())["trials"])


def test_across_machines_a_neural_outlier_passes_but_a_shifted_median_or_a_classical_change_fails():
    names = [f"n{i}" for i in range(5)]
    ref = {**{n: trial(**{"test.mae": 1.0}) for n in names}, "c": trial("linear", "classical", **{"test.mae": 1.0})}
    one_outlier = {**ref, "n0": trial(**{"test.mae": 1.05})}  # an early-stopping epoch moved on one project: 4.8 %
    outcome = tool.compare(ref, one_outlier)
    assert outcome["per_trial"]["n0"] == ("neural", pytest.approx(0.05 / 1.05)) and tool.neural_median(outcome) == 0.0
    assert tool.passes(outcome, tool.ACROSS_MACHINES) and not tool.passes(outcome, tool.SAME_NUMERICS)
    shifted = {**ref, **{n: trial(**{"test.mae": 1.01}) for n in names[:3]}}  # most neural trials moved 1 %: behaviour
    assert tool.neural_median(tool.compare(ref, shifted)) == pytest.approx(0.01 / 1.01)
    assert not tool.passes(tool.compare(ref, shifted), tool.ACROSS_MACHINES)
    classical = {**ref, "c": trial("linear", "classical", **{"test.mae": 1.0 + 1e-6})}  # a closed-form fit moved past rounding
    assert not tool.passes(tool.compare(ref, classical), tool.ACROSS_MACHINES)
    assert tool.passes(tool.compare(ref, {**ref, "c": trial("linear", "classical", **{"test.mae": 1.0 + 4e-16})}), tool.ACROSS_MACHINES)


def test_the_tolerance_follows_the_numerics():
    here = tool.numerics()
    assert tool.tolerance_for(json.loads(json.dumps(here)), here) == (tool.SAME_NUMERICS, "the reference's numerics are this machine's: metrics must be bit-identical")
    elsewhere = {**here, "blas": ["openblas:POWER10"], "torch_cpu": "VSX"}  # values no x86-64 machine reports: they differ from here's on any
    tolerance, why = tool.tolerance_for(elsewhere, here)
    assert tolerance == tool.ACROSS_MACHINES and why.startswith("numerics differ from the reference's (blas ['openblas:POWER10'] there, ")
    assert f"torch_cpu 'VSX' there, {here['torch_cpu']!r} here" in why
    assert tool.tolerance_for(None, here)[0] == tool.ACROSS_MACHINES
