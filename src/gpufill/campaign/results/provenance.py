"""What produced each result row: its full effective configuration, and for a stale row, what differs from
the campaign file as it is now.

The store keeps per row what varies (project, family, params, train overrides, seed, lookback, the data
fingerprint) and once per `base_id` what every trial of a kind shared (data and task settings, the train
section). Here the two are put back together, for the results table, the summary and `results --all`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["describe_stale", "with_effective_train"]

_MAX_DIFFERENCES = 3


def with_effective_train(records: list[dict[str, Any]], bases: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """`train` becomes the settings each trial trained with: the file's train section with the trial's
    overrides on top (neural; a classical model has none). Unique pairs are merged once: fast on 36k rows."""
    merged: dict[tuple[str, str], str] = {}
    for record in records:
        key = (record["base_id"], record["train"])
        if key not in merged:
            section = bases.get(key[0], {}).get("train_spec")
            merged[key] = key[1] if section is None else json.dumps({**section, **json.loads(key[1])}, sort_keys=True, separators=(",", ":"))
        record["train"] = merged[key]
    return records


def describe_stale(records: list[dict[str, Any]], bases: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A `differs` entry: for each stale row, how its configuration differs from the nearest one of the
    current file (same project and family), e.g. "data of p000 changed; train.epochs 10 -> 40"."""
    candidates: dict[tuple[str, str], dict[str, tuple[dict[str, Any], set[int]]]] = {}
    for record in records:
        if not record["stale"]:
            options = candidates.setdefault((record["project"], record["family"]), {})
            if record["config_id"] not in options:
                options[record["config_id"]] = (_flat(record, bases), set())
            options[record["config_id"]][1].add(int(record["seed"]))
    projects = {project for project, _family in candidates}
    families = {family for _project, family in candidates}
    described: dict[tuple[Any, ...], str] = {}
    for record in records:
        if not record["stale"]:
            record["differs"] = ""
            continue
        key = tuple(record[name] for name in ("project", "family", "config_id", "base_id", "params", "train", "lookback", "seed", "data_fingerprint"))
        if key not in described:
            options = list(candidates.get((record["project"], record["family"]), {}).values())
            described[key] = _difference(record, bases, options, projects, families)
        record["differs"] = described[key]
    return records


def _difference(row: Mapping[str, Any], bases: Mapping[str, dict[str, Any]], options: list[tuple[dict[str, Any], set[int]]],
                projects: set[str], families: set[str]) -> str:
    if row["project"] not in projects and row["project"] != "*":
        return f"project {row['project']} is not in the data now"
    if row["family"] not in families:
        return f"{row['family']} is not in the file now"
    if not options:
        return f"{row['family']} on {row['project']} is not in the file now"
    mine = _flat(row, bases)
    best_changes, best_seeds = min(((_changes(mine, flat), seeds) for flat, seeds in options), key=lambda pair: len(pair[0]))
    words = [_describe(key, old, new, row["project"]) for key, old, new in best_changes[:_MAX_DIFFERENCES]]
    if len(best_changes) > _MAX_DIFFERENCES:
        words.append(f"{len(best_changes) - _MAX_DIFFERENCES} more")
    if not best_changes and int(row["seed"]) not in best_seeds:
        words.append(f"seed {int(row['seed'])} is not in the file now")
    return "; ".join(words) or "an earlier version of this configuration"


def _flat(row: Mapping[str, Any], bases: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The row's configuration as dotted keys (seed aside: seeds are compared as a set)."""
    base = bases.get(row["base_id"], {})
    flat: dict[str, Any] = {"lookback": int(row["lookback"]), "data.fingerprint": row["data_fingerprint"]}
    for section, name in (("data", "data"), ("task", "task"), ("train_spec", "train")):
        flat.update({f"{name}.{key}": value for key, value in base.get(section, {}).items()})
    flat.update({f"train.{key}": value for key, value in json.loads(row["train"]).items()})
    flat.update({f"params.{key}": value for key, value in json.loads(row["params"]).items()})
    return flat


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    keys = sorted(set(old) | set(new), key=lambda k: (k != "data.fingerprint", k))  # changed data first: it explains the rest
    return [(key, old.get(key), new.get(key)) for key in keys if old.get(key) != new.get(key) and key != "task.lookback"]


def _describe(key: str, old: Any, new: Any, project: str) -> str:
    if key == "data.fingerprint":
        return f"data of {project} changed" if project != "*" else "the data changed"
    if new is None:
        return f"{key} {_short(old)} is not in the file now"
    return f"{key} {_short(old)} -> {_short(new)}"


def _short(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str) if isinstance(value, (dict, list)) else str(value)
