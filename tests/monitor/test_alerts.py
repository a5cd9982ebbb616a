import json
import math

import pytest

from gpufill.monitor.alerts import Alert, AlertWatch, all_alerts, high_memory, idle_lane, low_gpu_utilisation, throttling
from gpufill.monitor.sampler import SAMPLE_COLUMNS

GIB = 2**30


def row(ts, source="gpu0", util=90.0, used=10 * GIB, total=80 * GIB, throttle=()):
    return {**dict.fromkeys(SAMPLE_COLUMNS), "ts": float(ts), "source": source, "gpu_util": util,
            "mem_used": used, "mem_total": total, "throttle": list(throttle)}


def trace(utils, start=0.0, source="gpu0"):
    """One row per second: utils is a list of (seconds, util) pieces."""
    rows, ts = [], start
    for seconds, util in utils:
        for _ in range(seconds):
            rows.append(row(ts, source, util))
            ts += 1.0
    return rows


def host(ts):
    return {**dict.fromkeys(SAMPLE_COLUMNS), "ts": ts, "source": "host", "cpu_percent": 5.0}


def test_sustained_low_utilisation_fires_once_with_its_duration():
    rows = trace([(30, 95.0), (121, 10.0), (30, 95.0)]) + [host(t) for t in range(0, 180, 5)]
    alerts = low_gpu_utilisation(rows)
    assert len(alerts) == 1
    a = alerts[0]
    assert (a.kind, a.source, a.ts, a.duration_s) == ("low_gpu_util", "gpu0", 30.0, 120.0)
    assert a.message.startswith("gpu0: utilisation 10% on average for 120 s while trials ran (below 30%)")


def test_high_utilisation_and_a_short_dip_fire_nothing():
    assert low_gpu_utilisation(trace([(300, 90.0)])) == []
    assert low_gpu_utilisation(trace([(60, 90.0), (20, 20.0), (60, 90.0)])) == []


def test_low_utilisation_while_nothing_runs_is_not_an_alert():
    rows = trace([(200, 5.0)])
    assert low_gpu_utilisation(rows, busy=lambda ts: False) == []
    # work only from t=100: the idle first 100 s do not count, the next 100 s do
    alerts = low_gpu_utilisation(rows, busy=lambda ts: ts >= 100)
    assert [(a.ts, a.duration_s) for a in alerts] == [(100.0, 99.0)]


def test_each_gpu_and_each_episode_is_its_own_alert():
    rows = trace([(70, 10.0), (10, 80.0), (90, 25.0)]) + trace([(200, 15.0)], source="gpu1")
    alerts = low_gpu_utilisation(rows, threshold=30.0, min_duration_s=60.0)
    assert [(a.source, a.ts, a.duration_s) for a in alerts] == [("gpu0", 0.0, 69.0), ("gpu0", 80.0, 89.0), ("gpu1", 0.0, 199.0)]
    assert "25%" in alerts[1].message


def test_a_gap_in_the_samples_ends_an_episode():
    rows = trace([(40, 10.0)]) + trace([(40, 10.0)], start=1000.0)  # sampler stopped for 15 minutes
    assert low_gpu_utilisation(rows, min_duration_s=60.0) == []


def test_high_memory_one_alert_per_episode():
    rows = [row(t, used=u * GIB) for t, u in enumerate([40, 73, 76, 78, 70, 60, 75, 50])]
    alerts = high_memory(rows)
    assert [(a.kind, a.ts, a.duration_s) for a in alerts] == [("high_memory", 1.0, 2.0), ("high_memory", 6.0, 0.0)]
    assert alerts[0].message == "gpu0: memory 98% used (peak 78.0 of 80.0 GiB), above 90%: close to out of memory"
    assert high_memory([row(0, used=70 * GIB)]) == [] and high_memory([row(0, used=70 * GIB)], threshold=0.8) != []


def test_throttling_names_the_reasons_and_ignores_benign_ones():
    rows = [row(0), row(1, throttle=["idle"]), row(2, throttle=["thermal"]), row(3, throttle=["thermal", "power_cap"]),
            row(4, throttle=["sync_boost"]), row(5, throttle=["hw_slowdown"])]
    alerts = throttling(rows)
    assert [(a.ts, a.duration_s) for a in alerts] == [(2.0, 1.0), (5.0, 0.0)]
    assert alerts[0].message == "gpu0: clocks throttled (thermal, power_cap) for 1 s"
    assert alerts[1].message == "gpu0: clocks throttled (hw_slowdown) for 0 s"


def test_rows_read_back_from_the_store_are_understood():
    """The store keeps lists as JSON text, and a DataFrame turns missing numbers into NaN."""
    rows = [{**row(t, util=5.0, throttle=()), "throttle": json.dumps(["power_cap"])} for t in range(90)]
    rows.append({**row(90), "gpu_util": math.nan, "mem_used": math.nan, "throttle": None})
    kinds = [a.kind for a in all_alerts(rows)]
    assert kinds == ["low_gpu_util", "throttling"]


def test_idle_lane_while_work_waits():
    snapshots = [(float(t), "gpu", 0 if 10 <= t < 50 else 2, 5) for t in range(0, 60, 5)]
    snapshots += [(float(t), "cpu", 0, 0) for t in range(0, 60, 5)]  # idle with nothing waiting: fine
    snapshots += [(float(t), "cpu", 0, 3) for t in range(100, 110, 5)]  # 5 s only: too short
    alerts = idle_lane(snapshots, min_duration_s=30)
    assert alerts == [Alert("idle_lane", "gpu lane idle for 35 s with up to 5 trials waiting", 10.0, "gpu", 35.0)]


def test_all_alerts_combines_and_orders_by_time():
    rows = trace([(100, 10.0)], start=50.0) + [row(10, used=79 * GIB), row(20, throttle=["hw_thermal"])]
    alerts = all_alerts(rows, snapshots=[(0.0, "cpu", 0, 4), (40.0, "cpu", 0, 4)])
    assert [(a.kind, a.ts) for a in alerts] == [("idle_lane", 0.0), ("high_memory", 10.0), ("throttling", 20.0), ("low_gpu_util", 50.0)]
    assert all_alerts(trace([(300, 95.0)])) == []


@pytest.mark.parametrize("threshold, expected", [(30.0, 0), (50.0, 1)])
def test_threshold_is_respected(threshold, expected):
    assert len(low_gpu_utilisation(trace([(100, 40.0)]), threshold=threshold)) == expected


def test_a_running_campaigns_watch_says_each_episode_once_over_its_window():
    watch = AlertWatch(window_s=600.0, every_s=30.0)
    rows = trace([(30, 95.0), (121, 10.0), (30, 95.0)])
    watch.add(rows, [(float(t), "gpu0", 1, 5) for t in range(0, 181, 10)])  # GPU trials ran throughout
    assert watch.due(181.0)
    first = watch.check(181.0)
    assert [(a.kind, a.source, a.ts) for a in first] == [("low_gpu_util", "gpu0", 30.0)]
    assert not watch.due(200.0) and watch.due(211.0)
    assert watch.check(211.0) == []  # the same episode is not said again
    watch.check(30.0 + 600.0 + 200.0)  # past the window: the old rows and snapshots are dropped
    assert watch.rows == [] and watch.snapshots == []
