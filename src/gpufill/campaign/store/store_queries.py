"""The campaign store's read side: the queries status, results, reports and the live view ask of a store.

`Store` (store.py, the write side: the scheduler's transitions) is a `StoreQueries` too, so the scheduler reads
what it wrote through the same connection; readers open a store with `Store.open` and use only these.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufill.forecasting.trial import METRICS

if TYPE_CHECKING:
    import pandas as pd


STATUSES = ("pending", "running", "done", "pruned", "failed", "skipped")
ENVIRONMENT = "environment: "
"""How the error of a trial an environment failure sent back to pending begins."""

def trial_columns() -> tuple[str, ...]:
    """What results show of each trial, a column of each metric among them (the rest of a row, its history and plan, is
    in trial_details)."""
    return ("trial_id", "project", "family", "kind", "params", "train", "seed", "lookback", "status", "attempts", "lane", "worker",
            "duration_s", *METRICS, "naive_mae", "error")
PROVENANCE_COLUMNS = {"data_fingerprint": "TEXT NOT NULL DEFAULT ''", "config_id": "TEXT NOT NULL DEFAULT ''",
                      "base_id": "TEXT NOT NULL DEFAULT ''", "current": "INTEGER NOT NULL DEFAULT 1"}
"""Added after the first stores were written: a run adds them to an older store; readers see their defaults."""
def frame_columns() -> list[str]:
    """`trial_columns` and `val_<metric>`: the validation window's score (networks with a validation split; None
    elsewhere): what choosing reads."""
    return [*trial_columns(), *(f"val_{m}" for m in METRICS), "data_fingerprint", "config_id", "base_id", "stale"]


@dataclass(frozen=True, slots=True)
class Counts:
    """How many trials are in each status, overall and per lane."""

    total: dict[str, int]
    lanes: dict[str, dict[str, int]]
    stale: int = 0
    """Finished trials of an earlier version of the campaign file (or of its data): kept, not counted above."""
    interrupted: int = 0
    """Trials a run that is no longer alive left `running` (counted as pending above: a re-run retries them)."""
    run: dict[str, Any] | None = None
    """The latest run as readers see it (reading.run_state): state running, interrupted, done, failed or incomplete."""

    def to_dict(self) -> dict[str, Any]:
        return {"total": sum(self.total.values()), **self.total, "lanes": {lane: {"total": sum(c.values()), **c} for lane, c in self.lanes.items()},
                "stale": self.stale, "interrupted": self.interrupted, "run": self.run}


class StoreQueries:
    """Reads of one store's SQLite connection (`db`); `columns`: the trials table's columns (an older store lacks some)."""

    db: sqlite3.Connection
    path: Path
    columns: set[str]

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def last_run(self) -> dict[str, Any] | None:
        """The latest run's row (run_id, started_at, finished_at, status, host, pid, command), None before any."""
        keys = ("run_id", "started_at", "finished_at", "status", "host", "pid", "command")
        row = self.db.execute(f"SELECT {', '.join(keys)} FROM runs ORDER BY run_id DESC LIMIT 1").fetchone()
        return dict(zip(keys, row, strict=True)) if row else None

    def events(self, kinds: Sequence[str] | None = None) -> list[dict[str, Any]]:
        query = "SELECT ts, run_id, kind, trial_id, message FROM events"
        args: tuple[Any, ...] = ()
        if kinds:
            query += f" WHERE kind IN ({','.join('?' * len(kinds))})"
            args = tuple(kinds)
        rows = self.db.execute(query + " ORDER BY event_id", args).fetchall()
        return [dict(zip(("ts", "run_id", "kind", "trial_id", "message"), row, strict=True)) for row in rows]

    # -- batch jobs (Slurm) ---------------------------------------------------------------
    JOB_COLUMNS = ("job_id", "run_id", "lane", "worker", "trial_ids", "state", "detail", "submitted_at", "updated_at")

    def orphan_jobs(self, run_id: int) -> list[str]:
        """Jobs an earlier run left queued or running (its scheduler died): marked failed; returns their ids."""
        with self._transaction() as db:
            ids = [row[0] for row in db.execute("SELECT job_id FROM jobs WHERE state IN ('queued', 'running') AND run_id != ?", (run_id,))]
            db.executemany("UPDATE jobs SET state = 'failed', detail = 'orphaned: its scheduler stopped', updated_at = ? WHERE job_id = ?", [(time.time(), i) for i in ids])
        return ids

    def jobs(self, states: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Batch jobs, oldest first (none in a store older than the jobs table)."""
        if self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone() is None:
            return []
        query, args = "SELECT " + ", ".join(self.JOB_COLUMNS) + " FROM jobs", ()
        if states:
            query += f" WHERE state IN ({','.join('?' * len(states))})"
            args = tuple(states)
        rows = [dict(zip(self.JOB_COLUMNS, row, strict=True)) for row in self.db.execute(query + " ORDER BY submitted_at, job_id", args)]
        for row in rows:
            row["trial_ids"] = json.loads(row["trial_ids"])
        return rows

    # -- monitoring samples ---------------------------------------------------------------
    SAMPLE_COLUMNS = ("ts", "source", "gpu_util", "mem_used", "mem_total", "power_w", "power_limit_w", "temp_c",
                      "sm_clock_mhz", "throttle", "cpu_percent", "cpu_per_core", "ram_used", "ram_total", "workers_rss")

    def has_samples(self) -> bool:
        """False for a store written before the samples table existed (readers open read-only: no migration)."""
        return self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'samples'").fetchone() is not None

    def samples(self) -> pd.DataFrame:
        import pandas as pd  # readers that need no frame (status, monitor) skip importing pandas

        if not self.has_samples():
            return pd.DataFrame(columns=list(self.SAMPLE_COLUMNS))
        return pd.read_sql_query("SELECT * FROM samples ORDER BY ts", self.db)

    def waiting_on_environment(self) -> tuple[int, str | None]:
        """Pending trials of the file an environment failure sent back, and the latest one's error."""
        rows = self.db.execute(f"SELECT error FROM trials WHERE status = 'pending' AND {self._column('current')} = 1 AND error LIKE ?"
                               " ORDER BY finished_at DESC", (ENVIRONMENT + "%",)).fetchall()
        return len(rows), rows[0][0][len(ENVIRONMENT):] if rows else None

    def counts(self) -> Counts:
        """Trials of the campaign file as it is now, per status and lane; stale ones only counted."""
        total = dict.fromkeys(STATUSES, 0)
        lanes: dict[str, dict[str, int]] = {}
        current = self._column("current")
        stale = 0
        for lane, status, now, n in self.db.execute(f"SELECT COALESCE(lane, 'cpu'), status, {current}, COUNT(*) FROM trials GROUP BY 1, 2, 3"):
            if not now:
                stale += n if status in ("done", "failed") else 0
                continue
            total[status] += n
            lanes.setdefault(lane, dict.fromkeys(STATUSES, 0))[status] += n
        return Counts(total=total, lanes=lanes, stale=stale)

    def records(self, *, include_stale: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        """One dict per trial of the campaign file as it is now, in campaign order (params and train
        overrides as JSON text); `include_stale`: every trial the store holds, `stale` True for those
        of earlier versions of the file or data. Plain SQLite: no pandas, fast for the CLI."""
        where = "" if include_stale else f" WHERE status != 'skipped' AND {self._column('current')} = 1"
        provenance = ", ".join(f"{self._column(c)} AS {c}" for c in PROVENANCE_COLUMNS)
        validation = ", ".join(f"{_validation(m)} AS val_{m}" for m in METRICS)
        cursor = self.db.execute(f"SELECT {self._trial_columns()}, {validation}, {provenance} FROM trials{where} ORDER BY position"
                                 + (f" LIMIT {int(limit)}" if limit is not None else ""))
        return _with_stale(cursor)

    def config_means(self, metric: str = "mae", *, include_stale: bool = False) -> list[dict[str, Any]]:
        """Per configuration (everything but the seed) of done trials: the mean `metric` over its seeds and
        how many there are, and the mean of its validation `metric` (`val_<metric>`, None where no seed has one). SQLite aggregates: a summary of 36,000 trials reads a few thousand rows."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}")
        if metric not in self.columns:  # a metric registered after this store was last written: no trial has it
            return []
        current = self._column("current")
        where = f"status = 'done' AND {metric} IS NOT NULL" + ("" if include_stale else f" AND {current} = 1")
        config = self._column("config_id")
        cursor = self.db.execute(
            f"SELECT project, family, {current} AS current, {config} AS config_id, params, train, lookback, {self._column('base_id')} AS base_id,"
            f" AVG({metric}) AS {metric}, COUNT(*) AS seeds,"
            f" AVG({_validation(metric)}) AS val_{metric}, COUNT({_validation(metric)}) AS val_seeds"
            f" FROM trials WHERE {where}"
            f" GROUP BY project, family, {current}, {config}, CASE WHEN {config} = '' THEN params || train || lookback END")
        return _with_stale(cursor)

    def member_trials(self, families: Sequence[str]) -> list[tuple[str, str, str]]:
        """(trial_id, project, status) of the file's trials of `families` as it is now (skipped ones aside): what a
        declared ensemble's row is checked against (campaign/results/ensembles.py)."""
        if not families:
            return []
        marks = ",".join("?" * len(families))
        return self.db.execute(f"SELECT trial_id, project, status FROM trials WHERE {self._column('current')} = 1 AND status != 'skipped'"
                               f" AND family IN ({marks})", list(families)).fetchall()

    def finished_rows(self) -> list[dict[str, Any]]:
        """Every finished trial (done, pruned or failed) of the file as it is now, in campaign order, with what an
        export to a tracking server records of it: its row, finish time, metrics, timings and epoch history (JSON
        decoded), its plan (what it trained with) and its validation scores (`val_<metric>`)."""
        provenance = ", ".join(f"{self._column(c)} AS {c}" for c in PROVENANCE_COLUMNS)
        validation = ", ".join(f"{_validation(m)} AS val_{m}" for m in METRICS)
        cursor = self.db.execute(
            f"SELECT {self._trial_columns()}, started_at, finished_at, metrics AS metrics_json, timings AS timings_json, history AS history_json, plan AS plan_json,"
            f" {validation}, {provenance} FROM trials WHERE status IN ('done', 'pruned', 'failed') AND {self._column('current')} = 1 ORDER BY position")
        rows = _with_stale(cursor)
        for row in rows:
            for name in ("metrics", "timings", "history", "plan"):
                text = row.pop(f"{name}_json")
                try:
                    row[name] = json.loads(text) if text else None
                except ValueError:  # an older store's NaN: not JSON
                    row[name] = None
        return rows

    def count(self, *, include_stale: bool = False) -> int:
        where = "" if include_stale else f" WHERE status != 'skipped' AND {self._column('current')} = 1"
        return int(self.db.execute(f"SELECT COUNT(*) FROM trials{where}").fetchone()[0])

    def frame(self, *, include_stale: bool = False) -> pd.DataFrame:
        """`records` as a DataFrame (the Python API, the report, csv/json/parquet)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.records(include_stale=include_stale), columns=frame_columns())

    def bases(self) -> dict[str, dict[str, Any]]:
        """base_id -> what the trials of one kind of one version of the file share."""
        if "bases" not in {name for (name,) in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}:
            return {}
        return {key: json.loads(base) for key, base in self.db.execute("SELECT base_id, base FROM bases")}

    def _trial_columns(self) -> str:
        """trial_columns() as SQL: a metric column an older store lacks (registered since) reads as NULL."""
        return ", ".join(name if name in self.columns or name not in METRICS else f"NULL AS {name}" for name in trial_columns())

    def _column(self, name: str) -> str:
        """`name`, or its default where an older store lacks it (readers never alter a store)."""
        if name in self.columns:
            return name
        default = PROVENANCE_COLUMNS[name].rsplit("DEFAULT ", 1)[1]
        return default

    def forecasts(self, trial_ids: Sequence[str], *, window: str = "test") -> dict[tuple[str, str], dict[str, Any]]:
        """(trial_id, project) -> origins (N,), forecast and truth (N, horizon) float32, (test window) mase_scale, and a
        quantile network's quantiles (N, horizon, Q) float32.
        `window` "val": the validation forecasts (none in a store written before they were kept)."""
        import numpy as np

        if window not in ("test", "val"):
            raise ValueError(f"unknown window {window!r}")
        table, scale = ("forecasts", "mase_scale") if window == "test" else ("val_forecasts", "NULL")
        if window == "val" and self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'val_forecasts'").fetchone() is None:
            return {}
        # a store written before quantiles were kept has no such column: its forecasts have none
        quantiles = "quantiles" if any(row[1] == "quantiles" for row in self.db.execute(f"PRAGMA table_info({table})")) else "NULL"
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for chunk in (trial_ids[i : i + 500] for i in range(0, len(trial_ids), 500)):  # SQLite's bound-variable limit
            marks = ",".join("?" * len(chunk))
            for trial_id, project, horizon, mase_scale, origins, forecast, truth, bands in self.db.execute(
                    f"SELECT trial_id, project, horizon, {scale}, origins, forecast, truth, {quantiles} FROM {table} WHERE trial_id IN ({marks})",
                    list(chunk)):
                out[(trial_id, project)] = {"origins": np.frombuffer(origins, np.int32),
                                            "forecast": np.frombuffer(forecast, np.float32).reshape(-1, horizon),
                                            "truth": np.frombuffer(truth, np.float32).reshape(-1, horizon),
                                            **({"mase_scale": mase_scale} if window == "test" else {}),
                                            **({"quantiles": np.frombuffer(bands, np.float32).reshape(len(origins) // 4, horizon, -1)} if bands else {})}
        return out

    def search_rows(self, trial_ids: Sequence[str], metric: str) -> dict[str, dict[str, Any]]:
        """trial_id -> {status, attempts, val (its validation `metric`, None without one), rungs ({epoch: score} a
        search's pruner saw)} of those of `trial_ids` the store holds: what a search replays (campaign/trials/search.py)."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}")
        out: dict[str, dict[str, Any]] = {}
        for chunk in (trial_ids[i : i + 500] for i in range(0, len(trial_ids), 500)):  # SQLite's bound-variable limit
            marks = ",".join("?" * len(chunk))
            for tid, status, attempts, val, rungs in self.db.execute(
                    f"SELECT trial_id, status, attempts, {_validation(metric)}, CASE WHEN json_valid(metrics) THEN json_extract(metrics, '$.rungs') END"
                    f" FROM trials WHERE trial_id IN ({marks})", list(chunk)):
                out[tid] = {"status": status, "attempts": attempts, "val": val if status in ("done", "pruned") else None,
                            "rungs": json.loads(rungs) if rungs else {}}
        return out

    def trial_details(self, trial_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT metrics, timings, plan, history, events, traceback FROM trials WHERE trial_id = ?", (trial_id,)).fetchone()
        if row is None:
            return None
        keys = ("metrics", "timings", "plan", "history", "events")
        details = {key: json.loads(value) if value else None for key, value in zip(keys, row[:5], strict=True)}
        details["traceback"] = row[5]
        return details


def _validation(metric: str) -> str:
    """SQL of a trial's validation `metric` (None without one; older stores' metrics may hold NaN, which is not JSON)."""
    return f"CASE WHEN json_valid(metrics) THEN json_extract(metrics, '$.val.{metric}') END"


def _with_stale(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    """The cursor's rows as dicts, its `current` column read as `stale` (a trial of an earlier file or data)."""
    names = [column[0] for column in cursor.description]
    out = []
    for row in cursor:
        record = dict(zip(names, row, strict=True))
        record["stale"] = record.pop("current") == 0
        out.append(record)
    return out
