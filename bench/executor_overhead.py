"""What an executor costs per trial: trials that do nothing, through local worker processes and Ray actors.

    python bench/executor_overhead.py [--smoke | --quick] [--trials N] [--repeats N] [--executors local,local-fresh,ray] [--out PATH]

A campaign of N trials of a model that does nothing (bench/_noop_model.py: a classical
family whose fit is a no-op), on a tiny synthetic project set, runs through each executor
with one slot per core. Per-trial overhead = (wall time of N trials - wall time of one
trial per slot) / (N - slots): the second run holds the fixed costs (worker or actor
start-up, loading the data, shutdown), so what is left is what each further trial costs
(scheduling, the store's writes, sending the task, running the trivial trial, the result
coming back), spread over the slots as in a real campaign. Ray is started once, before
the timed runs (its own start-up is the "ray.init" row); its actors are started per
campaign, as a real run does. Each configuration's best repeat is reported (other load
on the machine only ever adds time). Targets: local < 5 ms, Ray < 50 ms per trial.
`local` forks its workers from each lane's zygote (one import of torch per lane); `local-fresh` starts each as a fresh
interpreter (GPUFILL_FRESH_WORKERS=1, the executor before the zygote): their start-up rows and the forked / fresh
ratios (CPU seconds of the process and the workers it waited for, and wall) compare the two. Ray's actors are not
this process's children, so its start-up CPU is not counted.
The executors interleave: each repeat runs every executor, each repeat starting with a
different one; the Ray / local ratio is the median of per-repeat ratios.

--smoke: 6 trials, one repeat (seconds, CI: about 7 s local, 10 s more for Ray's start-up on
2 cores); --quick: 200 trials, 3 repeats. Where Ray does not import, it is left out and the
output says so. The trials train nothing, so there are no torch threads to pin.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
# Local workers import the no-op model by name: give them bench/ too (Ray passes the driver's path on).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH", "")]))

from _common import environment, finish

from gpufill.campaign.executors.forked import FRESH_WORKERS_VARIABLE
from gpufill.campaign.run.runner import Campaign, read_results
from gpufill.engine.hardware import cpu_count

TARGET_MS = {"local": 5.0, "local-fresh": 5.0, "ray": 50.0}
SIZES = {"smoke": (6, 2, 1, "local,local-fresh,ray"), "quick": (200, 10, 3, "local,local-fresh,ray"), "full": (1000, 10, 3, "local,local-fresh,ray")}
"""size -> (trials, projects, repeats, executors)."""


def write_campaign(folder: Path, trials: int, projects: int, slots: int) -> Path:
    seeds = list(range(max(1, trials // projects)))
    path = folder / f"overhead-{trials}.yaml"
    path.write_text(
        "name: overhead\n"
        f"data: {{source: synthetic, projects: {min(projects, trials)}, length: 60, seed: 0}}\n"
        "task: {lookback: [4], horizon: 1}\n"
        "models: {'_noop_model:noop': {}}\n"
        f"seeds: {seeds}\n"
        f"resources: {{cpu_slots: {slots}, retries: 0}}\n"
    )
    return path


def cpu_seconds() -> float:
    """CPU seconds of this process and of every descendant waited for (a zygote includes the workers it reaped)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_run(folder: Path, trials: int, projects: int, slots: int, executor: str) -> tuple[float, float, float]:
    """(wall seconds of Campaign.run, its CPU seconds with the workers', mean seconds a worker spent in one trial).
    `local-fresh` is the local executor with every worker a fresh interpreter (GPUFILL_FRESH_WORKERS=1), `local` forks
    them from each lane's zygote."""
    workdir = folder / f"work-{executor}-{trials}"
    shutil.rmtree(workdir, ignore_errors=True)
    campaign = Campaign.from_yaml(write_campaign(folder, trials, projects, slots), workdir)
    if executor == "local-fresh":
        os.environ[FRESH_WORKERS_VARIABLE] = "1"
    started, cpu_before = time.perf_counter(), cpu_seconds()
    try:
        outcome = campaign.run(executor="local" if executor == "local-fresh" else executor)
    finally:
        os.environ.pop(FRESH_WORKERS_VARIABLE, None)
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    expected = min(projects, trials) * max(1, trials // projects)
    assert outcome.done == expected and outcome.failed == 0, outcome
    return wall, cpu, float(read_results(workdir)["duration_s"].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="6 trials, one repeat: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="200 trials, 3 repeats")
    parser.add_argument("--trials", type=int, default=None, help="default 1000 (--quick 200, --smoke 6)")
    parser.add_argument("--projects", type=int, default=None, help="trials are projects x seeds (default 10; --smoke 2)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3; --smoke 1)")
    parser.add_argument("--executors", default=None, help="default local,ray")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    trials, projects, repeats, executors_text = SIZES[size_name]
    trials, projects, repeats = args.trials or trials, args.projects or projects, args.repeats or repeats
    executors = [name.strip() for name in (args.executors or executors_text).split(",") if name.strip()]
    left_out = []
    if "ray" in executors:
        try:
            import ray  # noqa: F401
        except ImportError as error:
            executors.remove("ray")
            left_out.append(f"ray: left out, it does not import here ({error})")
    for line in left_out:
        print(f"note: {line}", flush=True)
    if not executors:
        raise SystemExit("no executor to measure")
    slots = cpu_count()
    n = min(projects, trials) * max(1, trials // projects)
    if n <= slots:
        raise SystemExit(f"{n} trials on {slots} slots: pass more than {slots} trials (the overhead is what trials beyond one per slot cost)")
    env = environment("cpu")

    ray_init_s = None
    if "ray" in executors:
        import ray

        started = time.perf_counter()
        ray.init(num_cpus=slots, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray_init_s = time.perf_counter() - started

    walls: dict[str, list[float]] = {name: [] for name in executors}
    fixed: dict[str, list[float]] = {name: [] for name in executors}
    fixed_cpu: dict[str, list[float]] = {name: [] for name in executors}
    inside: dict[str, list[float]] = {name: [] for name in executors}
    with tempfile.TemporaryDirectory(prefix="gpufill-overhead-") as tmp:
        folder = Path(tmp)
        for r in range(repeats):
            shift = r % len(executors)  # each repeat starts with a different executor: drift hits both alike
            for executor in executors[shift:] + executors[:shift]:
                print(f"repeat {r + 1}/{repeats}: {executor}", flush=True)
                start_wall, start_cpu, _ = timed_run(folder, slots, 1, slots, executor)
                fixed[executor].append(start_wall)
                fixed_cpu[executor].append(start_cpu)
                wall, _, trial_s = timed_run(folder, trials, projects, slots, executor)
                walls[executor].append(wall)
                inside[executor].append(trial_s)
    rows, per_trial = [], {}
    per_round: dict[str, list[float]] = {}
    for executor in executors:
        best_wall, best_fixed = min(walls[executor]), min(fixed[executor])
        overhead_ms = 1e3 * (best_wall - best_fixed) / (n - slots)
        per_trial[executor] = overhead_ms
        per_round[executor] = [1e3 * (w - f) / (n - slots) for w, f in zip(walls[executor], fixed[executor], strict=True)]
        rows.append({
            "config": executor, "trials": n, "slots": slots, "wall_s": round(best_wall, 3), "startup_s": round(best_fixed, 3),
            "startup_cpu_s": None if executor == "ray" else round(statistics.median(fixed_cpu[executor]), 3),
            "per_trial_ms": round(overhead_ms, 3), "per_trial_ms_median": round(statistics.median(per_round[executor]), 3),
            "target_ms": TARGET_MS.get(executor), "meets_target": overhead_ms < TARGET_MS.get(executor, float("inf")),
            "trial_work_ms": round(1e3 * min(inside[executor]), 4), "trials_per_s": round(n / best_wall, 1),
            "wall_s_per_repeat": [round(w, 3) for w in walls[executor]], "startup_s_per_repeat": [round(f, 3) for f in fixed[executor]],
        })
    if ray_init_s is not None:
        import ray

        ray.shutdown()
        rows.append({**dict.fromkeys(rows[0]), "config": "ray.init", "startup_s": round(ray_init_s, 3),
                     "wall_s_per_repeat": [], "startup_s_per_repeat": []})
    ratios = {}
    if "local" in per_trial and "ray" in per_trial:
        ratios["ray / local per-trial overhead"] = statistics.median(r / l for r, l in zip(per_round["ray"], per_round["local"], strict=True))
    if "local" in per_trial and "local-fresh" in per_trial:  # the workers' start: forked from a zygote, or fresh
        ratios["local start-up CPU, forked / fresh workers"] = statistics.median(
            f / r for f, r in zip(fixed_cpu["local"], fixed_cpu["local-fresh"], strict=True))
        ratios["local start-up wall, forked / fresh workers"] = statistics.median(
            f / r for f, r in zip(fixed["local"], fixed["local-fresh"], strict=True))
    for executor, value in per_trial.items():
        ratios[f"{executor} per-trial overhead / {TARGET_MS.get(executor)} ms target"] = value / TARGET_MS.get(executor, value)
    run_args = {"size": size_name, "trials": trials, "projects": projects, "repeats": repeats, "executors": executors, "left_out": left_out,
                "model": "_noop_model:noop"}
    finish("executor_overhead", "per-trial cost of each executor (trials that do nothing)", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
