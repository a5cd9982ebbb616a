"""Reading a workdir's store: what `status`, `results`, `report` and `monitor` show.

Kept apart from the runner so that these commands import only SQLite and pandas (not torch, the spec
or the executors): they answer in well under a second, even from a 36,000-trial store.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufill.campaign.store import DB_NAME, FRAME_COLUMNS, Counts, Store
from gpufill.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["best_configurations", "best_per_project", "find_workdir", "read_jobs", "read_results", "read_best", "read_status", "read_trial_records", "read_trials"]


def read_status(workdir: str | Path) -> Counts:
    store = Store.open(workdir)
    try:
        return store.counts()
    finally:
        store.close()


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
    columns = [*FRAME_COLUMNS, *(["differs"] if include_stale else [])]
    return pd.DataFrame.from_records(records, columns=columns)


def read_trial_records(workdir: str | Path, *, include_stale: bool = False, limit: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """`read_trials` as dicts, the first `limit` only (and how many there are): what the CLI's table needs, without pandas."""
    from gpufill.campaign.provenance import describe_stale, with_effective_train

    store = Store.open(workdir)
    try:
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


def summary_columns(metric: str = "mae", *, stale: bool = False) -> list[str]:
    return ["project", "family", "params", "train", "lookback", *(["stale"] if stale else []), metric, f"vs_{REFERENCE}", "seeds", "config_id"]


def read_best(workdir: str | Path, *, include_stale: bool = False, metric: str = "mae") -> list[dict[str, Any]]:
    """`best_configurations` computed by SQLite from the store (what `results --summary` prints)."""
    from gpufill.campaign.provenance import with_effective_train

    store = Store.open(workdir)
    try:
        means, bases = store.config_means(metric, include_stale=include_stale), store.bases()
    finally:
        store.close()
    return _pick_best(with_effective_train(means, bases), metric)


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
                                        "config_id": record["config_id"]})
        group[metric] += float(value)
        group["seeds"] += 1
    for group in groups.values():
        group[metric] /= group["seeds"]
    return _pick_best(list(groups.values()), metric)


def _pick_best(configurations: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for group in configurations:
        slot = (group["project"], group["family"], bool(group["stale"]))
        if slot not in best or group[metric] < best[slot][metric]:
            best[slot] = group
    # Each row's metric over the seasonal naive's on the same project (None where the campaign has no snaive).
    references = {(g["project"], g["stale"]): g[metric] for g in best.values() if g["family"] == REFERENCE}
    for group in best.values():
        reference = references.get((group["project"], group["stale"]))
        group[f"vs_{REFERENCE}"] = group[metric] / reference if reference else None
    return sorted(best.values(), key=lambda g: (g["project"], g["stale"], g[metric]))


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
