"""A campaign in MLflow: one experiment per campaign, one run per finished trial, the report as an artifact.

`export_mlflow` copies what the store holds to a tracking server through MLflow's client (`MlflowClient`): each
finished trial (done, pruned or failed) becomes a run, nested under one "campaign" run that holds the report. A
trial's run carries its configuration as params (family, grid point, train overrides, lookback, seed, project, data
fingerprint), every stored metric (test and validation scores, the naive baseline, seconds) and its per-epoch
curves, and tags saying its status, lane, pack and trial id.

The trial id is the key: exporting twice, or a resumed campaign exporting again, creates no second run of a trial.
A trial trained again (retried after a failure, its data changed) has a new finish time: its old run is deleted and
a new one made, so the server shows what the store holds.

During a run, `follow` is the child process campaign/run/tracking.py's Follower starts: it exports every few seconds and
writes each pass's outcome to WORKDIR/tracking-mlflow.json. (This module sits above campaign/ and report/: it
reads the store and writes the report; the campaign only starts it, by its command line.)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from gpufill.campaign.results.provenance import with_effective_train
from gpufill.campaign.store.store import METRICS, Store
from gpufill.campaign.run.tracking import STATE_FILE
from gpufill.engine.loggers import mlflow_experiment
from gpufill.errors import InputError
from gpufill.files import write_atomically

__all__ = ["Exported", "client_for", "export_mlflow", "follow", "unreachable"]

KEY_TAG = "gpufill.trial_id"
RESULT_TAG = "gpufill.finished_at"
"""A trial's finish time as exported, set once its run is complete: another value in the store means it was trained
again; none means its export was cut off (the server went away): either way the run is made again."""
KIND_TAG = "gpufill.kind"
RUN_STATUS = {"done": "FINISHED", "pruned": "KILLED", "failed": "FAILED"}
FOLLOW_EVERY_S = 5.0
"""Seconds between a following export's passes, once the run has gone on for a while..."""
FIRST_EVERY_S = 1.0
"""...and its first passes 1 s, 2 s, ... apart."""
BATCH = {"metrics": 850, "params": 99, "tags": 100}
"""MLflow's log_batch limits (1000 items, 100 params and tags per call), with room to spare: a batch of metrics, one of
params and the finish-time tag travel as one call."""


@dataclass(frozen=True, slots=True)
class Exported:
    uri: str
    experiment: str
    finished: int
    """Finished trials in the store."""
    created: int
    replaced: int
    """Runs deleted and made again: their trial was trained again since, or their export was cut off."""
    already: int
    refused: list[str] = field(default_factory=list)
    """Trials MLflow refused (a param it does not take): trial id and its answer, each skipped, the others sent."""

    @property
    def held(self) -> int:
        """Finished trials of this campaign MLflow holds after this pass."""
        return self.created + self.already

    def line(self) -> str:
        line = (f"{self.held} of {self.finished} finished trials in MLflow at {self.uri}, experiment {self.experiment!r}: {self.created} runs made"
                f"{f' ({self.replaced} of them replacing a copy that was cut off or older)' if self.replaced else ''}, {self.already} already there")
        if self.refused:
            line += f"; {len(self.refused)} refused by MLflow (first: {self.refused[0]})"
        return line


def client_for(uri: str) -> Any:
    """MLflow's client for `uri`, or one line naming the extra to install."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise InputError("tracking to MLflow needs the mlflow package", where=uri, field="tracking.mlflow",
                         fix="pip install 'gpufill[mlflow]'") from None
    return MlflowClient(tracking_uri=uri)


def export_mlflow(workdir: str | os.PathLike[str], uri: str, *, experiment: str | None = None, report: bool = True,
                  lock_wait_s: float = 120.0) -> Exported:
    """Copy every finished trial of the campaign at `workdir` to MLflow at `uri` (idempotent: the trial id is the key).
    Raises what the client raises when the server cannot be reached (`unreachable` words it)."""
    workdir = Path(workdir)
    client = client_for(uri)
    Store.open(workdir).close()  # no store there: one line before the lock file is made
    with exporting(workdir, wait_s=lock_wait_s):  # one export at a time: two would both see a trial missing
        store = Store.open(workdir)  # read under the lock: a later pass never overwrites a newer result with an older one
        try:
            name = experiment or _spec_experiment(store) or store.meta("campaign_name") or workdir.name
            rows = with_effective_train(store.finished_rows(), store.bases())  # the settings each trained with, as results show
            intervals = _interval_metrics(store) if report else {}
        finally:
            store.close()
        # The report renders (CPU) in a thread while the trials' runs are sent (waits on the server): a tracked run's
        # last pass. Written to a temporary folder, never into the workdir.
        with contextlib.ExitStack() as stack:
            rendering = None
            if report:
                from gpufill.report import write_report

                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpufill-report-"))
                rendering = stack.enter_context(ThreadPoolExecutor(1, "gpufill-report")).submit(write_report, workdir, Path(folder) / "report.html")
            experiment_id = mlflow_experiment(client, uri, name, {KIND_TAG: "campaign"})
            present = _present(client, experiment_id)
            parent = present.pop(None, None) or _campaign_run(client, experiment_id, name)
            created = replaced = already = 0
            refused: list[str] = []
            for row in rows:
                old = present.get(row["trial_id"])
                if old is not None and old[1] == _finished(row):
                    already += 1
                    continue
                if old is not None:
                    client.delete_run(old[0])
                    replaced += 1
                try:
                    _log_trial(client, experiment_id, parent, row)
                except Exception as error:  # noqa: BLE001 - MLflow refused this trial: skipped, the others still go
                    if no_answer(error):
                        raise
                    refused.append(f"{row['trial_id']}: {_first_line(error)}")
                    continue
                created += 1
            if rendering is not None:  # the campaign run: its report and its trials' statuses, ended (a later export adds to them)
                client.log_artifact(parent, str(rendering.result()))
                _log_counts(client, parent, rows, intervals)
                client.set_terminated(parent, status="FINISHED")
    return Exported(uri, name, len(rows), created, replaced, already, refused)


LOCK_FILE = "tracking-mlflow.lock"


@contextlib.contextmanager
def exporting(workdir: Path, *, wait_s: float) -> Iterator[None]:
    """Hold the workdir's export lock (a resumed run's follower may start while the killed run's still makes its last
    pass); InputError after `wait_s` seconds of another export holding it."""
    import fcntl

    from gpufill.files import open_lock

    descriptor = open_lock(workdir / LOCK_FILE, field="tracking")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise InputError(f"another export to MLflow from this workdir is still running after {wait_s:.0f} s", where=str(workdir),
                                     field="tracking", fix="wait for it (a run's follower makes a last pass when the run ends), then export again") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def unreachable(error: BaseException, uri: str) -> str:
    """One line for a failed export: "did not answer" only where no answer came (a connection refused or timed out),
    else what MLflow answered; the client's words, first line only."""
    if no_answer(error):
        return f"MLflow at {uri} did not answer ({type(error).__name__}: {_first_line(error)})"
    return f"MLflow at {uri} refused the export ({type(error).__name__}: {_first_line(error)})"


def no_answer(error: BaseException) -> bool:
    """Whether `error` (or what it wraps: MLflow's client re-raises a connection failure as its own exception) is a
    connection that failed or timed out, not an answer: requests' errors are OSErrors."""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, OSError):  # TimeoutError and requests' errors included
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


# -- following a run -------------------------------------------------------------------------------------
def follow(workdir: str | os.PathLike[str], uri: str, *, experiment: str | None = None, every_s: float = FOLLOW_EVERY_S) -> int:
    """A tracked run's follower (campaign/run/tracking.py): imports what exporting needs at once, while the run
    prepares; on the run's "go" line its output goes to WORKDIR/logs/tracking.log and it exports every `every_s`
    seconds until stdin closes (the run ended, or was killed), then once more with the report; each pass's outcome in
    WORKDIR/tracking-mlflow.json. Never raises for a server that is down. Stdin closed before "go" (the run was
    refused before its store existed): it ends, having written nothing. It ends without the interpreter's teardown
    (MLflow's exit hooks: ~1 s that the run would wait for)."""
    import mlflow.tracking  # noqa: F401 - the client's imports, while the run prepares
    import gpufill.report  # noqa: F401 - the last pass's report: matplotlib and pandas, ~1 s of a 2-core box

    if not sys.stdin.readline():
        _end(0)
    workdir = Path(workdir)
    _log_to(workdir / "logs" / "tracking.log")
    ended = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), ended.set()), daemon=True).start()
    passes = 0
    while True:
        last = ended.is_set()
        _pass(workdir, uri, experiment, report=last)
        if last:
            _end(0)
        passes += 1
        # 1 s, 2 s, ... up to `every_s` apart: a run of seconds has its trials sent before its end, not in its last pass.
        ended.wait(min(every_s, passes * FIRST_EVERY_S))


def _log_to(path: Path) -> None:
    """This process's stdout and stderr appended to `path` (a link refused as everywhere)."""
    from gpufill.files import open_append

    with contextlib.suppress(InputError, OSError):  # no log file: the passes' outcomes still go to the state file
        with open_append(path, field="tracking") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)


def _end(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _pass(workdir: Path, uri: str, experiment: str | None, *, report: bool) -> None:
    state: dict[str, Any] = {"uri": uri, "at": time.time(), "final": report}
    try:
        # A pass waits little for another export's lock (a killed run's follower making its last pass): the next tries again.
        state.update(asdict(export_mlflow(workdir, uri, experiment=experiment, report=report, lock_wait_s=60.0 if report else 5.0)), error=None)
    except InputError as error:  # the lock held too long, the store gone: said, tried again next pass
        state["error"] = error.one_line()
    except Exception as error:  # noqa: BLE001 - a server down or refusing: said in the state, tried again next pass
        state["error"] = unreachable(error, uri)
    write_atomically(workdir / STATE_FILE, json.dumps(state) + "\n", field="tracking")


# -- what a run holds -------------------------------------------------------------------------------------
def _present(client: Any, experiment_id: str) -> dict[str | None, Any]:
    """trial id -> (run id, finished-at tag) of the experiment's live runs; None -> the campaign run's id."""
    found: dict[str | None, Any] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            if tags.get(KIND_TAG) == "campaign":
                found[None] = run.info.run_id
            elif KEY_TAG in tags:
                found[tags[KEY_TAG]] = (run.info.run_id, tags.get(RESULT_TAG))
        token = page.token
        if not token:
            return found


def _campaign_run(client: Any, experiment_id: str, name: str) -> str:
    run = client.create_run(experiment_id, run_name=f"campaign {name}", tags={KIND_TAG: "campaign"})
    return run.info.run_id


def _finished(row: Mapping[str, Any]) -> str:
    return repr(row["finished_at"])


def _log_trial(client: Any, experiment_id: str, parent: str, row: Mapping[str, Any]) -> None:
    from mlflow.entities import Metric, Param, RunTag

    started = int((row["started_at"] or row["finished_at"] or time.time()) * 1000)
    ended = int((row["finished_at"] or time.time()) * 1000)
    timings = row["timings"] or {}
    tags = {KEY_TAG: row["trial_id"], "gpufill.status": row["status"], "gpufill.lane": str(row["lane"]),
            "gpufill.pack_size": str(timings.get("pack_size", 1)), "gpufill.config_id": row["config_id"], "mlflow.parentRunId": parent}
    if row["error"]:
        tags["gpufill.error"] = str(row["error"]).splitlines()[0][:500]
    run = client.create_run(experiment_id, start_time=started, run_name=f"{row['family']} {row['project']} seed {row['seed']}", tags=tags)
    client.set_terminated(run.info.run_id, status=RUN_STATUS[row["status"]], end_time=ended)
    params = [Param(key, value[:6000]) for key, value in _params(row).items()]
    metrics = [Metric(key, value, ended, step) for key, value, step in _metrics(row)]
    batches = list(itertools.zip_longest(_chunks(metrics, BATCH["metrics"]), _chunks(params, BATCH["params"]), fillvalue=())) or [((), ())]
    for index, (some_metrics, some_params) in enumerate(batches, start=1):
        # The finish-time tag travels with the last batch (a batch is one transaction on the server): a run cut off
        # before it lacks the tag and is made again by the next export. Three requests a trial, not five.
        done = [RunTag(RESULT_TAG, _finished(row))] if index == len(batches) else []
        client.log_batch(run.info.run_id, metrics=list(some_metrics), params=list(some_params), tags=done)


EFFECTIVE = ("effective_batch", "micro_batch", "precision", "threads", "compile", "pack_size", "optimizer")
"""Plan choices a trial's run records as `effective.*`: what it trained with, beside the settings it asked for."""


def _params(row: Mapping[str, Any]) -> dict[str, str]:
    """The trial's configuration: who it is, its grid point and train settings under their own names (as requested:
    what the campaign file and `gpufill results` say), and `effective.*`, what it trained with (the plan's choices, the
    learning rate after the plan's scaling)."""
    found = {"family": row["family"], "project": row["project"], "lookback": str(row["lookback"]), "seed": str(row["seed"]),
             "kind": row["kind"], "data_fingerprint": row["data_fingerprint"], "config_id": row["config_id"]}
    train = json.loads(row["train"]) if row["train"] else {}
    for prefix, values in (("", json.loads(row["params"]) if row["params"] else {}), ("train.", train)):
        for key, value in values.items():
            found.setdefault(param_key(f"{prefix}{key}"), json.dumps(value) if not isinstance(value, str) else value)
    plan = row.get("plan") or {}
    if isinstance(plan, str):
        plan = json.loads(plan)
    for name in EFFECTIVE:
        if isinstance(plan.get(name), dict):
            found[f"effective.{name}"] = str(plan[name].get("value"))
    scale = (plan.get("lr_scale") or {}).get("value") if isinstance(plan.get("lr_scale"), dict) else None
    if _finite(train.get("lr")) and _finite(scale):
        found["effective.lr"] = f"{float(train['lr']) * float(scale):.6g}"
    return found


def param_key(key: str) -> str:
    """`key` as MLflow takes it: letters, digits and `_-. /` only, no `..` (a path's escape), at most 250 characters
    (a user's factory can take any keyword: one MLflow refuses would stop the trial's whole export)."""
    cleaned = "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key).replace("..", "__").strip("/") or "_"
    return cleaned[:250]


def _metrics(row: Mapping[str, Any]) -> Iterator[tuple[str, float, int]]:
    """(key, value, step): the test and validation scores, the naive baseline, seconds, then per-epoch curves."""
    for name in (*METRICS, "naive_mae", *(f"val_{m}" for m in METRICS), "duration_s"):
        if _finite(row.get(name)):
            yield name, float(row[name]), 0
    for record in row["history"] or []:
        for name in ("train_loss", "val_loss", "lr", "seconds"):
            if _finite(record.get(name)):
                yield f"epoch_{name}", float(record[name]), int(record["epoch"])
    for epoch, value in ((row["metrics"] or {}).get("rungs") or {}).items():  # a search's pruner: its scores at the rungs
        if _finite(value):
            yield "rung_score", float(value), int(epoch)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _log_counts(client: Any, run_id: str, rows: Sequence[Mapping[str, Any]], intervals: Mapping[str, float] | None = None) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    statuses = [row["status"] for row in rows]
    client.log_batch(run_id, metrics=[*(Metric(f"trials_{status}", statuses.count(status), now, 0) for status in RUN_STATUS),
                                      *(Metric(key, value, now, 0) for key, value in (intervals or {}).items())])


def _interval_metrics(store: Store) -> dict[str, float]:
    """The campaign run's interval scores: how `gpufill forecast`'s intervals covered the test windows, which never
    calibrate them (interval_coverage_80, interval_msis_80, ...; none without validation windows or a finished trial)."""
    from gpufill.campaign.future.forecast import held_out, interval_scores
    from gpufill.errors import InputError

    try:
        scores = interval_scores(held_out(store))
    except InputError:  # nothing finished yet, or a declared ensemble combined from other trials
        return {}
    return {f"interval_{what}_{level:g}": float(score[what]) for level, score in scores.items() for what in ("coverage", "msis")
            if score[what] is not None}


def _spec_experiment(store: Store) -> str | None:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        return (json.loads(store.meta("spec") or "{}").get("tracking") or {}).get("experiment")
    return None
