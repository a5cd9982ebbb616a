"""The README's first command, `gpufill demo`, and what a user does next with its folder: results, status, monitor,
a second demo (a resume), the report. One demo run serves every test here and tools/demo_metrics.py's (a minute of
the CI each time it runs)."""

from __future__ import annotations

import io
import json
import re
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from tests.helpers import CHROMIUM, check_in_chromium, report_summary, run_cli
from tests.shared_runs import DEMO_STDOUT, copy_of, finished_demo


@pytest.fixture
def demo_run(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> tuple[Path, str]:
    """The session's finished demo (tests/shared_runs.py: a fresh `gpufill` process, the pack size pinned), copied for
    this test: (the folder holding ./gpufill-demo, what the run printed). The report test adds report.html to it, and
    a second `gpufill demo` resumes it with nothing to do."""
    folder = copy_of(finished_demo(tmp_path_factory), tmp_path)
    return folder, (folder / DEMO_STDOUT).read_text()


@pytest.mark.slow
def test_the_demo_runs_and_results_show_every_project_and_family(demo_run, capsys, monkeypatch):
    tmp_path, out = demo_run
    monkeypatch.chdir(tmp_path)
    assert "done 80, failed 0" in out
    code, out, _ = run_cli(capsys, "results", "--format", "json")
    rows = json.loads(out)
    pairs = {(row["project"], row["family"]) for row in rows}
    families = {"lstm", "gru", "tcn", "transformer", "linear", "rf", "xgb", "lgbm", "snaive", "theta"}
    assert len(rows) == 80 and pairs == {(f"p{i:03d}", f) for i in range(8) for f in families}
    beats = sum(row["mae"] < row["naive_mae"] for row in rows)
    assert beats >= 0.9 * len(rows)  # nearly every trained model beats the naive forecast
    snaive = {row["project"]: row["mae"] for row in rows if row["family"] == "snaive"}
    for family in ("lstm", "gru", "tcn", "transformer"):  # each network beats the seasonal naive on the median project
        ratios = sorted(row["mae"] / snaive[row["project"]] for row in rows if row["family"] == family)
        assert statistics.median(ratios) < 1.0, (family, ratios)
    code, out, _ = run_cli(capsys, "results")  # the table view
    assert code == 0 and "80 trials" in out and "lgbm" in out
    # The demo's closing table: each project's best configuration across families, one line each.
    code, out, _ = run_cli(capsys, "results", "--best", "--format", "json")
    best = json.loads(out)
    assert code == 0 and [row["project"] for row in best] == [f"p{i:03d}" for i in range(8)]
    code, out, _ = run_cli(capsys, "results", "--summary", "--format", "json")
    per_family = json.loads(out)
    for row in best:  # every family has a validation score: ranked on it, never on the test scores shown
        ranked = sorted((r for r in per_family if r["project"] == row["project"]), key=lambda r: r["val_mae"])
        assert (row["family"], row["runner_up"], row["families"], row["chosen_on"]) == (ranked[0]["family"], ranked[1]["family"], 10, "val")
        assert row["mae"] == pytest.approx(ranked[0]["mae"]) and row["runner_up_mae"] == pytest.approx(ranked[1]["mae"])
        assert row["runner_up_by"] == pytest.approx(ranked[1]["val_mae"] / ranked[0]["val_mae"] - 1)
    with Console(width=80, record=True, file=io.StringIO()) as console:  # at 80 columns: no line longer, no word cut
        from gpufill.campaign.results.reading import read_best, winners
        from gpufill.cli.campaign_tables import results_table, winners_table

        console.print(winners_table(winners(read_best(tmp_path / "gpufill-demo"))))
        console.print(results_table(read_best(tmp_path / "gpufill-demo"), summary=True))
    text = console.export_text()
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines) and sum(line.startswith("p00") for line in lines) == 8 + 80
    for token in ("n_estimators:100", "hidden_size:32", "num_layers:1", "validation"):
        assert token in text, token
    code, out, _ = run_cli(capsys, "status", "--json")
    status = json.loads(out)
    code, out, _ = run_cli(capsys, "monitor", "--once")  # the dashboard shows what status reports
    assert code == 0 and f"{status['done']}/{status['total']} done, {status['failed']} failed" in out
    assert "ETA done" in out
    code, out, _ = run_cli(capsys, "demo")  # a second run resumes: nothing left to do
    assert code == 0 and "done 80" in out


@pytest.mark.slow
def test_report_after_the_demo(demo_run, tmp_path, capsys, monkeypatch):
    """The issue's acceptance: `gpufill demo`, then `gpufill report`, opened in headless Chromium."""
    folder, _ = demo_run
    monkeypatch.chdir(folder)
    code, stdout, _ = run_cli(capsys, "report")  # finds ./gpufill-demo by itself
    report = folder / "gpufill-demo" / "report.html"
    assert code == 0 and Path(stdout.strip()).resolve() == report.resolve()
    summary = report_summary(report.read_text())
    assert (summary["campaign"], summary["trials total"], summary["trials done"], summary["trials failed"]) == ("demo", "80", "80", "0")
    page = report.read_text()
    for family in ("lstm", "gru", "tcn", "transformer", "linear", "rf", "xgb", "lgbm", "snaive", "theta"):
        assert f"<td>{family}</td>" in page  # every family has a plan row
    # The references: drawn across the family comparison, and every family measured against the seasonal naive.
    assert re.search(r"reference lines: (snaive, theta|theta, snaive)'", page) and "MAE / seasonal naive&#x27;s" in page
    assert ("Line charts: actual vs forecast over the test windows (one step ahead, with intervals from the validation errors), best and worst"
            " project of 10 families") in page
    if CHROMIUM.exists():
        assert check_in_chromium(report, tmp_path) >= 3  # metric per family, forecasts, durations (plus timelines once sampled)


@pytest.mark.slow
def test_forecast_after_the_demo(demo_run, capsys, monkeypatch):
    """`gpufill forecast` on the demo: each project's next value from its best configuration (the demo declares no
    ensemble), with 80 and 95 % intervals around it; asked again, nothing trains."""
    import pandas as pd

    tmp_path, _ = demo_run
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "forecast")
    assert code == 0 and "8 project(s) x 1 step(s)" in out and " 0 read back" in out, out
    rows = pd.read_csv(tmp_path / "gpufill-demo" / "forecast.csv")
    code, best_out, _ = run_cli(capsys, "results", "--best", "--format", "json")
    best = {row["project"]: row["family"] for row in json.loads(best_out)}
    assert rows["project"].tolist() == [f"p{i:03d}" for i in range(8)] and (rows["step"] == 1).all()
    assert [model.split()[0] for model in rows["model"]] == [best[p] for p in rows["project"]]
    assert (rows["lo_95"] <= rows["lo_80"]).all() and (rows["lo_80"] < rows["forecast"]).all() and (rows["forecast"] < rows["hi_80"]).all()
    assert (rows["hi_80"] <= rows["hi_95"]).all() and rows["forecast"].between(0, 10_000).all()
    code, out, _ = run_cli(capsys, "forecast")
    assert code == 0 and "0 trained on all the data now" in out, out
