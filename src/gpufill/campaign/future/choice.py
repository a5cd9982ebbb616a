"""Which trials forecast each project past the end of its data, and how they combine: what the campaign chose.

Either the campaign's declared ensemble (`ensemble:`, its members and weights as chosen on validation) or, per project,
the configuration `results --best` chose (on validation where every candidate has a validation score), every seed of
it combined by the median, as `results --ensemble` combines seeds. Read from the store alone: no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from gpufill.campaign.results.ensembles import read_declared
from gpufill.campaign.store.store import Store
from gpufill.errors import InputError

FROM = ("auto", "ensemble", "best")
"""What `gpufill forecast --from` takes: auto is the declared ensemble where the campaign declares one, else the best."""


@dataclass(frozen=True, slots=True)
class Chosen:
    """What forecasts `project` ("*": every project, a global campaign's one model): `members` (trial id -> how many
    times it counts) combined by `combine`, and how a reader names it."""

    project: str
    label: str
    combine: str
    members: dict[str, int]


def chosen(store: Store, how: Literal["auto", "ensemble", "best"], *, metric: str, where: str) -> list[Chosen]:
    """What forecasts each project, as `how` asks (FROM); one line naming the fix where the campaign has nothing to
    forecast with, or its declared ensemble no longer matches its trials."""
    declared = read_declared(store, include_stale=True)
    if how == "ensemble" or (how == "auto" and declared):
        if not declared:
            raise InputError("the campaign declares no ensemble", where=where, field="--from",
                             fix="add an ensemble: section to the campaign file and run it, or pass --from best")
        stale = sorted(row["project"] for row in declared if row.get("stale"))
        if stale:
            raise InputError(f"the declared ensemble of {len(stale)} project(s) ({', '.join(stale[:3])}) was combined from other trials "
                             "than the file's finished ones", where=where, field="ensemble", fix="run the campaign again (gpufill run FILE), then forecast")
        return [_of_ensemble(row) for row in declared]
    best = _best(store, metric)
    if not best:
        raise InputError("no finished trial to forecast with", where=where, field="--workdir", fix="run the campaign first (gpufill run FILE)")
    return best


def _of_ensemble(row: dict[str, Any]) -> Chosen:
    left = {entry["trial_id"] for entry in row.get("left_out") or []}
    joined = row.get("joined") or [trial_id for trial_id in row["trial_ids"] if trial_id not in left]
    weights = row.get("weights") or {}
    members = {trial_id: int(weights.get(trial_id, 1)) for trial_id in joined if not weights or weights.get(trial_id)}
    return Chosen(row["project"], f"ensemble ({row['combine']} of {len(members)})", row["combine"], members)


def _best(store: Store, metric: str) -> list[Chosen]:
    """Per project the best configuration across families (`results --best`), every finished seed of it."""
    from gpufill.campaign.results.reading import store_best, winners

    rows = winners(store_best(store, metric), metric)
    seeds: dict[tuple[str, str], list[str]] = {}
    for record in store.records():
        if record["status"] == "done" and record.get("config_id"):
            seeds.setdefault((record["project"], record["config_id"]), []).append(record["trial_id"])
    out = []
    for row in rows:
        members = seeds.get((row["project"], row["config_id"]), [])
        if members:
            params = json.loads(row["params"]) if isinstance(row["params"], str) else row["params"]
            shown = " ".join(f"{key}={value}" for key, value in params.items())
            out.append(Chosen(row["project"], f"{row['family']}{f' {shown}' if shown else ''} lookback={row['lookback']}", "median",
                              dict.fromkeys(members, 1)))
    return out
