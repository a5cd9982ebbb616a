"""`write_report`: one self-contained HTML file for a campaign workdir.

Everything is inline (report/page.py: CSS, base64 PNG images, one small script), so the file
opens without network access and can be mailed or attached to a paper's supplement.
"""

from __future__ import annotations

import json
import os
import time
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpufill.campaign.results.ensembles import members_shown, read_declared
from gpufill.campaign.results.reading import best_per_project, stored_metric, winners
from gpufill.campaign.results.provenance import with_effective_train
from gpufill.campaign.store.store import Store, frame_columns
from gpufill.campaign.store.store_health import check_rows
from gpufill.forecasting.trial import GLOBAL_PROJECT, METRICS
from gpufill.errors import InputError
from gpufill.files import check_target
from gpufill.report import plots
from gpufill.report.page import img, page, plot_or_note, section, table, write_atomically


def write_report(workdir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                 grid: str | os.PathLike[str] | None = None) -> Path:
    """Write the campaign's HTML report (default WORKDIR/report.html) and return its path. `grid`: the workdir of a
    full-grid campaign over the same space as this search: its course is drawn beside the search's."""
    workdir = Path(workdir)
    target = Path(out) if out is not None else workdir / "report.html"
    check_target(target, field="--out")  # a directory, a link or a device there: one line before the report is built
    store = Store.open(workdir)  # InputError (exit 2) when there is no store
    try:
        check_rows(store.db, store.path, documents=True)  # a row edited or damaged: one line naming it, before any is drawn
        grid_trials = _grid_trials(store, Path(grid)) if grid is not None else None
        text = render_report(store, grid_trials)
    finally:
        store.close()
    return write_atomically(target, text)


def _grid_trials(search: Store, workdir: Path) -> pd.DataFrame:
    """The trials of the full grid at `workdir`, checked to be one this search can be drawn beside."""
    if not _is_search(search):
        raise InputError(f"{search.path} is not a search", where=str(search.path), field="--grid",
                         fix="--grid draws a search (a campaign with search:) beside its full grid: pass the search's --workdir")
    try:
        grid = Store.open(workdir)
    except InputError as error:  # the store's own words, under the option that named it
        raise InputError(error.problem, where=error.where, field="--grid", fix=error.fix) from None
    try:
        check_rows(grid.db, grid.path, documents=True)
        if _is_search(grid):
            raise InputError(f"{grid.path} is a search, not a full grid", where=str(grid.path), field="--grid",
                             fix="pass the workdir of the same campaign run without search:")
        if stored_metric(grid) != stored_metric(search):
            raise InputError(f"the grid ranks by {stored_metric(grid)}, the search by {stored_metric(search)}", where=str(grid.path),
                             field="--grid", fix="compare campaigns with the same task.metric")
        return pd.DataFrame.from_records(with_effective_train(grid.records(), grid.bases()), columns=frame_columns())
    finally:
        grid.close()


def render_report(store: Store, grid: pd.DataFrame | None = None) -> str:
    name = store.meta("campaign_name") or "campaign"
    trials = pd.DataFrame.from_records(with_effective_train(store.records(), store.bases()), columns=frame_columns())  # the file as it is now
    samples = store.samples()
    runs = pd.read_sql_query("SELECT run_id, started_at, finished_at, status, command FROM runs ORDER BY run_id", store.db)
    done = trials[trials["status"] == "done"]
    t0 = float(runs["started_at"].min()) if not runs.empty else float(samples["ts"].min()) if not samples.empty else 0.0
    sections = [
        f"<p class='note'>Written {escape(time.strftime('%Y-%m-%d %H:%M:%S'))} from {escape(str(store.path))}.</p>",
        section("Campaign summary", table(["quantity", "value"], summary_rows(store, trials, samples, runs), table_id="summary")),
        section("Model comparison", _model_comparison(trials, done, stored_metric(store)) + _declared(read_declared(store), best_per_project(trials))),
        *([section("Search", _search(trials, stored_metric(store), grid))] if _is_search(store) else []),
        section("Forecasts", _forecasts(store, trials, stored_metric(store))),
        section("Resource timelines", _resources(samples, t0)),
        section("Trial durations", plot_or_note(plots.durations(trials), "no finished trials yet")),
        section("Failures", _failures(store, trials)),
        section("Alerts", _alerts(store, t0)),
        section("Plan chosen per shape", _plans(store)),
    ]
    return page(f"gpufill report: {name}", sections)


# -- summary ------------------------------------------------------------------------------------
def summary_rows(store: Store, trials: pd.DataFrame, samples: pd.DataFrame, runs: pd.DataFrame) -> list[list[str]]:
    all_counts = store.counts()
    counts = all_counts.total
    wall = 0.0
    for started, finished in zip(runs["started_at"], runs["finished_at"], strict=True):
        # A run still going (or killed) has no finish time: count it up to its last recorded trial.
        end = finished if pd.notna(finished) else _last_finish(trials, store) or started
        wall += max(0.0, end - started)
    durations = trials["duration_s"].fillna(0.0)
    gpu = (trials["lane"] == "gpu") & (trials["kind"] == "neural")
    gpu_rows = samples[samples["source"].str.startswith("gpu")] if not samples.empty else samples
    host_rows = samples[samples["source"] == "host"] if not samples.empty else samples
    gpu_util = gpu_rows["gpu_util"].dropna() if not gpu_rows.empty else pd.Series(dtype=float)
    cpu_util = host_rows["cpu_percent"].dropna() if not host_rows.empty else pd.Series(dtype=float)
    return [
        ["campaign", escape(store.meta("campaign_name") or "n/a")],
        ["trials total", str(sum(counts.values()))],
        ["trials done", str(counts["done"])],
        *([["trials pruned (a search's pruner stopped them; never ranked)", str(counts["pruned"])]] if counts.get("pruned") else []),
        ["trials failed", str(counts["failed"])],
        ["trials skipped", str(counts["skipped"])],
        ["stale trials kept (an earlier file or data; not shown)", str(all_counts.stale)],
        ["trials pending or running", str(counts["pending"] + counts["running"])],
        ["runs", str(len(runs))],
        ["wall time", _duration(wall)],
        ["trial-hours", _hours(durations.sum())],
        ["GPU-hours (neural trials on the GPU lane)", _hours(durations[gpu].sum())],
        ["achieved mean GPU utilisation", f"{gpu_util.mean():.1f} %" if not gpu_util.empty else "n/a"],
        ["mean CPU utilisation", f"{cpu_util.mean():.1f} %" if not cpu_util.empty else "n/a"],
    ]


def _last_finish(trials: pd.DataFrame, store: Store) -> float | None:
    row = store.db.execute("SELECT MAX(finished_at) FROM trials").fetchone()
    return row[0] if row and row[0] is not None else None


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h ({_duration(seconds)})"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


# -- sections -----------------------------------------------------------------------------------

def _search(trials: pd.DataFrame, metric: str, grid: pd.DataFrame | None) -> str:
    """The search's course plot and, beside a full grid, what it found with what share of the grid's seconds."""
    drawn = plot_or_note(plots.search_progress(trials, metric, grid), "no finished trials yet")
    if grid is None:
        return drawn
    column = f"val_{metric}"
    found = [_best_and_seconds(frame, column) for frame in (trials, grid)]
    if any(f is None for f in found):
        return drawn + "<p class='note'>no finished trial in the search or the grid yet: nothing to compare</p>"
    (score, seconds), (grid_score, grid_seconds) = found  # type: ignore[misc]
    return drawn + (f"<p class='note' id='search-vs-grid'>Best finished validation {escape(metric)}: the search's {score:.4g} "
                    f"({score / grid_score:.3f}x the full grid's {grid_score:.4g}) with {seconds:.4g} training seconds, "
                    f"{100 * seconds / grid_seconds:.1f} % of the grid's {grid_seconds:.4g}.</p>")


def _best_and_seconds(trials: pd.DataFrame, column: str) -> tuple[float, float] | None:
    """The best finished validation score and the training seconds of every finished or pruned trial."""
    done = trials[trials["status"] == "done"][column].dropna()
    if done.empty:
        return None
    spent = trials[trials["status"].isin(["done", "pruned"])]["duration_s"].fillna(0.0).sum()
    return float(done.min()), float(spent)


def _is_search(store: Store) -> bool:
    """Whether the campaign samples its grids (`search:` in its stored spec)."""
    try:
        return json.loads(store.meta("spec") or "{}").get("search") is not None
    except (ValueError, AttributeError):
        return False


def _model_comparison(trials: pd.DataFrame, done: pd.DataFrame, metric: str = "mae") -> str:
    """Test `metric` (the campaign's task.metric, as `results --best` ranks) per family, and each project's best
    configuration ranked by it."""
    parts = [f"<h3>Test {METRICS[metric].label} per family</h3>", plot_or_note(plots.metric_per_family(done, metric), "no finished trials yet"),
             _metrics_per_family(done)]
    best = best_per_project(trials, metric)
    if best.empty:
        parts.append("<p class='note'>no finished trials yet</p>")
    else:
        top = winners(best.to_dict("records"), metric)  # chosen on validation where every family has it, as `results --best`
        name = METRICS[metric].label

        def ratio(value: Any) -> str:
            return "" if value is None or value != value else f"{value:.3f}"

        rows = [[escape(r["project"]), escape(r["family"]), escape(_params(r["params"])), str(r["lookback"]), f"{r[metric]:.4g}",
                 "" if r[f"val_{metric}"] is None or r[f"val_{metric}"] != r[f"val_{metric}"] else f"{r[f'val_{metric}']:.4g}", ratio(r["vs_snaive"]),
                 ratio(r["vs_ets"]),
                 str(r["seeds"]), str(r["families"]), escape(str(r["chosen_on"]))] for r in top]
        parts += ["<h3>Best configuration per project</h3>",
                  table(["project", "family", "params", "lookback", f"test {name}", f"validation {name}", f"{name} / seasonal naive's", f"{name} / ETS's", "seeds",
                         "families compared", "chosen on"], rows, table_id="best", numeric={3, 4, 5, 6, 7, 8, 9})]
    parts += ["<h3>Hyper-parameter effects</h3>", plot_or_note(plots.parameter_effects(done, metric), "no grid parameter varies within a family")]
    return "\n".join(parts)


def _declared(declared: list[dict], best: pd.DataFrame) -> str:
    """The campaign's declared ensemble per project, beside the best single configuration of its member families."""
    if not declared:
        return ""
    rows = []
    for row in declared:
        # A global campaign's families have one row over every project ("*"): the member to beat is that one.
        members = best[best["project"].isin([row["project"], GLOBAL_PROJECT]) & best["family"].isin(row["families"])]
        single = members.sort_values("val_mae" if members["val_mae"].notna().all() else "mae").head(1)  # chosen as --best chooses
        rows.append([escape(row["project"]), escape(row["combine"]), members_shown(row), escape(", ".join(row["families"])),
                     escape(", ".join(map(str, row["lookbacks"]))), *(f"{row[name]:.4g}" if name in row else "" for name in METRICS),
                     "" if single.empty else f"{single['mae'].iloc[0]:.4g} ({escape(single['family'].iloc[0])})", f"{row['cost_s']:.1f}"])
    return "\n" + "\n".join(["<h3>Declared ensemble</h3>",
                              "<p class='note'>Every member's test forecast combined per project and scored like a trial; the best single "
                              "configuration of its families is chosen on validation where each has a score, as results --best chooses. Members whose "
                              "validation score is worse than ensemble.within times the best member's are left out, and counted. Cost: the members' training seconds.</p>",
                              table(["project", "combine", "members", "families", "lookbacks", *(f"test {m.label}" for m in METRICS.values()),
                                     "best single member's MAE", "cost (s)"], rows, table_id="ensemble",
                                    numeric={2, *range(5, 5 + len(METRICS)), 6 + len(METRICS)})])


def _metrics_per_family(done: pd.DataFrame) -> str:
    """Each family's median test score of every metric (METRICS: the registry's labels, in its order)."""
    if done.empty:
        return ""
    rows = [[escape(family), str(len(rows))] + [f"{rows[name].median():.4g}" for name in METRICS] for family, rows in done.groupby("family", sort=True)]
    return table(["family", "trials", *(f"median {metric.label}" for metric in METRICS.values())], rows, table_id="metrics",
                 numeric=set(range(1, 2 + len(METRICS))))


def _forecasts(store: Store, trials: pd.DataFrame, metric: str = "mae") -> str:
    """Per family, its best configuration's forecasts on the project it does best and worst on (first seed), every
    horizon step, with the intervals `gpufill forecast` would give them (from the validation windows' errors)."""
    best = best_per_project(trials, metric)
    if best.empty:
        return "<p class='note'>no finished trials yet</p>"
    done = trials[trials["status"] == "done"]
    panels, picks, firsts = [], [], {}
    for family, rows in best.groupby("family", sort=True):
        ranked = rows.sort_values(metric)
        for _, row in ranked.iterrows():  # every project's first seed: the family's intervals are calibrated over all of them
            seeds = done[(done["project"] == row["project"]) & (done["config_id"] == row["config_id"])]
            if not seeds.empty:
                firsts[(family, row["project"])] = seeds["trial_id"].iloc[0]
        for which, row in (("best", ranked.iloc[0]), ("worst", ranked.iloc[-1])) if len(ranked) > 1 else (("best", ranked.iloc[0]),):
            if (family, row["project"]) in firsts:
                picks.append((family, which, row["project"], firsts[(family, row["project"])]))
    ids = sorted(set(firsts.values()))
    kept, val = store.forecasts(ids), store.forecasts(ids, window="val")
    for family, which, project, trial_id in picks:
        if (trial_id, project) in kept:
            panels.append((family, which, project, kept[(trial_id, project)]))
        elif project == "*":  # a global model: its best and worst project are among its per-project forecasts
            mine = {p: f for (t, p), f in kept.items() if t == trial_id}
            if mine:
                scored = sorted(mine, key=lambda p: float(np.abs(mine[p]["forecast"] - mine[p]["truth"]).mean()))
                panels += [(family, "best", scored[0], mine[scored[0]]), (family, "worst", scored[-1], mine[scored[-1]])]
    return (plot_or_note(plots.forecasts(panels, _bands(firsts, kept, val)), "no stored forecasts (trials finished before forecasts were kept)")
            + _interval_scores(store))


def _interval_scores(store: Store) -> str:
    """How `gpufill forecast`'s intervals did on the test windows, which never calibrate them: coverage and MSIS per level."""
    from gpufill.campaign.future.forecast import held_out, interval_scores

    try:
        rows = held_out(store)
    except InputError as error:  # nothing finished, or a declared ensemble combined from other trials: say which
        return f"<p class='note'>intervals on the test windows: {escape(error.problem)}</p>"
    scores = interval_scores(rows)
    if not rows or all(score["coverage"] is None for score in scores.values()):
        return "<p class='note'>intervals on the test windows: no validation windows to calibrate them on (task.split.val)</p>"
    cells = [[f"{level:g} %", "-" if score["coverage"] is None else f"{100 * score['coverage']:.1f} %",
              "-" if score["msis"] is None else f"{score['msis']:.3g}", str(score["series"])] for level, score in scores.items()]
    return ("<h3>Intervals on the test windows</h3><p class='note'>What <code>gpufill forecast</code> would ship for each project ("
            f"{escape(rows[0]['model'])}{' and the others' if len({r['model'] for r in rows}) > 1 else ''}), its split conformal intervals from "
            "the validation windows' errors alone, scored on the test windows: the share of actual values inside, and the mean scaled "
            "interval score (M4's MSIS in units of each series' MASE scale; lower is better).</p>"
            + table(["level", "coverage", "MSIS", "series"], cells, table_id="intervals", numeric={1, 2, 3}))


def _bands(firsts: dict[tuple[str, str], str], kept: dict[tuple[str, str], Any], val: dict[tuple[str, str], Any]) -> dict[tuple[str, str], Any]:
    """(family, project) -> its intervals' Calibration, as `gpufill forecast` makes it: split conformal from the
    family's validation errors, pooled in units of each series' scale where a series has too few, and a quantile
    network's own band moved by how far the validation values fell outside it (campaign/future/intervals.py)."""
    from gpufill.campaign.future.intervals import LEVELS, calibrate
    from gpufill.forecasting.data.quantiles import band_offsets, banded_levels

    out: dict[tuple[str, str], Any] = {}
    for family in sorted({family for family, _ in firsts}):
        errors, scales, bands, banded = {}, {}, {}, {}
        for (name, project), trial_id in firsts.items():
            if name != family:
                continue
            for (t, p), forecast in kept.items():  # a global trial's projects, or the project's own
                if t == trial_id and (p == project or project == "*"):
                    scales[p] = float(forecast["mase_scale"])
                    if forecast.get("quantiles") is not None:  # its forecast is a band, validated or not
                        banded[p] = banded_levels(LEVELS)
                    if (t, p) in val:
                        point = val[(t, p)]["forecast"].astype(np.float64)
                        errors[p] = val[(t, p)]["truth"].astype(np.float64) - point
                        bands[p] = band_offsets(val[(t, p)].get("quantiles"), point, LEVELS)
        for project, calibration in calibrate(errors, scales, LEVELS, bands, banded).items():
            out[(family, project)] = calibration
    return out


def _resources(samples: pd.DataFrame, t0: float) -> str:
    if samples.empty:
        return "<p class='note'>no monitor samples in this workdir (the sampler was not running)</p>"
    gpu = plots.gpu_timelines(samples, t0)
    host = plots.host_timelines(samples, t0)
    parts = [img(p) for p in gpu] or ["<p class='note' id='no-gpu'>no GPU samples: this campaign ran without a GPU (or without NVML)</p>"]
    parts += [img(p) for p in host] or ["<p class='note'>no host samples</p>"]
    return "\n".join(parts)


def _failures(store: Store, trials: pd.DataFrame) -> str:
    failed = trials[trials["status"] == "failed"]
    if failed.empty:
        return "<p class='note'>no failed trials</p>"
    rows = []
    for r in failed.itertuples():
        details = store.trial_details(r.trial_id) or {}
        trace = details.get("traceback") or ""
        error = escape(r.error or "")
        if trace:
            error += f"<details><summary>traceback</summary><pre>{escape(trace)}</pre></details>"
        rows.append([escape(r.trial_id), escape(r.family), escape(r.project), str(r.attempts), error])
    return table(["trial", "family", "project", "attempts", "error"], rows, table_id="failures", numeric={3})


def _alerts(store: Store, t0: float) -> str:
    alerts = [e for e in store.events() if e["kind"].startswith("alert")]
    if not alerts:
        return "<p class='note'>no alerts</p>"
    rows = [[f"{e['ts'] - t0:.1f}", escape(e["kind"]), escape(e["trial_id"] or ""), escape(e["message"])] for e in alerts]
    return table(["time since start (s)", "alert", "trial", "message"], rows, table_id="alerts", numeric={0})


def _plans(store: Store) -> str:
    shapes = store.db.execute(
        "SELECT family, shape, MIN(position), COUNT(*) FROM trials WHERE plan IS NOT NULL GROUP BY family, shape ORDER BY MIN(position)"
    ).fetchall()
    if not shapes:
        return "<p class='note'>no finished trials yet</p>"
    plans: list[tuple[str, str, int, dict[str, Any]]] = []
    for family, shape, position, n in shapes:
        trial_id = store.db.execute("SELECT trial_id FROM trials WHERE position = ?", (position,)).fetchone()[0]
        plans.append((family, shape, n, (store.trial_details(trial_id) or {}).get("plan") or {}))
    settings = sorted({key for *_, plan in plans for key in plan})
    rows = []
    for family, shape, n, plan in plans:
        cells = []
        for key in settings:
            entry = plan.get(key)
            if isinstance(entry, dict) and "value" in entry:
                cells.append(f"{escape(json.dumps(entry['value']))}<small class='reason'>{escape(str(entry.get('reason', '')))}</small>")
            else:
                cells.append("" if entry is None else escape(json.dumps(entry)))
        rows.append([escape(family), escape(shape), str(n), *cells])
    return "<div class='scroll'>" + table(["family", "shape", "trials", *settings], rows, table_id="plans", numeric={2}) + "</div>"


def _params(text: str) -> str:
    params = json.loads(text) if text else {}
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "(defaults)"
