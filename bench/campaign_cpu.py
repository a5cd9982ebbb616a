"""The demo campaign through gpufill against plain sequential loops over the same trials.

    python bench/campaign_cpu.py [--quick] [--repeats N] [--campaign PATH] [--out PATH]

Three ways to run the same trials (same models, epochs, early stopping, seeds):
- plain: what a researcher writes first: one process, `for trial in trials:`, neural
  trials with the guides' training loop (per-sample Dataset, DataLoader, loss.item()
  per step), classical ones with the library on all cores;
- sequential gpufill.fit: the same loop, but each trial trained by gpufill's engine:
  isolates what the scheduler adds, and must give the same metrics to float precision;
- gpufill: the campaign scheduler (lanes, slots x threads <= cores, worker processes);
  its time includes starting the workers.
Reported: trials per minute of each, the ratios, and the per-trial agreement of test MAE.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.bench import baseline_fit  # noqa: E402
from gpufill.campaign.runner import Campaign  # noqa: E402
from gpufill.campaign.trials import expand  # noqa: E402
from gpufill.forecasting.data import forecast_metrics, make_windows  # noqa: E402
from gpufill.forecasting.task import predict, train_forecaster  # noqa: E402
from gpufill.engine.hardware import cpu_count  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402
from gpufill.forecasting.models.classical import train_classical  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def sequential(campaign: Campaign, *, plain: bool) -> tuple[float, dict[str, float]]:
    """Every trial in order in this process; returns (seconds, trial_id -> test MAE)."""
    spec = campaign.spec
    torch.set_num_threads(cpu_count())
    started = time.perf_counter()
    projects = spec.data.load(campaign.base_dir)
    maes = {}
    for trial in expand(spec, list(projects)):
        windows = make_windows(projects[trial.project], trial.lookback, spec.task.horizon, spec.task.split.to_split(), spec.task.stride)
        if trial.kind == "classical":
            maes[trial.trial_id] = train_classical(windows, trial.family, trial.params, threads=cpu_count(), seed=trial.seed).test["mae"]
        elif plain:
            maes[trial.trial_id] = _plain_neural(windows, trial, spec)
        else:
            maes[trial.trial_id] = train_forecaster(windows, trial.family, trial.params, config=spec.fit_config(trial.train, trial.seed)).test["mae"]
    return time.perf_counter() - started, maes


def _plain_neural(windows, trial, spec) -> float:
    config = spec.fit_config(trial.train, trial.seed)
    torch.manual_seed(trial.seed)
    model = registry.build(trial.family, n_features=windows.n_features, lookback=windows.lookback, horizon=windows.horizon, params=trial.params)
    baseline_fit(model, (windows.x_train, windows.y_train), (windows.x_val, windows.y_val), epochs=config.epochs, lr=config.lr, seed=trial.seed, patience=config.patience)
    prediction = windows.inverse_target(predict(model, windows.x_test))
    return forecast_metrics(windows.test_truth, prediction, windows.mase_scale)["mae"]


def with_gpufill(campaign: Campaign) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    campaign.run(fresh=True)
    seconds = time.perf_counter() - started
    results = campaign.results()
    return seconds, dict(zip(results["trial_id"], results["mae"], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--campaign", type=Path, default=ROOT / "examples" / "demo.yaml")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    env = environment("cpu")
    workdir = Path(tempfile.mkdtemp(prefix="gpufill-bench-"))
    try:
        campaign = Campaign.from_yaml(args.campaign, workdir)
        runs: dict[str, list[float]] = {"plain sequential": [], "sequential gpufill.fit": [], "gpufill": []}
        maes: dict[str, dict[str, float]] = {}
        for _ in range(repeats):  # interleaved, so drift in the machine's speed hits all three
            for name, loop in (("plain sequential", lambda: sequential(campaign, plain=True)),
                               ("sequential gpufill.fit", lambda: sequential(campaign, plain=False)),
                               ("gpufill", lambda: with_gpufill(campaign))):
                seconds, maes[name] = loop()
                runs[name].append(seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    n_trials = len(maes["gpufill"])
    rows = []
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        rows.append({"loop": name, "trials": n_trials, "seconds": round(median, 2), "trials_per_min": round(60 * n_trials / median, 1), "runs_s": [round(s, 2) for s in seconds]})
    def relative_differences(a: str, b: str) -> list[float]:
        return [abs(maes[a][t] - maes[b][t]) / abs(maes[b][t]) for t in maes[b]]

    same_engine = relative_differences("gpufill", "sequential gpufill.fit")
    plain = relative_differences("gpufill", "plain sequential")
    per_min = {row["loop"]: row["trials_per_min"] for row in rows}
    ratios = {
        "trials_per_min_gpufill_over_plain_sequential": per_min["gpufill"] / per_min["plain sequential"],
        "trials_per_min_gpufill_over_sequential_fit": per_min["gpufill"] / per_min["sequential gpufill.fit"],
        "max_relative_mae_difference_vs_sequential_fit": max(same_engine),
        "median_relative_mae_difference_vs_plain": statistics.median(plain),
        "mean_mae_gpufill_over_plain": statistics.fmean(maes["gpufill"].values()) / statistics.fmean(maes["plain sequential"].values()),
    }
    run_args = {"campaign": str(args.campaign.relative_to(ROOT) if args.campaign.is_relative_to(ROOT) else args.campaign), "repeats": repeats, "quick": args.quick, "cores": cpu_count()}
    finish("campaign_cpu", "demo campaign, sequential loop vs gpufill", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
