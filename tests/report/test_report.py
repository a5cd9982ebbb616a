"""`gpufill report`: the HTML's content, its images, and how headless Chromium renders it."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from gpufill.campaign.run.runner import Campaign, best_per_project, read_results
from gpufill.campaign.store.store import Store
from tests.helpers import CHROMIUM, check_in_chromium, report_summary, run_cli, write_campaign

GIB = 1024**3
IMAGE = re.compile(r"<img class='plot' alt='([^']+)' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>")


def _add_monitor_rows(workdir: Path, *, gpus: bool) -> None:
    """Ten seconds of synthetic monitor rows (host, and two GPUs when asked) and one alert."""
    store = Store.create(workdir)
    try:
        t0 = store.db.execute("SELECT MIN(started_at) FROM runs").fetchone()[0]
        rows = []
        for i in range(10):
            rows.append({"ts": t0 + i, "source": "host", "cpu_percent": 40.0 + 2 * i, "cpu_per_core": [40.0, 50.0],
                         "ram_used": 4 * GIB, "ram_total": 16 * GIB})
            if gpus:
                for gpu, util in (("gpu0", 20.0), ("gpu1", 60.0)):
                    rows.append({"ts": t0 + i, "source": gpu, "gpu_util": util, "mem_used": 2 * GIB, "mem_total": 80 * GIB,
                                 "power_w": 100.0 + i, "power_limit_w": 300.0, "temp_c": 40.0 + i})
        store.add_samples(rows)
        store.event("alert_low_gpu_util", "gpu0 under 30 % for 60 s while trials ran")
        store.event("run", "not an alert")
    finally:
        store.close()


@pytest.fixture(scope="module")
def campaign_workdir(tmp_path_factory) -> Path:
    """3 projects x (mlp with 2 hidden sizes, linear, a model that always raises): 9 done, 3 failed."""
    directory = tmp_path_factory.mktemp("report")
    path = write_campaign(directory, projects=3, epochs=2,
                          models="mlp: {hidden_size: [8, 16]}\n  linear: {}\n  tests.campaign_models:always_raises: {}")
    workdir = directory / "work"
    outcome = Campaign.from_yaml(path, workdir).run(executor="inline")
    assert (outcome.done, outcome.failed) == (9, 3)
    _add_monitor_rows(workdir, gpus=True)
    return workdir


def _images(page: str) -> list[tuple[str, bytes]]:
    return [(alt, base64.b64decode(data)) for alt, data in IMAGE.findall(page)]


@pytest.mark.slow
def test_report_has_summary_comparison_failures_alerts_and_plans(campaign_workdir, capsys):
    out = campaign_workdir / "custom" / "r.html"
    code, stdout, _ = run_cli(capsys, "report", "--workdir", campaign_workdir, "--out", out)
    assert code == 0 and stdout.strip() == str(out)
    page = out.read_text()

    summary = report_summary(page)
    assert (summary["campaign"], summary["trials total"], summary["trials done"], summary["trials failed"], summary["trials skipped"]) == ("tiny", "12", "9", "3", "0")
    assert summary["GPU-hours (neural trials on the GPU lane)"].startswith("0 h")  # no GPU here: every trial ran on the CPU lane
    assert summary["achieved mean GPU utilisation"] == "40.0 %"  # gpu0 at 20 %, gpu1 at 60 %
    # The run's own sampler adds real host rows to the synthetic ones (40, 42, ..., 58): expect their mean.
    store = Store.open(campaign_workdir)
    host_cpu = store.samples().query("source == 'host'")["cpu_percent"].mean()
    store.close()
    assert summary["mean CPU utilisation"] == f"{host_cpu:.1f} %"
    results = read_results(campaign_workdir)
    trial_hours = results["duration_s"].sum() / 3600
    assert summary["trial-hours"].startswith(f"{trial_hours:.3g} h")
    assert re.fullmatch(r"\d+\.\d s", summary["wall time"]) and 0 < float(summary["wall time"][:-2]) < 120

    # Failures: one row per failed trial, the error, the traceback folded away.
    failures = re.search(r"<table id='failures'>(.*?)</table>", page, re.S).group(1)
    failed = results[results["status"] == "failed"]
    for trial_id in failed["trial_id"]:
        assert f"<td>{trial_id}</td>" in failures
    assert failures.count("ValueError: this model always fails") == 3 * 2  # the error cell and the traceback's last line
    assert failures.count("<details><summary>traceback</summary>") == 3 and "<td class='num'>2</td>" in failures  # 2 attempts (retries: 1)

    # Best configuration per project: linear least squares wins on these synthetic series.
    best = re.search(r"<table id='best'>(.*?)</table>", page, re.S).group(1)
    expected = best_per_project(results).groupby("project").head(1)
    assert len(re.findall("<tr>", best)) == 1 + 3
    for row in expected.itertuples():
        assert f"<tr><td>{row.project}</td><td>{row.family}</td><td>(defaults)</td><td class='num'>12</td><td class='num'>{row.mae:.4g}</td>" in best

    # Alerts: only events whose kind starts with "alert".
    alerts = re.search(r"<table id='alerts'>(.*?)</table>", page, re.S).group(1)
    assert "alert_low_gpu_util" in alerts and "gpu0 under 30 %" in alerts and "not an alert" not in alerts

    # Plans: one row per family/shape that finished (the failing model never produced a plan).
    plans = re.search(r"<table id='plans'>(.*?)</table>", page, re.S).group(1)
    assert len(re.findall("<tr>", plans)) == 1 + 3  # header + mlp(8) + mlp(16) + linear
    assert "mlp[lookback=12 batch_size=auto epochs=2 | hidden_size=8]" in plans and "linear[lookback=12]" in plans
    assert "<th>precision</th>" in plans and "fp32: CPU" in plans

    # Self-contained: no network resources, every image an inline non-trivial PNG with alt text.
    assert "http://" not in page and "https://" not in page and "<link" not in page and "<script src" not in page
    images = _images(page)
    # metric per family, parameter effects, forecasts, 4 GPU timelines, CPU and RAM, durations
    assert len(images) == page.count("<img") == 1 + 1 + 1 + 4 + 2 + 1
    for alt, png in images:
        assert alt and png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1024
    assert "no GPU samples" not in page


def test_without_gpu_rows_the_gpu_plots_are_a_note(tmp_path, capsys):
    path = write_campaign(tmp_path, projects=2, epochs=1, models="linear: {}")
    workdir = tmp_path / "work"
    Campaign.from_yaml(path, workdir).run(executor="inline")
    _add_monitor_rows(workdir, gpus=False)
    code, stdout, _ = run_cli(capsys, "report", "--workdir", workdir)
    assert code == 0 and stdout.strip() == str(workdir / "report.html")
    page = (workdir / "report.html").read_text()
    assert "no GPU samples" in page and "GPU utilisation per GPU" not in page
    assert report_summary(page)["achieved mean GPU utilisation"] == "n/a" and "no failed trials" in page
    assert "no grid parameter varies" in page
    assert len(_images(page)) == page.count("<img") == 1 + 1 + 2 + 1  # metric per family, forecasts, CPU and RAM, durations


def test_report_on_a_missing_workdir_exits_2_with_one_line(tmp_path, capsys):
    code, out, err = run_cli(capsys, "report", "--workdir", tmp_path / "nowhere")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "nowhere" in lines[0] and "--workdir" in lines[0] and "gpufill.db" in lines[0]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make test installs it)")
@pytest.mark.slow
def test_report_renders_every_plot_in_headless_chromium(campaign_workdir, tmp_path, capsys):
    code, stdout, _ = run_cli(capsys, "report", "--workdir", campaign_workdir, "--out", tmp_path / "report.html")
    assert code == 0
    assert check_in_chromium(Path(stdout.strip()), tmp_path) == 10  # + the forecasts


def test_the_step_breakdowns_title_and_legend_do_not_overlap():
    import matplotlib.pyplot as plt

    from gpufill.report.plots import step_breakdown, step_breakdown_figure

    shares = {"data_wait": 0.1, "copy": 0.02, "forward": 0.4, "backward": 0.38, "optimizer": 0.1}
    fig = step_breakdown_figure(shares, 10.4)
    fig.canvas.draw()
    ax = fig.axes[0]
    title, legend = ax.title.get_window_extent(), ax.get_legend().get_window_extent()
    plt.close(fig)
    assert legend.y1 <= title.y0  # the legend wholly below the title (it was drawn across it)
    assert legend.y0 >= ax.get_window_extent().y1 - 1  # and above the bar
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["data wait 10%", "copy 2%", "forward 40%", "backward 38%", "optimizer 10%"]
    assert step_breakdown(shares, 10.4).alt == "Stacked bar: data_wait 10%, copy 2%, forward 40%, backward 38%, optimizer 10%"
