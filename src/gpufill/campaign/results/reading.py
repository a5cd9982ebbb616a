"""Reading a workdir's store: what `status`, `results`, `report` and `monitor` show.

Kept apart from the runner so that these commands import only SQLite and pandas (not torch, the spec
or the executors): they answer in well under a second, even from a 36,000-trial store.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufill.campaign.store.lock import holder
from gpufill.campaign.store.store import DB_NAME, Counts, Store, frame_columns
from gpufill.campaign.store.store_health import check_rows
from gpufill.errors import InputError
from gpufill.forecasting.trial import GLOBAL_PROJECT, METRICS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["best_configurations", "best_per_project", "find_workdir", "read_jobs", "read_results", "read_best", "read_status", "read_trial_records",
           "read_trials", "run_state", "stopped_line", "with_run"]


def read_status(workdir: str | Path) -> Counts:
    """Trial counts, and the latest run's state. A run whose scheduler is gone (killed) is "interrupted", and the
    trials it left `running` count as pending (a re-run retries them), `interrupted` saying how many."""
    store = Store.open(workdir)
    try:
        return with_run(store.counts(), run_state(workdir, store))
    finally:
        store.close()


def run_state(workdir: str | Path, store: Store) -> dict[str, Any]:
    """The latest run: {"state", "run_id", "started_at", "pid", "host", "detail", "resume"}. Whether a run is alive is the
    workdir lock's answer (campaign/store/lock.py: the kernel releases it however its holder ends): a run the store still
    calls running while no process holds the lock was killed, and shows as "interrupted"."""
    alive = holder(workdir) is not None  # read before the store: a run that ends meanwhile has written its end first
    run = store.last_run()
    record = {key: (run or {}).get(key) for key in ("run_id", "started_at", "pid", "host")}
    record["resume"] = f"gpufill run {store.meta('campaign_file') or 'CAMPAIGN.yaml'} --workdir {workdir}"
    if alive:
        return {**record, "state": "running", "detail": ""}
    if run is None:
        return {**record, "state": "none", "detail": "no run has started here"}
    if run["status"] != "running":
        return {**record, "state": run["status"], "detail": ""}
    if holder(workdir) is not None:  # a new run took the lock and began between the two reads
        return {**record, "state": "running", "detail": ""}
    return {**record, "state": "interrupted",
            "detail": f"run {run['run_id']} (pid {run['pid']} on {run['host']}) stopped without finishing: no process holds the workdir lock"}


def stopped_line(run: dict[str, Any], interrupted: int) -> str:
    """What `status` and `monitor` say of an interrupted run: that it is not running, what it left, how to resume."""
    what = run["detail"] or f"run {run['run_id']} was interrupted"
    left = f"; {interrupted} trials it was running count as pending" if interrupted else ""
    return f"not running: {what}{left}; resume with: {run['resume']}"


def with_run(counts: Counts, run: dict[str, Any]) -> Counts:
    """`counts` with the latest run's state; when no run is alive, its `running` trials are pending (a re-run
    retries them) and `interrupted` says how many."""
    if run["state"] in ("running", "none") or not counts.total["running"]:  # "none": no run recorded (nothing to say it died)
        return dataclasses.replace(counts, run=run)
    total = dict(counts.total)
    total["pending"] += total["running"]
    interrupted, total["running"] = total["running"], 0
    lanes = {lane: {**c, "pending": c["pending"] + c["running"], "running": 0} for lane, c in counts.lanes.items()}
    return dataclasses.replace(counts, total=total, lanes=lanes, interrupted=interrupted, run=run)


def read_jobs(workdir: str | Path) -> list[dict[str, Any]]:
    """Batch jobs (Slurm) queued or running, oldest first: what `gpufill status` lists."""
    store = Store.open(workdir)
    try:
        return store.jobs(states=("queued", "running"))
    finally:
        store.close()


def read_results(workdir: str | Path) -> pd.DataFrame:
    return read_trials(workdir)


def read_trials(workdir: str | Path, *, include_stale: bool = False) -> pd.DataFrame:
    """One row per trial of the campaign file as it is now, `train` holding the settings it trained with;
    `include_stale`: also the store's trials of earlier versions of the file or data, with what differs."""
    import pandas as pd

    records, _total = read_trial_records(workdir, include_stale=include_stale)
    columns = [*frame_columns(), *(["differs"] if include_stale else [])]
    return pd.DataFrame.from_records(records, columns=columns)


def read_trial_records(workdir: str | Path, *, include_stale: bool = False, limit: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """`read_trials` as dicts, the first `limit` only (and how many there are): what the CLI's table needs, without pandas."""
    from gpufill.campaign.results.provenance import describe_stale, with_effective_train

    store = Store.open(workdir)
    try:
        check_rows(store.db, store.path)  # a row edited or damaged: one line naming it
        bases = store.bases()
        if include_stale:  # what differs is found among all the rows
            records = describe_stale(with_effective_train(store.records(include_stale=True), bases), bases)
            return records[:limit] if limit is not None else records, len(records)
        total = store.count() if limit is not None else None
        records = with_effective_train(store.records(limit=limit), bases)
        return records, total if total is not None else len(records)
    finally:
        store.close()


def best_per_project(results: pd.DataFrame, metric: str = "mae") -> pd.DataFrame:
    """`best_configurations` of a results frame, as a frame."""
    import pandas as pd

    stale = "differs" in results.columns
    return pd.DataFrame.from_records(best_configurations(results.to_dict("records"), metric), columns=summary_columns(metric, stale=stale))


REFERENCE = "snaive"
"""The family every summary row is also measured against (a ratio below 1 beats it): what practitioners read."""
REFERENCES = (REFERENCE, "ets", "comb")
"""Each gives a summary row a `vs_<family>` ratio where the campaign has it: the seasonal naive (the floor every
forecaster must clear), AutoETS (the statistical line a learned model has to beat to be worth its cost) and the
statistical combination (the mean of AutoETS, Theta and AutoTheta: what a learned ensemble has to beat)."""


def summary_columns(metric: str = "mae", *, stale: bool = False) -> list[str]:
    return ["project", "family", "params", "train", "lookback", *(["stale"] if stale else []), metric, f"val_{metric}",
            *(f"vs_{family}" for family in REFERENCES), "seeds", "chosen_on", "config_id"]


CHOSEN_ON_VALIDATION = "val"
CHOSEN_ON_TEST = "test"
"""(no validation window: set task.split.val to choose without the test; the summary's title says so)"""
"""How a summary row's configuration was chosen among its family's: on the validation window where every candidate has
one (the test score shown is then an honest estimate), else on the test window, and the row says so."""


def campaign_metric(workdir: str | Path) -> str:
    """The campaign's task.metric, as stored with its spec: what its results rank by (mae where the store does not say)."""
    store = Store.open(workdir)
    try:
        return stored_metric(store)
    finally:
        store.close()


def stored_metric(store: Store) -> str:
    """`campaign_metric` of an open store."""
    try:
        metric = json.loads(store.meta("spec") or "{}").get("task", {}).get("metric")
    except (ValueError, AttributeError):
        metric = None
    return metric if metric in METRICS else "mae"


def read_best(workdir: str | Path, *, include_stale: bool = False, metric: str = "mae") -> list[dict[str, Any]]:
    """`best_configurations` computed by SQLite from the store (what `results --summary` prints)."""
    from gpufill.campaign.results.ensembles import read_declared

    store = Store.open(workdir)
    try:
        check_rows(store.db, store.path)
        best = store_best(store, metric, include_stale=include_stale)
        declared = read_declared(store, include_stale=include_stale)
    finally:
        store.close()
    return with_declared(best, declared, metric)


def store_best(store: Store, metric: str = "mae", *, include_stale: bool = False) -> list[dict[str, Any]]:
    """`best_configurations` of an open store, its means computed by SQLite (declared ensembles left out)."""
    from gpufill.campaign.results.provenance import with_effective_train

    return _pick_best(with_effective_train(store.config_means(metric, include_stale=include_stale), store.bases()), metric)


def with_declared(best: list[dict[str, Any]], declared: list[dict[str, Any]], metric: str = "mae") -> list[dict[str, Any]]:
    """The summary's rows with the declared ensemble's beside them (one per project: all its members, no choice made;
    a stale one marked stale, a partial one's family saying "4 of 8 members")."""
    from gpufill.campaign.results.ensembles import members_shown

    if not declared:
        return best
    if best and all(g["project"] == GLOBAL_PROJECT for g in best):
        declared = _pooled(declared, metric)
    references = {family: {g["project"]: g[metric] for g in best if g["family"] == family and not g["stale"]} for family in REFERENCES}
    rows = [*best]
    for row in declared:
        stale = bool(row.get("stale"))
        ratios = {f"vs_{family}": None if stale or not by_project.get(row["project"]) else row[metric] / by_project[row["project"]]
                  for family, by_project in references.items()}
        members = members_shown(row)
        family = f"ensemble ({row['combine']}{'' if members == str(row['members']) else f'; {members}'})"
        rows.append({"project": row["project"], "family": family, "params": json.dumps({"members": row["families"]}),
                     "train": "{}", "lookback": ",".join(map(str, row["lookbacks"])), "stale": stale, metric: row[metric], f"val_{metric}": None,
                     **ratios, "seeds": row["members"], "chosen_on": "all",
                     "config_id": ""})
    return sorted(rows, key=lambda g: (g["project"], g["stale"], g[metric]))


def _pooled(declared: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """A global campaign's declared ensemble as one row (and one stale row), as its families' rows are: the mean
    over projects of each project's score, as a global trial's score is (forecasting/run.py: `run_global`)."""
    import statistics

    pooled = []
    for stale in (False, True):
        rows = [row for row in declared if bool(row.get("stale")) == stale]
        if rows:
            expected = [row.get("expected") for row in rows]
            padded = [sum(entry.get("reason") == "padded" for entry in row.get("left_out") or []) for row in rows]
            pooled.append({**rows[0], "project": GLOBAL_PROJECT, "stale": stale, metric: statistics.fmean(row[metric] for row in rows),
                           # members sat out a short series only (ensemble.padded): counted as members, the series said apart
                           "members": min(row["members"] + count for row, count in zip(rows, padded, strict=True)),
                           "left_out": [entry for entry in rows[0].get("left_out") or [] if entry.get("reason") != "padded"],
                           "padded_series": sum(count > 0 for count in padded), "expected": None if None in expected else max(expected),
                           "families": sorted({f for row in rows for f in row["families"]}),
                           "lookbacks": sorted({lb for row in rows for lb in row["lookbacks"]})})
    return pooled


def best_configurations(records: list[dict[str, Any]], metric: str = "mae") -> list[dict[str, Any]]:
    """Per project and family: the configuration with the best mean test metric over its seeds (and, among
    stale rows, the best stale one beside it).

    A configuration is everything but the seed (config_id: data, task, train settings, params,
    lookback), so trials of another version of the file or data never average together."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for record in records:
        value = record[metric]
        if record["status"] != "done" or value is None or value != value:  # a NaN metric (older stores) ranks nothing
            continue
        # Rows of stores older than config ids: their identity is what the row says.
        config = record["config_id"] or f"{record['params']}|{record['train']}|{record['lookback']}"
        key = (record["project"], record["family"], bool(record["stale"]), config)
        group = groups.setdefault(key, {"project": record["project"], "family": record["family"], "params": record["params"], "train": record["train"],
                                        "lookback": record["lookback"], "stale": bool(record["stale"]), metric: 0.0, "seeds": 0,
                                        "config_id": record["config_id"], f"val_{metric}": 0.0, "val_seeds": 0})
        group[metric] += float(value)
        group["seeds"] += 1
        val = record.get(f"val_{metric}")
        if val is not None and val == val:
            group[f"val_{metric}"] += float(val)
            group["val_seeds"] += 1
    for group in groups.values():
        group[metric] /= group["seeds"]
        group[f"val_{metric}"] = group[f"val_{metric}"] / group["val_seeds"] if group["val_seeds"] else None
    return _pick_best(list(groups.values()), metric)


def _pick_best(configurations: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Per project and family, the configuration chosen on the validation window where every candidate has one
    (never on the test window the row then shows), else on the test window; `chosen_on` says which."""
    slots: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for group in configurations:
        slots.setdefault((group["project"], group["family"], bool(group["stale"])), []).append(group)
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for slot, candidates in slots.items():
        on_validation = all(c.get(f"val_{metric}") is not None for c in candidates)
        rank = f"val_{metric}" if on_validation else metric
        chosen = min(candidates, key=lambda c: c[rank])
        best[slot] = {**{k: v for k, v in chosen.items() if k != "val_seeds"}, "chosen_on": CHOSEN_ON_VALIDATION if on_validation else CHOSEN_ON_TEST}
    # Each row's metric over each reference's on the same project (None where the campaign has not that family).
    for family in REFERENCES:
        references = {(g["project"], g["stale"]): g[metric] for g in best.values() if g["family"] == family}
        for group in best.values():
            reference = references.get((group["project"], group["stale"]))
            group[f"vs_{family}"] = group[metric] / reference if reference else None
    return sorted(best.values(), key=lambda g: (g["project"], g["stale"], g[metric]))


def winners(best: list[dict[str, Any]], metric: str = "mae") -> list[dict[str, Any]]:
    """Each project's best configuration across families, one row per project, from the per-family rows of
    `best_configurations` (the file as it is now; declared ensembles left out), with the runner-up family.

    Ranked on the validation window where every family's row has a validation score (every family is scored on it:
    networks, classical and statistical models alike, each fitted on the train part for it), so the test score a
    row shows is an honest estimate of the choice; else on the test window, and `chosen_on` says "test".
    `runner_up_by`: how much worse the runner-up is on what the ranking read."""
    by_project: dict[str, list[dict[str, Any]]] = {}
    for row in best:
        if not row.get("stale") and not str(row["family"]).startswith("ensemble ("):
            by_project.setdefault(row["project"], []).append(row)
    rows = []
    for project in sorted(by_project):
        candidates = by_project[project]
        on_validation = all(r.get(f"val_{metric}") is not None and r.get("chosen_on") == CHOSEN_ON_VALIDATION for r in candidates)
        key = f"val_{metric}" if on_validation else metric
        ranked = sorted(candidates, key=lambda r: r[key])
        runner_up = ranked[1] if len(ranked) > 1 else None
        worse = runner_up[key] / ranked[0][key] - 1 if runner_up is not None and ranked[0][key] else None
        rows.append({**ranked[0], "families": len(ranked), "chosen_on": CHOSEN_ON_VALIDATION if on_validation else CHOSEN_ON_TEST,
                     "runner_up": None if runner_up is None else runner_up["family"],
                     f"runner_up_{metric}": None if runner_up is None else runner_up[metric], "runner_up_by": worse})
    return rows


def find_workdir(explicit: str | Path | None, candidates: Sequence[Path] | None = None) -> Path:
    """--workdir, else the current directory if it holds a store, else the one gpufill-* workdir here."""
    if explicit is not None:
        return Path(explicit)
    if (Path.cwd() / DB_NAME).exists():
        return Path.cwd()
    found = sorted(p.parent for p in (candidates or Path.cwd().glob(f"gpufill-*/{DB_NAME}")))
    if len(found) == 1:
        return found[0]
    listed = ", ".join(str(p) for p in found) or "none here"
    raise InputError(f"which campaign? workdirs found: {listed}", where=str(Path.cwd()), field="--workdir", fix="pass --workdir DIR")
