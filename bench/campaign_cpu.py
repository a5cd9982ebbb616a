"""The demo campaign through gpufill against plain sequential loops over the same trials.

    python bench/campaign_cpu.py [--smoke | --quick] [--rounds N] [--campaign PATH] [--out PATH]

Three ways to run the same trials (same models, epochs, early stopping, seeds, windows):
- plain: what a researcher writes first: one process, `for trial in trials:`, neural
  trials with the guides' training loop (per-sample Dataset, DataLoader, loss.item()
  per step), classical ones with the library;
- sequential gpufill.fit: the same loop, but each trial trained by the campaign's own trial
  code (`TrialRunner.run`: gpufill's engine, unfused): isolates what the scheduler adds;
- gpufill: the campaign scheduler (lanes, slots x threads <= cores, worker processes);
  its time includes starting the workers.
The arms interleave: each round runs all three, each round starting with a different one.
Reported: trials per minute of each (median round), the median over rounds of each round's
ratio, and the per-trial agreement of test MAE. The in-process arms use one thread under
--smoke and --quick (a loaded 2-core box stalls on two), every core otherwise.

--smoke: a generated 4-trial campaign (2 synthetic projects x mlp, linear; 2 epochs), one
round: seconds (CI). --quick and the default: examples/demo.yaml, 3 and 5 rounds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.bench import baseline_fit  # noqa: E402
from gpufill.campaign.run.runner import Campaign  # noqa: E402
from gpufill.campaign.trials.trials import Trial, expand  # noqa: E402
from gpufill.campaign.worker.worker import TrialRunner  # noqa: E402
from gpufill.engine.hardware import cpu_count  # noqa: E402
from gpufill.forecasting.data import forecast_metrics  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402
from gpufill.forecasting.models.classical import train_classical  # noqa: E402
from gpufill.forecasting.task import predict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = {"smoke": 1, "quick": 3, "full": 5}
SMOKE_CAMPAIGN = """\
name: bench-cpu-smoke
data: {source: synthetic, projects: 2, length: 300, seed: 0}
task: {lookback: [12], horizon: 1, split: {val: 0.1, test: 0.2}}
models:
  mlp: {hidden_size: 16}
  linear: {}
train: {epochs: 2, early_stopping: null}
seeds: [0]
resources: {retries: 0}
"""


def trial_rows(campaign: Campaign) -> list[Trial]:
    """The campaign's trials as the scheduler hands them to a worker (its ids: data fingerprints included)."""
    spec = campaign.spec
    prints = {name: project.fingerprint() for name, project in spec.data.load(campaign.base_dir).items()}
    return expand(spec, prints)


def sequential(campaign: Campaign, threads: int, *, plain: bool) -> tuple[float, dict[str, float]]:
    """Every trial in order in this process; returns (seconds, trial_id -> test MAE). Data loading is inside the time."""
    started = time.perf_counter()
    runner = TrialRunner(campaign.spec.model_dump(mode="json"), campaign.base_dir, threads=threads, device="cpu")
    maes = {}
    for trial in trial_rows(campaign):
        if not plain:
            maes[trial.trial_id] = runner.run(trial).metrics["test"]["mae"]
            continue
        windows = runner.trial_windows(trial)
        if trial.kind == "classical":
            maes[trial.trial_id] = train_classical(windows, trial.family, trial.params, threads=threads, seed=trial.seed).test["mae"]
        else:
            maes[trial.trial_id] = _plain_neural(windows, trial, runner)
    return time.perf_counter() - started, maes


def _plain_neural(windows: Any, trial: Trial, runner: TrialRunner) -> float:
    config = runner.setup(trial).config  # the trial's epochs, lr, loss and patience
    torch.manual_seed(trial.seed)
    model = registry.build(trial.family, n_features=windows.n_features, lookback=windows.lookback, horizon=windows.horizon, params=trial.params)
    val = (windows.x_val, windows.y_val) if windows.x_val.shape[0] else None
    batch = config.batch_size if isinstance(config.batch_size, int) else 128
    baseline_fit(model, (windows.x_train, windows.y_train), val, epochs=config.epochs, loss=config.loss, lr=config.lr, batch_size=batch,
                 seed=trial.seed, patience=config.patience if val is not None else None)
    prediction = windows.inverse_target(predict(model, windows.x_test))
    return forecast_metrics(windows.test_truth, prediction, windows.mase_scale)["mae"]


def with_gpufill(campaign: Campaign) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    outcome = campaign.run(fresh=True)
    seconds = time.perf_counter() - started
    if outcome.failed:
        raise SystemExit(f"the campaign failed {outcome.failed} trials")
    results = campaign.results()
    return seconds, dict(zip(results["trial_id"], results["mae"], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="a 4-trial campaign, one round: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="the demo campaign, 3 rounds, one thread in-process")
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=None)
    parser.add_argument("--campaign", type=Path, default=None, help="default: examples/demo.yaml (--smoke: a generated 4-trial campaign)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    rounds = args.rounds or ROUNDS[size_name]
    threads = 1 if size_name != "full" else cpu_count()
    torch.set_num_threads(threads)
    env = environment("cpu")
    workdir = Path(tempfile.mkdtemp(prefix="gpufill-bench-"))
    try:
        path = args.campaign
        if path is None and args.smoke:
            path = workdir / "smoke.yaml"
            path.write_text(SMOKE_CAMPAIGN)
        path = path or ROOT / "examples" / "demo.yaml"
        campaign = Campaign.from_yaml(path, workdir / "work")
        arms: dict[str, Callable[[], tuple[float, dict[str, float]]]] = {
            "plain sequential": lambda: sequential(campaign, threads, plain=True),
            "sequential gpufill.fit": lambda: sequential(campaign, threads, plain=False),
            "gpufill": lambda: with_gpufill(campaign),
        }
        runs: dict[str, list[float]] = {name: [] for name in arms}
        maes: dict[str, dict[str, float]] = {}
        names = list(arms)
        for r in range(rounds):
            shift = r % len(names)  # each round starts with a different arm: drift hits all three alike
            for name in names[shift:] + names[:shift]:
                print(f"round {r + 1}/{rounds}: {name}", flush=True)
                seconds, maes[name] = arms[name]()
                runs[name].append(seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    n_trials = len(maes["gpufill"])
    if set(maes["gpufill"]) != set(maes["plain sequential"]):
        raise SystemExit("the campaign's trial ids differ from the sequential loops' (expand() without the data fingerprints?)")
    rows = []
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        rows.append({"loop": name, "trials": n_trials, "seconds": round(median, 2), "trials_per_min": round(60 * n_trials / median, 1),
                     "runs_s": [round(s, 2) for s in seconds]})

    def relative_differences(a: str, b: str) -> list[float]:
        return [abs(maes[a][t] - maes[b][t]) / abs(maes[b][t]) for t in maes[b]]

    def speed_ratio(other: str) -> float:
        """Median over rounds of gpufill's trials/min over `other`'s (= other's seconds / gpufill's)."""
        return statistics.median(o / g for g, o in zip(runs["gpufill"], runs[other], strict=True))

    ratios = {
        "trials_per_min_gpufill_over_plain_sequential": speed_ratio("plain sequential"),
        "trials_per_min_gpufill_over_sequential_fit": speed_ratio("sequential gpufill.fit"),
        "max_relative_mae_difference_vs_sequential_fit": max(relative_differences("gpufill", "sequential gpufill.fit")),
        "median_relative_mae_difference_vs_plain": statistics.median(relative_differences("gpufill", "plain sequential")),
        "mean_mae_gpufill_over_plain": statistics.fmean(maes["gpufill"].values()) / statistics.fmean(maes["plain sequential"].values()),
    }
    shown = "generated smoke campaign" if args.campaign is None and args.smoke else str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    run_args = {"size": size_name, "campaign": shown, "rounds": rounds, "threads_in_process": threads, "cores": cpu_count()}
    finish("campaign_cpu", "demo campaign, sequential loops vs gpufill", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
