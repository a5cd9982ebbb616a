"""The campaign store: one SQLite file per workdir (WAL), written only by the scheduler.

Trial status is a small state machine:

    pending --(claimed)--> running --(result)--> done
                              |------(error/crash)--> failed --(retry allowed)--> pending
                              |------(environment failure)--> pending (the attempt not counted)
    pending/failed --(dropped from the campaign file)--> skipped --(back in the file)--> pending
                              |------(a search's pruner stopped it)--> pruned (final, never ranked)

Every transition is one transaction, so a kill -9 at any moment leaves either the old
state or the new one. A result is recorded only for a trial that is `running`, which
makes recording idempotent: a trial is never recorded twice.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpufill import __version__
from gpufill.campaign.policy.queue import Queued, Waiting, fuses
from gpufill.forecasting.trial import Trial, TrialResult
from gpufill.campaign.store.store_health import check_intact, damaged
from gpufill.errors import InputError
from gpufill.files import check_in_place
from gpufill.campaign.store.store_queries import (
    ENVIRONMENT,
    METRICS,
    PROVENANCE_COLUMNS,
    STATUSES,
    Counts,
    StoreQueries,
    frame_columns,
    trial_columns,
)

__all__ = ["DB_NAME", "ENVIRONMENT", "METRICS", "STATUSES", "Counts", "Store", "frame_columns", "trial_columns"]  # the read side's names too: where readers have always found them

DB_NAME = "gpufill.db"
_SIDECARS = ("-wal", "-shm")
"""Files SQLite keeps beside the store in WAL mode; every connection, read-only ones included, may write them."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL,
    host TEXT, pid INTEGER, version TEXT, command TEXT
);
CREATE TABLE IF NOT EXISTS trials (
    trial_id TEXT PRIMARY KEY, position INTEGER NOT NULL,
    project TEXT NOT NULL, family TEXT NOT NULL, kind TEXT NOT NULL,
    params TEXT NOT NULL, train TEXT NOT NULL, seed INTEGER NOT NULL, lookback INTEGER NOT NULL, shape TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
    lane TEXT, worker TEXT, run_id INTEGER,
    started_at REAL, finished_at REAL, duration_s REAL,
    naive_mae REAL,
    metrics TEXT, timings TEXT, plan TEXT, history TEXT, events TEXT,
    error TEXT, traceback TEXT,
    data_fingerprint TEXT NOT NULL DEFAULT '', config_id TEXT NOT NULL DEFAULT '', base_id TEXT NOT NULL DEFAULT '',
    current INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS trials_status ON trials (status, position);
CREATE TABLE IF NOT EXISTS bases (base_id TEXT PRIMARY KEY, base TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS forecasts (
    trial_id TEXT NOT NULL, project TEXT NOT NULL, horizon INTEGER NOT NULL, mase_scale REAL NOT NULL,
    origins BLOB NOT NULL, forecast BLOB NOT NULL, truth BLOB NOT NULL, PRIMARY KEY (trial_id, project)
);
CREATE TABLE IF NOT EXISTS val_forecasts (
    trial_id TEXT NOT NULL, project TEXT NOT NULL, horizon INTEGER NOT NULL,
    origins BLOB NOT NULL, forecast BLOB NOT NULL, truth BLOB NOT NULL, PRIMARY KEY (trial_id, project)
);
CREATE TABLE IF NOT EXISTS samples (
    ts REAL NOT NULL, source TEXT NOT NULL, gpu_util REAL, mem_used REAL, mem_total REAL,
    power_w REAL, power_limit_w REAL, temp_c REAL, sm_clock_mhz REAL, throttle TEXT,
    cpu_percent REAL, cpu_per_core TEXT, ram_used REAL, ram_total REAL, workers_rss REAL
);
CREATE INDEX IF NOT EXISTS samples_ts ON samples (ts);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, run_id INTEGER, lane TEXT, worker TEXT, trial_ids TEXT NOT NULL,
    state TEXT NOT NULL, detail TEXT, submitted_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, run_id INTEGER,
    kind TEXT NOT NULL, trial_id TEXT, message TEXT NOT NULL
);
"""

class Store(StoreQueries):
    """The SQLite store of one workdir, its write side (reads: StoreQueries). Open with `Store.create` (scheduler) or `Store.open` (readers)."""

    def __init__(self, connection: sqlite3.Connection, path: Path):
        self.db = connection
        self.path = path
        self.columns = {row[1] for row in connection.execute("PRAGMA table_info(trials)")}

    @classmethod
    def create(cls, workdir: str | os.PathLike[str]) -> Store:
        """Open (creating if needed) the store for writing: the scheduler's connection."""
        path = Path(workdir) / DB_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", *_SIDECARS, "-journal"):  # SQLite writes them in place: never through a link, never into a shared file
            check_in_place(f"{path}{suffix}", field="--workdir")
        try:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE in _transaction).
            db = sqlite3.connect(path, isolation_level=None, timeout=30)
            check_intact(db, path, existing=path.stat().st_size > 0)
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL is durable against a process crash (kill -9) in WAL mode; FULL adds only power-loss safety.
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(trials)")}
            for column, declaration in {**dict.fromkeys(METRICS, "REAL"), **PROVENANCE_COLUMNS}.items():  # a column per metric
                if column not in present:
                    db.execute(f"ALTER TABLE trials ADD COLUMN {column} {declaration}")
            for table in ("forecasts", "val_forecasts"):  # a quantile network's quantiles (NULL for every other forecast)
                if "quantiles" not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN quantiles BLOB")
        except sqlite3.DatabaseError as error:
            raise damaged(path, error) from None
        return cls(db, path)

    @classmethod
    def open(cls, workdir: str | os.PathLike[str]) -> Store:
        """Open an existing store read-only (status, results, report, monitor)."""
        path = Path(workdir) / DB_NAME
        if not path.exists():
            raise InputError(f"no campaign store ({DB_NAME}) here", where=str(workdir), field="--workdir", fix="pass the workdir a `gpufill run` wrote, or run a campaign first")
        for suffix in _SIDECARS:  # a reader too writes the shared-memory index (and may recover the WAL) in place
            check_in_place(f"{path}{suffix}", field="--workdir")
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
            check_intact(db, path, existing=True)
        except sqlite3.DatabaseError as error:
            raise damaged(path, error) from None
        return cls(db, path)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            if self.db.in_transaction:  # SQLite has already rolled back after some errors (SQLITE_FULL among them)
                self.db.execute("ROLLBACK")
            raise
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def set_meta(self, values: Mapping[str, str]) -> None:
        with self._transaction() as db:
            db.executemany("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", values.items())

    def begin_run(self, command: str) -> int:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO runs (started_at, status, host, pid, version, command) VALUES (?, 'running', ?, ?, ?, ?)",
                (time.time(), socket.gethostname(), os.getpid(), __version__, command),
            )
            return int(cursor.lastrowid)

    def end_run(self, run_id: int, status: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE runs SET finished_at = ?, status = ? WHERE run_id = ?", (time.time(), status, run_id))

    def event(self, kind: str, message: str, *, run_id: int | None = None, trial_id: str | None = None) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO events (ts, run_id, kind, trial_id, message) VALUES (?, ?, ?, ?, ?)", (time.time(), run_id, kind, trial_id, message))

    def record_jobs(self, run_id: int, jobs: Sequence[Mapping[str, Any]]) -> None:
        """Insert or update batch jobs ({job_id, lane, worker, trial_ids, state, detail}) in one transaction."""
        if not jobs:
            return
        now = time.time()
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO jobs (job_id, run_id, lane, worker, trial_ids, state, detail, submitted_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(job_id) DO UPDATE SET state = excluded.state, detail = excluded.detail, updated_at = excluded.updated_at",
                [(j["job_id"], run_id, j["lane"], j["worker"], _dumps(list(j["trial_ids"])), j["state"], j["detail"], now, now) for j in jobs],
            )

    def add_samples(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Monitor rows (see monitor/sampler.py): source "gpu0", "gpu1", ... or "host"; bytes, W, C, %."""
        if not rows:
            return
        columns = self.SAMPLE_COLUMNS
        with self._transaction() as db:
            db.executemany(
                f"INSERT INTO samples ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                [tuple(_sample_value(row.get(c)) for c in columns) for row in rows],
            )

    def sync_trials(self, trials: Sequence[Trial], lane_of: Mapping[str, str], bases: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """Add new trials as pending; skip pending/failed ones no longer in the file; revive skipped ones.
        The file's trials are marked current, every other one stale (kept, shown with `results --all`).
        `bases`: base_id -> what the trials of a kind share (their full configuration is base + row).

        Returns (added, skipped). Done trials are never touched.
        """
        with self._transaction() as db:
            before = db.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
            db.executemany("INSERT OR IGNORE INTO bases (base_id, base) VALUES (?, ?)", [(key, _dumps(base)) for key, base in (bases or {}).items()])
            db.execute("UPDATE trials SET current = 0 WHERE current = 1")
            db.executemany(  # rows made one at a time: 36,000 of them at once would be the scheduler's largest allocation
                "INSERT INTO trials (trial_id, position, project, family, kind, params, train, seed, lookback, shape, lane, data_fingerprint, config_id, base_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(trial_id) DO UPDATE SET position = excluded.position, current = 1",
                ((t.trial_id, i, t.project, t.family, t.kind, _dumps(t.params), _dumps(t.train), t.seed, t.lookback, t.shape, lane_of[t.kind],
                  t.data_fingerprint, t.config_id, t.base_id)
                 for i, t in enumerate(trials)),
            )
            added = db.execute("SELECT COUNT(*) FROM trials").fetchone()[0] - before
            # The file's trials are exactly the rows marked current now: the rest that could run is skipped, and skipped ones of the file revived.
            dropped = db.execute("SELECT COUNT(*) FROM trials WHERE current = 0 AND status IN ('pending', 'failed', 'skipped')").fetchone()[0]
            db.execute("UPDATE trials SET status = 'skipped' WHERE current = 0 AND status IN ('pending', 'failed')")
            db.execute("UPDATE trials SET status = 'pending' WHERE current = 1 AND status = 'skipped'")
        return added, dropped

    def recover_interrupted(self, run_id: int) -> int:
        """Trials left `running` by a scheduler that died go back to pending (their attempt counted)."""
        with self._transaction() as db:
            ids = [row[0] for row in db.execute("SELECT trial_id FROM trials WHERE status = 'running'")]
            db.execute("UPDATE trials SET status = 'pending', worker = NULL WHERE status = 'running'")
            db.executemany(
                "INSERT INTO events (ts, run_id, kind, trial_id, message) VALUES (?, ?, 'interrupted', ?, 'was running when the previous scheduler stopped; retried')",
                [(time.time(), run_id, tid) for tid in ids],
            )
        return len(ids)

    def runnable(self, max_attempts: int) -> Iterator[Waiting]:
        """Pending trials, and failed ones with attempts left, in campaign order: what the scheduler queues (a trial's
        id, shape and project; the rest is read again when it is sent, `queued`)."""
        cursor = self.db.execute(
            "SELECT trial_id, shape, kind, project FROM trials WHERE status = 'pending' OR (status = 'failed' AND attempts < ?) ORDER BY position",
            (max_attempts,),
        )
        shared: dict[str, str] = {}  # tens of thousands of trials share a few hundred shapes: one string each
        for trial_id, shape, kind, project in cursor:
            yield Waiting(trial_id, shared.setdefault(shape, shape), shared.setdefault(kind, kind), fuses(kind, project), project)

    def queued(self, trial_ids: Sequence[str]) -> list[Queued]:
        """The trials `trial_ids` (in that order) as a worker gets them, with their attempts so far (and the data
        fingerprint their ids name: a worker trains a trial only on that data)."""
        marks = ",".join("?" * len(trial_ids))
        rows = {row[0]: row for row in self.db.execute(
            f"SELECT trial_id, project, family, kind, params, train, seed, lookback, shape, attempts, {self._column('data_fingerprint')} FROM trials"
            f" WHERE trial_id IN ({marks})", list(trial_ids))}
        return [Queued(Trial(trial_id=trial_id, project=project, family=family, kind=kind, params=json.loads(params), train=json.loads(train),
                             seed=seed, lookback=lookback, shape=shape, data_fingerprint=fingerprint or ""), attempts=attempts)
                for trial_id, project, family, kind, params, train, seed, lookback, shape, attempts, fingerprint in map(rows.__getitem__, trial_ids)]

    def mark_running(self, trial_ids: Sequence[str], *, lane: str, worker: str, run_id: int) -> None:
        now = time.time()
        with self._transaction() as db:
            db.executemany(
                "UPDATE trials SET status = 'running', attempts = attempts + 1, lane = ?, worker = ?, run_id = ?, started_at = ?, error = NULL, traceback = NULL"
                " WHERE trial_id = ? AND status IN ('pending', 'failed')",
                [(lane, worker, run_id, now, tid) for tid in trial_ids],
            )

    def release(self, trial_ids: Sequence[str]) -> None:
        """Running trials handed back unstarted (a pack smaller than sent): pending, attempt not counted."""
        with self._transaction() as db:
            db.executemany(
                "UPDATE trials SET status = 'pending', attempts = attempts - 1, worker = NULL WHERE trial_id = ? AND status = 'running'",
                [(tid,) for tid in trial_ids],
            )

    def record_pruned(self, trial_id: str, result: TrialResult, *, duration_s: float) -> bool:
        """Record a trial a search's pruner stopped: its validation scores, history and events, no test score and no
        forecasts (it never finished, so nothing ranks it); False (and nothing written) unless it was running."""
        kept = {key: value for key, value in result.metrics.items() if key in ("val", "rungs", "pruned")}
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE trials SET status = 'pruned', finished_at = ?, duration_s = ?, metrics = ?, timings = ?, plan = ?, history = ?, events = ?,"
                " error = NULL, traceback = NULL WHERE trial_id = ? AND status = 'running'",
                (time.time(), duration_s, _dumps(kept), _dumps(result.timings), _dumps(result.plan), _dumps(result.history), _dumps(result.events),
                 trial_id),
            )
            return cursor.rowcount == 1

    def record_done(self, trial_id: str, result: TrialResult, *, duration_s: float) -> bool:
        """Record a finished trial's result; False (and nothing written) unless it was running."""
        test = result.metrics["test"]
        naive = result.metrics["naive"]
        with self._transaction() as db:
            cursor = db.execute(
                f"UPDATE trials SET status = 'done', finished_at = ?, duration_s = ?, {''.join(f'{m} = ?, ' for m in METRICS)}naive_mae = ?,"
                " metrics = ?, timings = ?, plan = ?, history = ?, events = ?, error = NULL, traceback = NULL"
                " WHERE trial_id = ? AND status = 'running'",
                (
                    time.time(), duration_s, *(test[m] for m in METRICS), naive["mae"],
                    _dumps(result.metrics), _dumps(result.timings), _dumps(result.plan), _dumps(result.history), _dumps(result.events), trial_id,
                ),
            )
            if cursor.rowcount != 1:
                return False
            import numpy as np  # here: readers of the store (status, results) never need it

            def quantiles(kept: dict[str, Any]) -> bytes | None:
                return np.asarray(kept["quantiles"], np.float32).tobytes() if kept.get("quantiles") is not None else None

            db.executemany(  # the test forecasts, compact: int32 origins, float32 values (data/scoring.py)
                "INSERT OR REPLACE INTO forecasts (trial_id, project, horizon, mase_scale, origins, forecast, truth, quantiles)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(trial_id, project, int(np.shape(kept["forecast"])[1]), kept["mase_scale"], np.asarray(kept["origins"], np.int32).tobytes(),
                  np.asarray(kept["forecast"], np.float32).tobytes(), np.asarray(kept["truth"], np.float32).tobytes(), quantiles(kept))
                 for project, kept in result.forecasts.items()],
            )
            db.executemany(  # the validation forecasts, the same way: what an ensemble's validation score is computed from
                "INSERT OR REPLACE INTO val_forecasts (trial_id, project, horizon, origins, forecast, truth, quantiles) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(trial_id, project, int(np.shape(kept["forecast"])[1]), np.asarray(kept["origins"], np.int32).tobytes(),
                  np.asarray(kept["forecast"], np.float32).tobytes(), np.asarray(kept["truth"], np.float32).tobytes(), quantiles(kept))
                 for project, kept in result.val_forecasts.items()],
            )
            return True

    def record_environment(self, trial_id: str, error: str, traceback: str, *, duration_s: float) -> bool:
        """A running trial the environment failed (its data missing or changed, a full disk, its worker killed):
        back to pending with its attempt not counted, the error kept (after ENVIRONMENT) to say what it waits for."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE trials SET status = 'pending', attempts = MAX(attempts - 1, 0), worker = NULL, finished_at = ?, duration_s = ?, error = ?,"
                " traceback = ? WHERE trial_id = ? AND status = 'running'",
                (time.time(), duration_s, ENVIRONMENT + error, traceback, trial_id),
            )
            return cursor.rowcount == 1

    def record_failed(self, trial_id: str, error: str, traceback: str, *, duration_s: float, retry: bool) -> bool:
        """Record a failed attempt; with `retry` the trial goes back to pending."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE trials SET status = ?, finished_at = ?, duration_s = ?, error = ?, traceback = ? WHERE trial_id = ? AND status = 'running'",
                ("pending" if retry else "failed", time.time(), duration_s, error, traceback, trial_id),
            )
            return cursor.rowcount == 1


def _sample_value(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)

