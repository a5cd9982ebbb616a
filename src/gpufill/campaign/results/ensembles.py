"""The stored test forecasts (`results --forecasts`) and ensembles of them (`results --ensemble`).

An ensemble combines, per project, the forecasts of every finished trial of one configuration
that differs only in the seed (and, with `over=("seed", "lookback")`, in the lookback too: the
test windows are the same for every lookback), by the median or the mean of each forecast
value, and scores the combination with the same metrics as a trial. Packs make its members
almost free: a campaign with 5 seeds already holds a 5-member ensemble of every configuration.

The campaign's declared ensemble (`ensemble:`) is combined by the runner after each run and kept in the store's meta,
each project's row naming the member trials it combined (their ids hash the data fingerprint and every setting).
Read back, a row is current only while those are exactly the finished member trials of the file as it is now and
the file declares the same ensemble; otherwise it is stale, as a trial of an earlier file or data is. A row
combining fewer members than the file has (failed or not yet run) says so: "4 of 8 members".
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpufill.campaign.results.lookback_range import range_name
from gpufill.campaign.store.store import Store
from gpufill.campaign.store.store_health import check_rows
from gpufill.errors import InputError
from gpufill.forecasting.trial import GLOBAL_PROJECT

if TYPE_CHECKING:
    import numpy as np

    from gpufill.campaign.spec.spec import CampaignSpec

__all__ = ["ENSEMBLE_HOW", "declared_ensemble", "declared_meta", "ensembles", "forecast_rows", "members_shown", "read_declared"]

ENSEMBLE_HOW = ("median", "mean")
"""How members combine: numpy's function of that name (`_combined`)."""


def _combined(how: str, forecasts: list[np.ndarray]) -> np.ndarray:
    """`how` (median or mean) of the members' forecasts, value by value, in float64. numpy loads here and in
    `_scored`, not with this module: `results --summary` reads the kept rows of the declared ensemble without it."""
    import numpy as np

    return getattr(np, how)(np.stack(forecasts).astype(np.float64), axis=0)


def _scored(forecast: np.ndarray, truth: np.ndarray, mase_scale: float) -> dict[str, float]:
    """A forecast's metrics, as a trial's are computed (the metrics module imports torch: loaded only to score)."""
    import numpy as np

    from gpufill.forecasting.data.metrics import forecast_metrics

    return forecast_metrics(truth.astype(np.float64), forecast.astype(np.float64), mase_scale)


def _done(store: Store) -> list[dict[str, Any]]:
    return [r for r in store.records() if r["status"] == "done"]


def ensembles(workdir: str | Path, how: Literal["median", "mean"] = "median", *, over: tuple[str, ...] = ("seed",)) -> list[dict[str, Any]]:
    """One row per configuration and project: the ensemble's metrics, its members, and the members' mean and best MAE."""
    if how not in ENSEMBLE_HOW:
        raise InputError(f"unknown ensemble {how!r}", where="command line", field="--ensemble", fix=f"use {' or '.join(ENSEMBLE_HOW)}")
    unknown = set(over) - {"seed", "lookback"}
    if "seed" not in over or unknown:
        raise InputError(f"an ensemble is over {', '.join(over)}", where="command line", field="--ensemble-over", fix="use seed, or seed,lookback")
    store = Store.open(workdir)
    try:
        check_rows(store.db, store.path, documents=True)
        records = _done(store)
        kept = store.forecasts([r["trial_id"] for r in records])
    finally:
        store.close()
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        key = (record["family"], record["params"], record["train"], "*" if "lookback" in over else record["lookback"])
        groups[key].append(record)
    by_trial: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)  # one pass: a global trial has one per project
    for (trial_id, project), forecast in kept.items():
        by_trial[trial_id].append((project, forecast))
    rows = []
    for (family, params, train, lookback), members in groups.items():
        per_project: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for member in members:
            for project, forecast in by_trial[member["trial_id"]]:
                per_project[project].append(forecast)
        for project, forecasts in sorted(per_project.items()):
            first = forecasts[0]
            same = [f for f in forecasts if _same_windows(f, first)]
            scores = _scored(_combined(how, [f["forecast"] for f in same]), first["truth"], first["mase_scale"])
            member_mae = [_scored(f["forecast"], first["truth"], first["mase_scale"])["mae"] for f in same]
            rows.append({"project": project, "family": family, "params": params, "train": train, "lookback": lookback, "ensemble": how,
                         "members": len(same), **scores, "member_mae_mean": statistics.fmean(member_mae), "member_mae_best": min(member_mae)})
    return sorted(rows, key=lambda r: (r["project"], r["mae"]))


def forecast_rows(workdir: str | Path, *, window: str = "test") -> list[dict[str, Any]]:
    """Long format: one row per finished trial, project, test window and horizon step; `window` "val": the
    validation windows' forecasts instead (by a model that never trained on their targets; what a choice may read)."""
    store = Store.open(workdir)
    try:
        check_rows(store.db, store.path, documents=True)
        records = {r["trial_id"]: r for r in _done(store)}
        kept = store.forecasts(list(records), window=window)
    finally:
        store.close()
    rows = []
    for (trial_id, project), forecast in kept.items():
        record = records[trial_id]
        for origin, values, truths in zip(forecast["origins"], forecast["forecast"], forecast["truth"], strict=True):
            for step, (value, truth) in enumerate(zip(values, truths, strict=True), start=1):
                rows.append({"trial_id": trial_id, "project": project, "family": record["family"], "params": record["params"],
                             "lookback": record["lookback"], "seed": record["seed"], "origin": int(origin), "step": step,
                             "forecast": float(value), "actual": float(truth)})
    return rows


ENSEMBLE_META = "declared_ensemble"
"""The store's meta key of the declared ensemble: {"definition", "families", "rows"} (written by the runner after each
run; a list of rows in stores written before rows named their members)."""
SPEC_META = "spec"
"""The meta key the runner keeps the campaign file as it is now under (written when each run starts)."""


def declared_meta(store: Store, spec: CampaignSpec) -> dict[str, str]:
    """The declared ensemble combined from what is finished, with what defines it: the store meta the runner writes
    (results/ only reads the store)."""
    assert spec.ensemble is not None
    members = spec.ensemble_members()
    rows = declared_ensemble(store, members, spec.ensemble.combine, within=spec.ensemble.within, select=spec.ensemble.select, metric=spec.task.metric,
                             padded=spec.ensemble.padded)
    definition = _definition(json.loads(spec.model_dump_json()))
    return {ENSEMBLE_META: json.dumps({"definition": definition, "families": members, "rows": rows})}


def _definition(spec: dict[str, Any]) -> dict[str, Any]:
    """What decides the declared ensemble's members and how they combine: the ensemble section (folded) and the model
    families (its default members are every learned one), from the spec as JSON (the meta's, or the runner's)."""
    return {"ensemble": spec.get("ensemble"), "models": sorted(spec.get("models") or {})}


def declared_ensemble(store: Store, members: list[str], combine: str, *, within: float | None = None, select: str | None = None,
                      metric: str = "mae", padded: str = "keep") -> list[dict[str, Any]]:
    """The campaign's declared ensemble per project: `combine` of the finished, current trials of the `members`
    families (every seed, lookback, loss and grid point) over their stored test forecasts, scored like a trial;
    with `within`, only the members whose validation `metric` is within that factor of the best member's (chosen on
    validation, never on the test it is scored on; `left_out`: the others, each with its validation score); with
    `select` "greedy", of those the members forward selection adds on their validation forecasts (`weights`: how
    often each joined; the others are left out with the reason "not chosen"); with `select` "best", the members of the
    contiguous range of lookbacks whose combination scores best on validation (`lookback_range`: the range and every
    range's score; the others are left out with the reason "lookbacks"; `padded` applies within each range);
    with `padded` "leave_out", a member whose lookback is longer than the project's history before its first test
    window is left out there (reason "padded"; the shortest lookback's members stay where none fits);
    `cost_s`: the members' training seconds, all projects together (a global trial trains them at once);
    `trial_ids`: the finished member trials it was computed from, `joined`: those it combined (`gpufill forecast` trains
    them on all the data), `expected`: the file's member trials (any status)."""
    records = [r for r in _done(store) if r["family"] in members and not r["stale"]]
    kept = store.forecasts([r["trial_id"] for r in records])
    by_id = {r["trial_id"]: r for r in records}
    per_project: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for (trial_id, project), forecast in sorted(kept.items()):
        per_project[project].append((by_id[trial_id], forecast))
    done, expected = _members_now(store, members)
    cost = float(sum(r["duration_s"] or 0.0 for r in records))
    chosen: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    left: dict[str, list[dict[str, Any]]] = {}
    for project, pairs in sorted(per_project.items()):
        first = pairs[0][1]
        same = [(r, f) for r, f in pairs if _same_windows(f, first)]
        # best: the padded rule is applied inside each lookback range (below), so the ranges start from every member
        filled, unfilled = _filled(same, metric) if padded == "leave_out" and select != "best" else (same, [])
        chosen[project], left[project] = _chosen_on_validation(filled, within, metric)
        left[project] = [*unfilled, *left[project]]
    sets = _validation_sets(store, chosen, {p: pairs[0][1]["mase_scale"] for p, pairs in per_project.items()}) if select else []
    weights = _selected(sets, metric, combine) if select == "greedy" else {}
    ranges = _ranges(sets, by_id, metric, combine, padded) if select == "best" else {}
    rows = []
    for project, joined in chosen.items():
        first, left_out, weight, lookback_range = joined[0][1], list(left[project]), weights.get(project), ranges.get(project)
        if weight is not None and not any(weight.get(r["trial_id"], 0) for r, _ in joined):
            weight = None  # none of the chosen is here (a member without this project's windows): every member within joins
        if weight is not None:
            left_out += [_left(r, metric, reason="not chosen") for r, _ in joined if weight.get(r["trial_id"], 0) == 0]
            joined = [(r, f) for r, f in joined if weight.get(r["trial_id"], 0) > 0]
        if lookback_range is not None and any(int(r["lookback"]) in lookback_range["lookbacks"] for r, _ in joined):
            left_out += [_left(r, metric, reason="lookbacks") for r, _ in joined if int(r["lookback"]) not in lookback_range["lookbacks"]]
            joined = [(r, f) for r, f in joined if int(r["lookback"]) in lookback_range["lookbacks"]]
        if select == "best" and padded == "leave_out":
            joined, unfilled = _filled(joined, metric)
            left_out += unfilled
        repeated = [f["forecast"] for r, f in joined for _ in range(weight[r["trial_id"]] if weight is not None else 1)]
        rows.append({"project": project, "combine": combine, "members": len(joined), "joined": sorted(r["trial_id"] for r, _ in joined),
                     "families": sorted({r["family"] for r, _ in joined}),
                     "lookbacks": sorted({int(r["lookback"]) for r, _ in joined}),
                     **_scored(_combined(combine, repeated), first["truth"], first["mase_scale"]),
                     "cost_s": round(cost, 3), "trial_ids": sorted(_of(done, project)), "expected": _count(expected, project),
                     "left_out": left_out, "within": within, "select": select, **({"weights": weight} if weight is not None else {}),
                     **({"lookback_range": lookback_range} if lookback_range is not None else {})})
    return rows


def _validation_sets(store: Store, chosen: dict[str, list[tuple[dict[str, Any], Any]]], scales: dict[str, float]) -> list[dict[str, Any]]:
    """What a choice on validation reads, per group of projects chosen for together (global members, one model each in
    every project: once over every project's windows; local ones: per project): the projects, the member trial ids,
    their validation forecasts (K, N, H), the truth (N, H), each row's series number and window origin, and the series'
    MASE scales. A project whose members lack validation forecasts (no validation split, or a store kept before they
    were) is in none."""
    import numpy as np

    ids = sorted({r["trial_id"] for pairs in chosen.values() for r, _ in pairs})
    val = store.forecasts(ids, window="val")
    pooled = all(r["project"] == GLOBAL_PROJECT for pairs in chosen.values() for r, _ in pairs)
    sets = []
    for projects in [list(chosen)] if pooled else [[project] for project in chosen]:
        everywhere = set.intersection(*({r["trial_id"] for r, _ in chosen[project]} for project in projects))
        trial_ids = [r["trial_id"] for r, _ in chosen[projects[0]] if r["trial_id"] in everywhere]
        blocks, truths, series, origins, scale = [], [], [], [], []
        for project in projects:
            kept = [val.get((trial_id, project)) for trial_id in trial_ids]
            if any(k is None for k in kept) or any(not np.array_equal(k["origins"], kept[0]["origins"]) for k in kept):
                continue  # no validation windows here (a short series), or not the same ones: the choice is made on the rest
            blocks.append(np.stack([k["forecast"] for k in kept]))
            truths.append(kept[0]["truth"])
            series += [len(scale)] * len(kept[0]["origins"])
            origins.append(np.asarray(kept[0]["origins"]))
            scale.append(scales[project])
        if blocks:
            sets.append({"projects": projects, "trial_ids": trial_ids, "forecasts": np.concatenate(blocks, axis=1),
                         "truth": np.concatenate(truths), "series": np.array(series), "origins": np.concatenate(origins), "scales": np.array(scale)})
    return sets


def _selected(sets: list[dict[str, Any]], metric: str, combine: str) -> dict[str, dict[str, int]]:
    """project -> {trial_id: times forward selection added it} on the members' validation forecasts."""
    from gpufill.campaign.results.greedy import select_greedily

    out: dict[str, dict[str, int]] = {}
    for s in sets:
        picked = select_greedily(s["forecasts"], s["truth"], s["series"], metric=metric, combine=combine, scales=s["scales"])
        weight = {s["trial_ids"][index]: count for index, count in picked.weights.items()}
        out.update({project: weight for project in s["projects"]})
    return out


def _ranges(sets: list[dict[str, Any]], by_id: dict[str, dict[str, Any]], metric: str, combine: str, padded: str) -> dict[str, dict[str, Any]]:
    """project -> {"lookbacks": the contiguous range of the members' lookbacks whose combination scores best on
    validation, "scores": every range's} (lookback_range.py); with `padded` leave_out, a member whose lookback the
    history before a validation window does not fill sits that window out, as it sits the test out."""
    import numpy as np

    from gpufill.campaign.results.lookback_range import select_lookback_range

    out: dict[str, dict[str, Any]] = {}
    for s in sets:
        lookbacks = np.array([int(by_id[t]["lookback"]) for t in s["trial_ids"]])
        fits = lookbacks[:, None] <= s["origins"][None, :] if padded == "leave_out" else None
        choice = select_lookback_range(s["forecasts"], s["truth"], s["series"], lookbacks, metric=metric, combine=combine, scales=s["scales"], fits=fits)
        out.update({project: {"lookbacks": list(choice.lookbacks), "scores": {k: round(v, 6) for k, v in choice.scores.items()}} for project in s["projects"]})
    return out


def _filled(pairs: list[tuple[dict[str, Any], Any]], metric: str) -> tuple[list[tuple[dict[str, Any], Any]], list[dict[str, Any]]]:
    """(the members whose lookback the project's history fills before its first test window, the others as left out
    with the reason "padded"); where none fits, the members of the shortest lookback join (a forecast is still due)."""
    if not pairs:
        return pairs, []
    history = min(int(origin) for origin in pairs[0][1]["origins"])
    fits = [int(r["lookback"]) <= history for r, _ in pairs]
    if not any(fits):
        shortest = min(int(r["lookback"]) for r, _ in pairs)
        fits = [int(r["lookback"]) == shortest for r, _ in pairs]
    return ([pair for pair, fit in zip(pairs, fits, strict=True) if fit],
            [_left(r, metric, reason="padded") for (r, _), fit in zip(pairs, fits, strict=True) if not fit])


def _chosen_on_validation(pairs: list[tuple[dict[str, Any], Any]], within: float | None, metric: str
                          ) -> tuple[list[tuple[dict[str, Any], Any]], list[dict[str, Any]]]:
    """(the members that join, the ones left out with their validation score): a member whose validation `metric` is
    more than `within` times the best member's is left out. A global trial's score is its mean over projects (one
    model: it joins or not for every project); without validation scores (no validation split) every member joins."""
    scores = [r.get(f"val_{metric}") for r, _ in pairs]
    if within is None or any(score is None or score != score for score in scores):
        return pairs, []
    best = min(scores)
    joined = [pair for pair, score in zip(pairs, scores, strict=True) if score <= within * best]
    left_out = [_left(r, metric, best=best) for (r, _), score in zip(pairs, scores, strict=True) if score > within * best]
    return joined, left_out


def _left(record: dict[str, Any], metric: str, *, best: float | None = None, reason: str = "within") -> dict[str, Any]:
    """A member left out on validation: which, its validation score, and why ("within": > within x the best member's
    score, `best`; "not chosen": forward selection did not add it; "lookbacks": its lookback is outside the range
    chosen on validation; "padded": its lookback is longer than the series' history, ensemble.padded)."""
    return {"trial_id": record["trial_id"], "family": record["family"], "lookback": int(record["lookback"]), "train": record["train"],
            "params": record["params"], f"val_{metric}": record.get(f"val_{metric}"), "reason": reason, **({"best": best} if best is not None else {})}


def read_declared(store: Store, *, include_stale: bool = False) -> list[dict[str, Any]]:
    """The declared ensemble's rows the last run kept (none without an ensemble), each with `stale` (computed from
    other member trials than the finished ones of the file as it is now, or under another ensemble) and `expected`
    (how many member trials the file has for the project); stale rows only with `include_stale`."""
    text = store.meta(ENSEMBLE_META)
    if not text:
        return []
    kept = json.loads(text)
    if isinstance(kept, list):  # kept before rows named their members: nothing ties them to the trials now
        rows = [{**row, "stale": True, "expected": row["members"]} for row in kept]
        return rows if include_stale else []
    spec = store.meta(SPEC_META)
    same_ensemble = spec is None or _definition(json.loads(spec)) == kept["definition"]
    done, expected = _members_now(store, kept["families"])
    rows = []
    for row in kept["rows"]:
        current = same_ensemble and set(row["trial_ids"]) == _of(done, row["project"])
        if current or include_stale:
            rows.append({**row, "stale": not current, "expected": _count(expected, row["project"]) if current else row["expected"]})
    return rows


def members_shown(row: dict[str, Any]) -> str:
    """A declared ensemble row's members as a reader should see them: "12", "4 of 8 members" when some of the
    file's member trials failed or have not run (a partial ensemble is never shown as a whole one), and "2 left out
    on validation (> 1.5x the best)" for the members its choice on validation left out."""
    expected, left_out = row.get("expected"), row.get("left_out") or []
    left = len(left_out)
    if expected is not None and row["members"] + left < expected:
        shown = f"{row['members']} of {expected} members"
    else:
        shown = f"{row['members']} of {row['members'] + left} members" if left else str(row["members"])
    reasons = Counter(entry.get("reason", "within") for entry in left_out)
    if reasons["padded"]:
        shown += f"; {reasons['padded']} left out: lookback longer than the series' history"
    if row.get("padded_series"):  # a global campaign's pooled row
        shown += f"; {row['padded_series']} series with only the lookbacks their history fills"
    if reasons["within"]:
        shown += f"; {reasons['within']} left out on validation, > {row['within']:g}x the best member's"
    if reasons["not chosen"]:
        shown += f"; {reasons['not chosen']} not chosen by forward selection on validation"
    if reasons["lookbacks"]:
        shown += f"; lookbacks {range_name(row['lookback_range']['lookbacks'])} chosen on validation ({reasons['lookbacks']} outside)"
    return shown


def _members_now(store: Store, families: list[str]) -> tuple[dict[str, set[str]], dict[str, int]]:
    """The file's member trials now: per project ("*": a global trial, every project's), the finished ones' ids, and
    how many there are in any status."""
    done: dict[str, set[str]] = defaultdict(set)
    expected: dict[str, int] = defaultdict(int)
    for trial_id, project, status in store.member_trials(families):
        expected[project] += 1
        if status == "done":
            done[project].add(trial_id)
    return done, expected


def _same_windows(forecast: dict[str, Any], first: dict[str, Any]) -> bool:
    """Whether `forecast` covers the same test windows as `first` (only those combine)."""
    import numpy as np

    return bool(np.array_equal(forecast["origins"], first["origins"]))


def _of(done: dict[str, set[str]], project: str) -> set[str]:
    return done.get(project, set()) | done.get(GLOBAL_PROJECT, set())


def _count(expected: dict[str, int], project: str) -> int:
    return expected.get(project, 0) + expected.get(GLOBAL_PROJECT, 0)
