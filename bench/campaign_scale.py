"""The scheduler and the readers at campaign scale: 36,000 trials.

    python bench/campaign_scale.py [--smoke | --quick] [--trials N] [--repeats N] [--out PATH]

A campaign of 100 synthetic projects x 18 configurations (linear and mlp grids) x 2 lookbacks x
10 seeds is registered and dispatched by a real run (`Campaign.run`: the lock, the store, the sampler,
the scheduler) in a fresh process, against an executor that finishes every task
at once with a fixed result: what is measured is the scheduler's own cost, not training. Then
`gpufill status`, `gpufill results` and `gpufill results --summary` are timed on the full store
(fresh processes, imports included: what a user waits for), interleaved: each round runs the
three commands, each round starting with a different one; each figure is the median over rounds.
--smoke: 360 trials, one round (seconds, CI); --quick: 3,600 trials, 3 rounds; default 36,000, 3.
Nothing here trains (no torch threads to pin); the targets are for the full size.

Targets (issue 13): registered and first task dispatched < 5 s after imports; scheduler RSS
< 300 MB (its peak, the kernel's high-water mark; imports_rss_mb: what the imports alone hold, torch's
most of it); status < 0.5 s (issue 57) and results < 1 s. Before the per-shape queue, a 36,000-trial campaign spent
42 s of each minute picking the next trial; `status`/`results` took 8 s (mostly imports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

TARGETS = {"first_dispatch_s": 5.0, "scheduler_rss_mb": 300.0, "status_s": 0.5, "results_s": 1.0}
SIZES = [8, 12, 16, 24, 32, 48, 64, 96, 128]
ALPHAS = [0.0, 0.001, 0.01, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0]
PER_PROJECT = 2 * len(SIZES) * 2 * 10  # families' grids x lookbacks x seeds: 360
RUNS = {"smoke": (PER_PROJECT, 1), "quick": (10 * PER_PROJECT, 3), "full": (36_000, 3)}
"""size -> (trials, rounds of the reader commands)."""


def write_campaign(folder: Path, trials: int) -> Path:
    projects = max(1, trials // PER_PROJECT)
    path = folder / "scale.yaml"
    path.write_text(
        "name: scale\n"
        f"data: {{source: synthetic, projects: {projects}, length: 300, seed: 0}}\n"
        "task: {lookback: [12, 24], horizon: 1}\n"
        f"models:\n  linear: {{alpha: {ALPHAS}}}\n  mlp: {{hidden_size: {SIZES}}}\n"
        "train: {epochs: 2, early_stopping: null}\n"
        f"seeds: {list(range(10))}\n"
        "resources: {retries: 0, cpu_slots: 2}\n"
    )
    return path


def scheduler_phase(path: Path, workdir: Path) -> dict[str, float]:
    """Runs in its own process: imports, then registration, dispatch of every trial, and the costs."""
    import resource

    import psutil

    started_imports = time.perf_counter()
    from gpufill.campaign.run import runner
    from gpufill.campaign.executors.base import Finished, Slots, Worker
    from gpufill.campaign.policy.messages import Outcome, TaskEnded
    from gpufill.campaign.run.runner import Campaign
    from gpufill.campaign.run.scheduler import Scheduler

    imports_s = time.perf_counter() - started_imports
    process = psutil.Process()
    imports_rss = process.memory_info().rss  # the floor: the interpreter, torch (the spec and the lanes import it) and the rest
    marks: dict[str, float] = {}
    metrics = {"mae": 1.0, "rmse": 1.0, "smape": 1.0, "mase": 1.0}
    from gpufill.forecasting.trial import TrialResult

    result = TrialResult(project="", family="", params={}, status="completed", plan={}, metrics={"test": metrics, "naive": metrics}, timings={})

    class InstantExecutor(Slots):
        """Every submitted task finishes at the next poll: the scheduler's cost alone."""

        def __init__(self):
            self.workers: list[Worker] = []

        def plan(self, request):
            from gpufill.campaign.executors.local import plan_here
            return plan_here(request)

        def hand_data(self, projects):
            return None  # its workers train nothing

        def warm(self, lanes, check=None):
            return None  # nothing to begin early: its workers are plain objects

        def start(self, lanes):
            self.workers += [Worker(name=f"{lane.name}-{i}", lane=lane) for lane in lanes for i in range(lane.slots)]

        def submit(self, worker, task):
            if "first_dispatch" not in marks:
                marks["first_dispatch"] = time.perf_counter()
                marks["rss_first"] = process.memory_info().rss
            worker.begin(task)

        def poll(self, timeout):
            out = []
            for worker in self.busy():
                task, worker.task = worker.task, None
                outcomes = tuple(Outcome(trial_id=t.trial_id, ok=True, result=result, seconds=0.01) for t in task.trials)
                out.append(Finished(worker, task, TaskEnded(outcomes, pack={"size": len(task.trials), "reason": "bench"})))
            return out

        def stop(self, worker, reason):
            pass

        def jobs(self):
            return []

        def cancel_jobs(self, job_ids):
            pass

        def pids(self):
            return []

        def shutdown(self):
            pass

    picking = [0.0]
    original = Scheduler._next_task

    def timed_next_task(self, lane, worker):
        began = time.perf_counter()
        try:
            return original(self, lane, worker)
        finally:
            picking[0] += time.perf_counter() - began

    Scheduler._next_task = timed_next_task  # type: ignore[method-assign]
    runner.make_executor = lambda *args, **kwargs: InstantExecutor()  # the real run, but tasks finish at once
    registered: list[float] = []
    t0 = time.perf_counter()
    campaign = Campaign.from_yaml(path, workdir)
    outcome = campaign.run(on_start=lambda prepared, run_id: registered.append(time.perf_counter()))  # the run's own path: lock, store, sampler
    finished = time.perf_counter()
    # The process's true peak (the kernel's high-water mark; KiB on Linux), not RSS sampled at two moments.
    peak = max(process.memory_info().rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024))
    return {
        "trials": outcome.done,
        "imports_s": round(imports_s, 2),
        "registered_s": round(registered[0] - t0, 2),
        "first_dispatch_s": round(marks["first_dispatch"] - t0, 2),
        "imports_rss_mb": round(imports_rss / 2**20, 1),
        "scheduler_rss_mb": round(max(marks["rss_first"], peak) / 2**20, 1),
        "dispatch_all_s": round(finished - registered[0], 1),
        "trials_per_s": round(outcome.done / (finished - registered[0]), 1),
        "picking_share": round(picking[0] / (finished - registered[0]), 4),
    }


def timed_commands(commands: dict[str, list[str]], rounds: int) -> dict[str, float]:
    """Median wall seconds of each command, run as a fresh process; interleaved, each round starting with a different one."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            began = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gpufill.cli", *commands[name]], check=True, capture_output=True)
            times[name].append(time.perf_counter() - began)
    return {name: round(statistics.median(values), 2) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="360 trials, one round of the readers: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="3,600 trials, 3 rounds")
    parser.add_argument("--trials", type=int, default=None, help="default 36,000 (--quick 3,600, --smoke 360)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of the reader commands (default 3, --smoke 1)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "scheduler":  # the child process
        print(json.dumps(scheduler_phase(args.folder / "scale.yaml", args.folder / "work")))
        return

    from _common import environment, finish

    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    trials, rounds = RUNS[size_name]
    trials, rounds = args.trials or trials, args.repeats or rounds
    with tempfile.TemporaryDirectory(prefix="gpufill-scale-") as tmp:
        folder = Path(tmp)
        write_campaign(folder, trials)
        child = subprocess.run([sys.executable, __file__, "--phase", "scheduler", "--folder", str(folder)], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH.parent / "src"), os.environ.get("PYTHONPATH")]))})
        if child.returncode != 0:
            sys.exit(f"the scheduler phase failed:\n{child.stderr[-3000:]}")
        figures = json.loads(child.stdout.strip().splitlines()[-1])
        work = str(folder / "work")
        readers = timed_commands({"status_s": ["status", "--workdir", work], "results_s": ["results", "--workdir", work],
                                  "results_summary_s": ["results", "--summary", "--workdir", work]}, rounds)
        figures.update(readers)
        figures["store_mb"] = round((folder / "work" / "gpufill.db").stat().st_size / 2**20, 1)
    rows = [{"figure": name, "value": value, "target": TARGETS.get(name, "-"),
             "ok": ("yes" if value < TARGETS[name] else "NO") if name in TARGETS else "-"} for name, value in figures.items()]
    ratios = {f"{name} / target": figures[name] / target for name, target in TARGETS.items()}
    run_args = {"size": size_name, "trials": trials, "rounds": rounds}
    finish("campaign_scale", f"{figures['trials']} trials: the scheduler and the readers", environment("cpu"), run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
