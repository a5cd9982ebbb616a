"""The store's state machine: every transition, exactly-once recording, resume rules."""

import pytest

from gpufill.campaign.store.store import Store
from gpufill.campaign.trials.trials import Trial
from gpufill.errors import InputError
from tests.helpers import a_result

LANES = {"neural": "cpu", "classical": "cpu"}


def trial(i, kind="neural"):
    return Trial(trial_id=f"t{i:03d}", project=f"p{i % 2}", family="lstm" if kind == "neural" else "linear", kind=kind,
                 params={"hidden_size": 8}, train={}, seed=i, lookback=10, shape=f"shape{kind}")


def result(mae):
    metrics = {"mae": mae, "rmse": mae * 1.5, "smape": 10.0, "mase": 0.5}
    return a_result(metrics, {**metrics, "mae": 2 * mae}, timings={"epoch_s": 0.1})


@pytest.fixture
def store(tmp_path):
    s = Store.create(tmp_path)
    yield s
    s.close()


def test_new_trials_are_pending_in_campaign_order(store):
    added, skipped = store.sync_trials([trial(i) for i in range(5)], LANES)
    assert (added, skipped) == (5, 0)
    assert [t.trial_id for t in store.runnable(max_attempts=3)] == ["t000", "t001", "t002", "t003", "t004"]
    assert store.counts().to_dict()["pending"] == 5
    # Syncing the same trials again adds nothing.
    assert store.sync_trials([trial(i) for i in range(5)], LANES) == (0, 0)


def test_a_result_is_recorded_once_and_only_for_a_running_trial(store):
    store.sync_trials([trial(0)], LANES)
    assert not store.record_done("t000", result(1.0), duration_s=1.0)  # not running yet
    store.mark_running(["t000"], lane="cpu", worker="cpu-1", run_id=1)
    assert store.record_done("t000", result(1.0), duration_s=1.0)
    assert not store.record_done("t000", result(9.0), duration_s=1.0)  # a second record changes nothing
    row = store.frame().iloc[0]
    assert (row["status"], row["mae"], row["naive_mae"], row["attempts"]) == ("done", 1.0, 2.0, 1)
    assert list(store.runnable(max_attempts=3)) == []


def test_failures_retry_until_the_attempt_limit(store):
    store.sync_trials([trial(0)], LANES)
    for attempt in (1, 2):
        store.mark_running(["t000"], lane="cpu", worker="w", run_id=1)
        assert store.record_failed("t000", "ValueError: boom", "Traceback ...", duration_s=0.1, retry=attempt < 2)
    row = store.frame().iloc[0]
    assert (row["status"], row["attempts"], row["error"]) == ("failed", 2, "ValueError: boom")
    assert list(store.runnable(max_attempts=2)) == []
    assert [t.trial_id for t in store.runnable(max_attempts=3)] == ["t000"]  # a higher limit on the next run retries it
    assert store.trial_details("t000")["traceback"] == "Traceback ..."


def test_interrupted_trials_go_back_to_pending_with_an_event(store):
    store.sync_trials([trial(0), trial(1)], LANES)
    store.mark_running(["t000", "t001"], lane="cpu", worker="w", run_id=1)
    store.record_done("t001", result(1.0), duration_s=1.0)
    assert store.recover_interrupted(run_id=2) == 1
    counts = store.counts().to_dict()
    assert (counts["pending"], counts["done"], counts["running"]) == (1, 1, 0)
    assert [e["trial_id"] for e in store.events(["interrupted"])] == ["t000"]


def test_trials_dropped_from_the_file_are_skipped_and_revived_when_back(store):
    store.sync_trials([trial(i) for i in range(3)], LANES)
    store.mark_running(["t000"], lane="cpu", worker="w", run_id=1)
    store.record_done("t000", result(1.0), duration_s=1.0)
    added, skipped = store.sync_trials([trial(1)], LANES)  # t000 done (kept), t002 pending (skipped)
    assert (added, skipped) == (0, 1)
    statuses = dict(zip(store.frame(include_stale=True)["trial_id"], store.frame(include_stale=True)["status"]))
    assert statuses == {"t000": "done", "t001": "pending", "t002": "skipped"}
    assert list(store.frame()["trial_id"]) == ["t001"]  # results show the file as it is now
    stale = store.frame(include_stale=True).set_index("trial_id")["stale"].to_dict()
    assert stale == {"t000": True, "t001": False, "t002": True}  # the done t000 is kept, marked stale
    assert (store.counts().total["done"], store.counts().stale) == (0, 1)
    store.sync_trials([trial(i) for i in range(3)], LANES)
    assert store.counts().to_dict()["pending"] == 2


def test_counts_per_lane(store):
    store.sync_trials([trial(0), trial(1, "classical"), trial(2, "classical")], {"neural": "gpu", "classical": "cpu"})
    counts = store.counts().to_dict()
    assert counts["total"] == 3
    assert counts["lanes"]["gpu"]["pending"] == 1 and counts["lanes"]["cpu"]["total"] == 2


def test_readers_open_read_only_and_a_missing_store_is_a_clear_error(store, tmp_path):
    store.sync_trials([trial(0)], LANES)
    reader = Store.open(tmp_path)
    assert reader.counts().to_dict()["total"] == 1
    with pytest.raises(Exception, match="readonly"):
        reader.sync_trials([trial(1)], LANES)
    reader.close()
    with pytest.raises(InputError, match="--workdir"):
        Store.open(tmp_path / "elsewhere")


def test_wal_mode_is_on(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
