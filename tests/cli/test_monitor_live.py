"""`gpufill monitor`: sparklines, the snapshot's counts, rate and ETA, and rendering in 80 columns."""

from __future__ import annotations

from rich.console import Console

from gpufill.campaign.store.store import Store
from gpufill.campaign.trials.trials import Trial
from gpufill.cli.live import render, snapshot, sparkline
from tests.helpers import a_result, run_cli


def test_sparkline_scales_values_and_leaves_gaps_blank():
    assert sparkline([0, 50, 100], 100) == "▁▅█"
    assert sparkline([None, 100], 100) == " █"
    assert len(sparkline(list(range(100)), 100)) == 40  # the last minute-ish only


def make_store(tmp_path, now):
    store = Store.create(tmp_path)
    trials = [Trial(trial_id=f"t{i}", project=f"p{i}", family="lstm", kind="neural", params={}, train={}, seed=0, lookback=8, shape="s") for i in range(5)]
    store.sync_trials(trials, {"neural": "gpu"})
    store.set_meta({"campaign_name": "watch"})
    store.mark_running(["t0", "t1", "t2"], lane="gpu", worker="gpu-1", run_id=1)
    result = a_result({"mae": 1.0, "rmse": 1.0, "smape": 1.0, "mase": 1.0}, {"mae": 2.0})
    store.record_done("t0", result, duration_s=1.0)
    store.record_done("t1", result, duration_s=1.0)
    store.db.execute("UPDATE trials SET finished_at = ? WHERE trial_id = 't0'", (now - 120,))
    store.db.execute("UPDATE trials SET finished_at = ? WHERE trial_id = 't1'", (now - 60,))
    store.db.execute("UPDATE trials SET started_at = ? WHERE trial_id = 't2'", (now - 30,))
    store.add_samples([{"ts": now - 10 + i, "source": "gpu0", "gpu_util": 10.0 * i, "mem_used": 4e9, "mem_total": 8e9, "power_w": 100 + i, "temp_c": 60} for i in range(10)]
                      + [{"ts": now - 1, "source": "host", "cpu_percent": 75.0}])
    store.event("alert_low_gpu_util", "gpu0: utilisation 12 % for 90 s while trials ran")
    store.close()


def test_snapshot_counts_rate_eta_and_series(tmp_path):
    now = 1_000_000.0
    make_store(tmp_path, now)
    data = snapshot(tmp_path, now=lambda: now)
    assert data["campaign"] == "watch"
    assert (data["counts"]["done"], data["counts"]["running"], data["counts"]["pending"]) == (2, 1, 2)
    assert data["trials_per_min"] == 1.0  # 2 trials finished over the 120 s since the first of them
    assert data["eta_s"] == 180.0  # 3 left at 1 per minute
    assert [(t["family"], t["worker"], t["seconds"]) for t in data["running"]] == [("lstm", "gpu-1", 30.0)]
    assert data["series"]["gpu0"]["util"] == [10.0 * i for i in range(10)]
    assert data["series"]["gpu0"]["mem"][-1] == 50.0
    console = Console(width=80, record=True)
    console.print(render(data))
    text = console.export_text()
    assert "watch: 2/5 done, 0 failed, 1.0 trials/min, ETA 3m00s" in text
    assert "util %" in text and "90%" in text and "cpu %" in text and "75%" in text
    assert "alert: gpu0: utilisation 12 % for 90 s while trials ran" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_finished_campaign_shows_its_last_recorded_minute_off_a_terminal(tmp_path, capsys):
    now = 1_000_000.0
    make_store(tmp_path, now)
    later = snapshot(tmp_path, now=lambda: now + 3600)  # an hour after the last sample: no run holds the workdir
    assert later["series"]["gpu0"]["util"] == [10.0 * i for i in range(10)] and later["series"]["host"]["cpu"] == [75.0]
    code, out, _ = run_cli(capsys, "monitor", "--once", "--workdir", tmp_path)  # stdout is captured, not a terminal
    assert code == 0 and "watch: 2/5 done" in out and "util %" in out and "no resource samples" not in out
