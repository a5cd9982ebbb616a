"""`gpufill forecast`: each project's next values from what its campaign chose, with calibrated intervals.

What forecasts each project is the campaign's choice (choice.py); each chosen trial is trained once on all the data
(train.py) and kept under WORKDIR/future/, named by the trial and the data it trained on, so forecasting again retrains
nothing (and new data retrains only what it changed). The members' forecasts combine as the campaign combined their
test forecasts (the median of a configuration's seeds, or the declared ensemble's combine and weights); the intervals
are split conformal, from the same combination's errors on the validation windows; where every member is a quantile
network (`loss: quantile`), its own band moved by how far the validation values fell outside it (intervals.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gpufill.campaign.future.choice import Chosen, chosen
from gpufill.campaign.future.intervals import LEVELS, Calibration, calibrate, windows_needed
from gpufill.campaign.store.store import Store
from gpufill.errors import InputError
from gpufill.files import make_folder, write_atomically
from gpufill.forecasting.data.quantiles import band_offsets, banded_levels
from gpufill.forecasting.trial import GLOBAL_PROJECT

if TYPE_CHECKING:
    import pandas as pd

    from gpufill.campaign.spec.spec import CampaignSpec

FOLDER = "future"
"""WORKDIR/future: each chosen trial's forecast on all the data, as a JSON file (what a re-run reads instead of training)."""


@dataclass(slots=True)
class Forecast:
    """The rows (one per project and step) and what it took."""

    frame: pd.DataFrame
    trained: int = 0
    """Chosen trials trained on all the data now."""
    reused: int = 0
    """Chosen trials whose forecast WORKDIR/future held already (trained by an earlier forecast of the same data)."""
    notes: list[str] = field(default_factory=list)
    held_out: dict[float, dict[str, float | None]] = field(default_factory=dict)
    """Per level, how the same choice's intervals did on the campaign's test windows (`interval_scores`): what the
    intervals are worth, measured where they were not calibrated."""


def forecast(workdir: str | Path, *, horizon: int | None = None, levels: Sequence[float] = LEVELS, how: Literal["auto", "ensemble", "best"] = "auto",
             data: str | None = None) -> Forecast:
    """The next `horizon` values (default: the task's) of every project the campaign in `workdir` forecasts, with
    intervals at `levels` (percent); `data`: another source of the same projects (newer values, say) than the file's."""
    workdir = Path(workdir)
    store = Store.open(workdir)
    try:
        spec, base_dir = _spec(store, workdir)
        where = str(workdir)
        if horizon is not None and not 1 <= horizon <= spec.task.horizon:
            raise InputError(f"--horizon {horizon}: the campaign's models forecast {spec.task.horizon} steps at once", where=where,
                             field="--horizon", fix=f"pass --horizon between 1 and {spec.task.horizon}, or run a campaign with a longer task.horizon")
        from gpufill.campaign.results.reading import stored_metric

        picks = chosen(store, how, metric=stored_metric(store), where=where)
        member_ids = sorted({trial_id for pick in picks for trial_id in pick.members})
        trials = {q.trial_id: q.trial for q in store.queued(member_ids)}
        details = {trial_id: store.trial_details(trial_id) or {} for trial_id in member_ids}
        val, test = store.forecasts(member_ids, window="val"), store.forecasts(member_ids)
        scores = interval_scores(_held_out(picks, val, test, levels), levels)  # the same picks and forecasts: read once
    finally:
        store.close()
    projects = _projects(spec, base_dir, data, trials, where)
    futures, trained, reused = _futures(spec, workdir, trials, details, projects)
    steps, frames, notes = horizon or spec.task.horizon, [], []
    served = [(pick, name) for pick in picks for name in (sorted(projects) if pick.project == GLOBAL_PROJECT else [pick.project])]
    calibration = _calibration(served, val, test, levels)
    for pick, name in served:
        if name not in projects:
            notes.append(f"project {name}: not in the data given, not forecast")
            continue
        members = [futures[t][name] for t in pick.members]
        point = _combined(pick, [m["forecast"] for m in members], pick.members)[:steps]
        band = _band(pick, [m.get("quantiles") for m in members])
        frames.append(_rows(name, pick, point, calibration.get(name), levels, projects[name].time,
                           None if band is None else band[:steps]))
    unbounded = [level for level in levels if any(not np.isfinite(c.half_widths[level]).all() for c in calibration.values())]
    if unbounded:
        notes.append(f"{' and '.join(f'{level:g} %' for level in unbounded)} bounds left empty where the validation windows are too few "
                     f"for them ({max(c.windows for c in calibration.values())} at most; a {unbounded[-1]:g} % interval needs "
                     f"{windows_needed(unbounded[-1])}): a longer task.split.val gives more")
    covered = set(projects) if any(pick.project == GLOBAL_PROJECT for pick in picks) else {pick.project for pick in picks}
    if left := sorted(set(projects) - covered):
        notes.append(f"{len(left)} project(s) without a finished trial to forecast with (too short for every lookback, or failed): "
                     + ", ".join(left[:5]) + (" ..." if len(left) > 5 else ""))
    import pandas as pd

    return Forecast(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(), trained, reused, notes, scores)


def held_out(store: Store, *, levels: Sequence[float] = LEVELS, how: Literal["auto", "ensemble", "best"] = "auto") -> list[dict[str, Any]]:
    """How the intervals would have done on the test windows: per project, what `forecast` would choose, its test
    forecast combined as the campaign stored it, the intervals from its validation windows' errors alone (never the
    test's), the actual values and the series' MASE scale (what `coverage` and `msis` read: campaign/future/intervals.py)."""
    from gpufill.campaign.results.reading import stored_metric

    picks = chosen(store, how, metric=stored_metric(store), where=str(store.path.parent))
    member_ids = sorted({trial_id for pick in picks for trial_id in pick.members})
    return _held_out(picks, store.forecasts(member_ids, window="val"), store.forecasts(member_ids), levels)


def _held_out(picks: list[Chosen], val: dict[tuple[str, str], dict[str, Any]], test: dict[tuple[str, str], dict[str, Any]],
              levels: Sequence[float]) -> list[dict[str, Any]]:
    """`held_out` of picks whose stored forecasts are read already."""
    served = [(pick, name) for pick in picks
              for name in (sorted({n for (t, n) in test if t in pick.members}) if pick.project == GLOBAL_PROJECT else [pick.project])]
    calibration = _calibration(served, val, test, levels)
    rows = []
    for pick, name in served:
        kept = [test.get((trial_id, name)) for trial_id in pick.members]
        if name not in calibration or any(k is None for k in kept):
            continue
        point = _combined(pick, [k["forecast"].astype(np.float64) for k in kept], pick.members)
        band = _band(pick, [k.get("quantiles") for k in kept])
        bounds = calibration[name].intervals(point, levels, band)
        rows.append({"project": name, "model": pick.label, "forecast": point, "truth": kept[0]["truth"].astype(np.float64),
                     "bounds": bounds, "scale": float(kept[0]["mase_scale"]), "interval_from": calibration[name].described})
    return rows


def interval_scores(rows: list[dict[str, Any]], levels: Sequence[float] = LEVELS) -> dict[float, dict[str, float | None]]:
    """`held_out`'s rows scored: per level, the mean over series of the coverage of the test values and of the MSIS (in
    units of each series' MASE scale); None where no series has a bounded interval at that level."""
    from gpufill.campaign.future.intervals import coverage, msis

    out: dict[float, dict[str, float | None]] = {}
    for level in levels:
        bounded = [row for row in rows if np.isfinite(row["bounds"][level][0]).all() and np.isfinite(row["bounds"][level][1]).all()]
        out[level] = {"coverage": float(np.mean([coverage(r["truth"], *r["bounds"][level]) for r in bounded])) if bounded else None,
                      "msis": float(np.mean([msis(r["truth"], *r["bounds"][level], level, r["scale"]) for r in bounded])) if bounded else None,
                      "series": len(bounded)}
    return out


def write(frame: pd.DataFrame, path: str | Path) -> Path:
    """`frame` to `path` (.csv or .parquet) through a new file: a reader never meets half of it, a link is refused."""
    path = Path(path)
    if path.suffix not in (".csv", ".parquet"):
        raise InputError(f"{path.name}: a forecast is written as .csv or .parquet", where=str(path), field="--out", fix="name the file F.csv or F.parquet")
    if path.suffix == ".csv":
        return write_atomically(path, frame.to_csv(index=False), field="--out")
    return write_atomically(path, lambda handle: frame.to_parquet(handle, index=False), field="--out")


# --- internals -------------------------------------------------------------------------------


def _spec(store: Store, workdir: Path) -> tuple[CampaignSpec, Path]:
    """The campaign as its last run read it, and the folder its data paths are relative to."""
    from gpufill.campaign.spec.spec import CHECKED, CampaignSpec

    text, source, base = store.meta("spec"), store.meta("campaign_file"), store.meta("base_dir")
    if not text:
        raise InputError("the workdir holds no campaign run", where=str(workdir), field="--workdir", fix="run the campaign first (gpufill run FILE)")
    spec = CampaignSpec.model_validate(json.loads(text), context=CHECKED)
    if base:  # absolute, as the run resolved it (a store written before it was kept: the file's path as given)
        return spec, Path(base)
    return spec, (Path(source).parent if source and source != "campaign" else Path.cwd())


def _projects(spec: CampaignSpec, base_dir: Path, data: str | None, trials: dict[str, Any], where: str) -> dict[str, Any]:
    """The projects to forecast: the campaign's data (unchanged since it chose: else one line saying so), or `data`."""
    if data is not None:
        return spec.data.model_copy(update={"source": data}).load(Path.cwd(), where="--data")
    projects = spec.data.load(base_dir)
    for trial in trials.values():
        if trial.is_global or not trial.data_fingerprint or trial.project not in projects:
            continue
        if projects[trial.project].fingerprint() != trial.data_fingerprint:
            raise InputError(f"the data of project {trial.project} changed since the campaign chose what forecasts it", where=where,
                             field="data", fix="run the campaign again (gpufill run FILE), or pass --data to forecast these values with the choices as they are")
    return projects


def _futures(spec: CampaignSpec, workdir: Path, trials: dict[str, Any], details: dict[str, Any], projects: dict[str, Any]
             ) -> tuple[dict[str, dict[str, dict[str, np.ndarray]]], int, int]:
    """(trial id -> project -> its forecast after the data's end ({"forecast": (horizon,)}, and a quantile network's
    "quantiles": (horizon, Q)), trials trained now, trials read back): read from WORKDIR/future, else trained and kept there."""
    folder = make_folder(workdir / FOLDER, field="--workdir", inside=workdir)
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    trained_now = reused = 0
    for trial_id, trial in trials.items():
        if not trial.is_global and trial.project not in projects:  # --data without this project: nothing to train on (said by the caller)
            continue
        names = sorted(projects) if trial.is_global else [trial.project]
        key = hashlib.sha256(json.dumps([spec.task.horizon, [(n, projects[n].fingerprint()) for n in names]]).encode()).hexdigest()[:16]
        path = folder / f"{trial_id}-{key}.json"
        if path.is_file() and not path.is_symlink():
            kept = json.loads(path.read_text())
            out[trial_id] = {name: _future_of(values, (kept.get("quantiles") or {}).get(name)) for name, values in kept["forecasts"].items()}
            reused += 1
            continue
        from gpufill.campaign.future.train import campaign_threads, train_on_all_data
        from gpufill.engine.hardware import cpu_count

        threads = campaign_threads(details[trial_id]) or cpu_count()  # as the campaign trained it: the same numbers
        trained = train_on_all_data(spec, trial, details[trial_id], projects, threads=threads, device=_device(),
                                    tune_cache=str(workdir.resolve() / "tune"))
        write_atomically(path, json.dumps({"trial_id": trial_id, "epochs": trained.epochs, "seconds": round(trained.seconds, 3),
                                           "forecasts": {name: values.tolist() for name, values in trained.forecasts.items()},
                                           **({"quantiles": {name: values.tolist() for name, values in trained.quantiles.items()}}
                                              if trained.quantiles else {})}), field="--workdir")
        out[trial_id] = {name: _future_of(values, trained.quantiles.get(name)) for name, values in trained.forecasts.items()}
        trained_now += 1
    return out, trained_now, reused


def _future_of(forecast: Any, quantiles: Any) -> dict[str, np.ndarray]:
    return {"forecast": np.asarray(forecast, dtype=np.float64),
            **({"quantiles": np.asarray(quantiles, dtype=np.float64)} if quantiles is not None else {})}


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _combined(pick: Chosen, forecasts: list[np.ndarray], weights: dict[str, int]) -> np.ndarray:
    """The members' forecasts (in `weights`' order) combined as the campaign combined them: each counted as often as its weight."""
    repeated = [f for f, weight in zip(forecasts, weights.values(), strict=True) for _ in range(weight)]
    return getattr(np, pick.combine)(np.stack(repeated), axis=0)


def _calibration(served: list[tuple[Chosen, str]], val: dict[tuple[str, str], dict[str, Any]], test: dict[tuple[str, str], dict[str, Any]],
                 levels: Sequence[float]) -> dict[str, Calibration]:
    """Each project's intervals from its combination's errors on its validation windows (the windows every member has),
    calibrated together: a series with too few windows borrows from every series of the campaign (intervals.calibrate)."""
    errors: dict[str, np.ndarray] = {}
    scales: dict[str, float] = {}
    bands: dict[str, dict[float, tuple[np.ndarray, np.ndarray]]] = {}
    banded: dict[str, set[float]] = {}
    for pick, name in served:
        kept = [val.get((trial_id, name)) for trial_id in pick.members]
        scale = next((test[(t, name)]["mase_scale"] for t in pick.members if (t, name) in test), None)
        if scale:
            scales[name] = float(scale)
        if all("quantiles" in test.get((t, name), {}) for t in pick.members):  # its forecast is a band, validated or not
            banded[name] = banded_levels(levels)
        if any(k is None for k in kept) or not kept:
            continue
        common = set.intersection(*(set(k["origins"].tolist()) for k in kept))
        if not common:
            continue
        rows = [np.isin(k["origins"], sorted(common)) for k in kept]
        combined = _combined(pick, [k["forecast"][r].astype(np.float64) for k, r in zip(kept, rows, strict=True)], pick.members)
        errors[name] = kept[0]["truth"][rows[0]].astype(np.float64) - combined
        bands[name] = band_offsets(_band(pick, [k["quantiles"][r] if "quantiles" in k else None for k, r in zip(kept, rows, strict=True)]),
                                   combined, levels)
    return calibrate(errors, scales, levels, bands, banded)


def _band(pick: Chosen, quantiles: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The members' quantiles (..., horizon, Q) combined as their point forecasts are (each quantile on its own), None
    unless every member is a quantile network."""
    if not quantiles or any(q is None for q in quantiles):
        return None
    return _combined(pick, [np.asarray(q, dtype=np.float64) for q in quantiles], pick.members)


def _rows(name: str, pick: Chosen, point: np.ndarray, calibration: Calibration | None, levels: Sequence[float], time: np.ndarray | None,
          band: np.ndarray | None = None) -> pd.DataFrame:
    import pandas as pd

    from gpufill.forecasting.data.future import future_times

    steps = len(point)
    columns: dict[str, Any] = {"project": name, "step": np.arange(1, steps + 1)}
    after = future_times(time, steps)
    if after is not None:
        columns["time"] = after
    columns.update({"model": pick.label, "forecast": point})
    empty = (np.full(steps, np.nan), np.full(steps, np.nan))
    bounds = calibration.intervals(point, levels, band) if calibration is not None else {}
    for level in levels:
        lower, upper = bounds.get(level, empty)
        # an interval too few windows can bound is empty (NaN), never an infinite one in a file
        columns[f"lo_{level:g}"], columns[f"hi_{level:g}"] = np.where(np.isfinite(lower), lower, np.nan), np.where(np.isfinite(upper), upper, np.nan)
    columns["interval_from"] = calibration.described if calibration is not None else "none (no validation windows)"
    return pd.DataFrame(columns)
