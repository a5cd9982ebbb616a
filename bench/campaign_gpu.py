"""A campaign of same-shape trials the way gpufill's scheduler runs it, against the other ways to run them.

    python bench/campaign_gpu.py [--smoke | --quick] [--shapes lstm-h128-l30,...] [--projects P] [--seeds S] [--epochs E]
                                 [--procs 16] [--rounds N] [--device auto|cpu|cuda] [--out PATH]

Per shape (the ablation's: LSTM, GRU, TCN, Transformer; hidden 128 and 256; lookback 30 and
90), P projects x S seeds trials, each trained for E epochs, four ways, all in this run:

(campaign) `gpufill run` as a user runs it: `Campaign.run` on a campaign file, its scheduler
           choosing the pack size (measured, up to 64) and the GPU lane's concurrency;
(a) one at a time in one process (the campaign's own trial code, unfused);
(b) P concurrent processes, one trial each at a time (the guides' "16 at once");
(c) the same under CUDA MPS, where the daemon can be started here;
and, start-up included in both (the whole-process column: what a user waits for), `gpufill run FILE` in a fresh
process against (a) as a user's own script, a fresh process training the trials one at a time (bench/_one_at_a_time.py).

Per way: trials/hour, mean GPU utilisation (NVML "utilization.gpu": the share of time a
kernel ran; SM activity needs DCGM's profiling counters, not NVML, so it is not reported),
peak device memory used (NVML, whole device), and per shape the operators per training step
(about one kernel launch each) of one model and of the chosen pack. Agreement: the largest
relative difference of a trial's test MAE between the campaign and (a).

The ways interleave: each round runs every way, each round starting with a different one; a
row is the way's median round, a ratio the median over rounds of each round's ratio.
--smoke: one tiny MLP shape, 2 trials, one round (seconds, CI). --quick: CPU-sized (small
models, 8 projects x 2 seeds, 2 epochs, 2 processes), 3 rounds. On a CPU the process running
(a) is pinned to one thread under --smoke and --quick. Without CUDA the GPU figures are
empty and (c) is left out (said in the output).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import psutil
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish, timed_command  # noqa: E402

from gpufill.campaign.policy.admission import META_KEY, ShapeBook  # noqa: E402
from gpufill.campaign.run.runner import Campaign, read_results  # noqa: E402
from gpufill.campaign.trials.trials import Trial, expand  # noqa: E402
from gpufill.campaign.worker.worker import TrialRunner  # noqa: E402
from gpufill.monitor.summary import summarise  # noqa: E402
from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.engine.packs.size import measure_pack_size  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402
from gpufill.monitor.sampler import QueueSink, Sampler  # noqa: E402

SHAPES: dict[str, tuple[str, dict[str, Any], int]] = {
    "lstm-h128-l30": ("lstm", {"hidden_size": 128}, 30),
    "lstm-h256-l30": ("lstm", {"hidden_size": 256}, 30),
    "lstm-h128-l90": ("lstm", {"hidden_size": 128}, 90),
    "gru-h128-l30": ("gru", {"hidden_size": 128}, 30),
    "tcn-c128-l30": ("tcn", {"channels": 128}, 30),
    "transformer-d128-l30": ("transformer", {"d_model": 128, "nhead": 4, "num_layers": 2}, 30),
}
QUICK_SHAPES = {"lstm-h16-l12": ("lstm", {"hidden_size": 16}, 12), "mlp-h16-l12": ("mlp", {"hidden_size": 16}, 12)}
SMOKE_SHAPES = {"mlp-h8-l8": ("mlp", {"hidden_size": 8}, 8)}
SIZES = {  # shapes, projects, seeds, epochs, series length, rounds
    "smoke": (SMOKE_SHAPES, 2, 1, 1, 120, 1),
    "quick": (QUICK_SHAPES, 8, 2, 2, 300, 3),
    "full": (SHAPES, 64, 2, 5, 1000, 1),
}


class GpuWatch:
    """The campaign sampler (NVML) every 0.2 s while a block runs: mean utilisation and peak memory of GPU 0
    (None without a GPU)."""

    def __enter__(self) -> GpuWatch:
        self._rows = QueueSink()
        self._sampler = Sampler(interval=0.2, gpu_source="auto", sink=self._rows).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sampler.stop()

    def figures(self) -> dict[str, float | None]:
        gpu = summarise(self._rows.drain()).get("gpu0", {})
        peak = gpu.get("memory_used_gib_peak")
        return {"gpu_util_pct": gpu.get("util_percent_mean"), "peak_memory_mib": None if peak is None else round(peak * 1024, 1)}


def campaign_file(folder: Path, name: str, family: str, params: dict[str, Any], lookback: int, projects: int, seeds: int, length: int, epochs: int) -> Path:
    inline = ", ".join(f"{k}: {v}" for k, v in params.items())
    path = folder / f"{name}.yaml"
    path.write_text("\n".join([
        f"name: bench-{name}",
        f"data: {{source: synthetic, projects: {projects}, length: {length}, seed: 0}}",
        f"task: {{lookback: [{lookback}], horizon: 1}}",
        "models:",
        f"  {family}: {{{inline}}}",
        f"train: {{epochs: {epochs}}}",
        f"seeds: [{', '.join(str(s) for s in range(seeds))}]",
        "resources: {retries: 0}",
    ]) + "\n")
    return path


def the_campaign(path: Path, workdir: Path) -> tuple[float, dict[str, float], dict[str, Any]]:
    """`gpufill run`'s own path; (seconds, test MAE per trial, what the scheduler chose)."""
    campaign = Campaign.from_yaml(path, workdir)
    lanes: list[str] = []
    tick = time.perf_counter()
    outcome = campaign.run(on_start=lambda prepared, run_id: lanes.extend(f"{lane.name}: {lane.slots} slots" for lane in prepared.lanes))
    seconds = time.perf_counter() - tick
    results = read_results(workdir)
    assert outcome.failed == 0, f"{outcome.failed} trials failed"
    from gpufill.campaign.store.store import Store

    store = Store.open(workdir)
    try:
        book = ShapeBook.from_json(store.meta(META_KEY))
    finally:
        store.close()
    sizes = sorted({fact.pack_size for fact in book.facts.values() if fact.pack_size})
    reasons = [fact.reason for fact in book.facts.values()]
    return seconds, dict(zip(results["trial_id"], results["mae"], strict=True)), {"lanes": lanes, "pack_sizes": sizes, "pack_reason": reasons}


_RUNNER: TrialRunner | None = None


def _start(payload: dict[str, Any], base_dir: str, device: str, threads: int) -> None:
    global _RUNNER
    torch.set_num_threads(threads)
    _RUNNER = TrialRunner(payload, Path(base_dir), threads=threads, device=device)


def _one(trial: Trial) -> tuple[str, float]:
    assert _RUNNER is not None
    return trial.trial_id, _RUNNER.run(trial).metrics["test"]["mae"]


def one_at_a_time(payload: dict[str, Any], base_dir: str, trials: list[Trial], device: str) -> tuple[float, dict[str, float]]:
    _start(payload, base_dir, device, torch.get_num_threads())
    tick = time.perf_counter()
    maes = dict(_one(t) for t in trials)
    return time.perf_counter() - tick, maes


def processes(payload: dict[str, Any], base_dir: str, trials: list[Trial], device: str, procs: int, env: dict[str, str] | None = None) -> tuple[float, dict[str, float]]:
    threads = 1 if device.startswith("cuda") else max(1, psutil.cpu_count(logical=True) // procs)
    with _environment(env or {}):
        tick = time.perf_counter()
        with ProcessPoolExecutor(max_workers=procs, mp_context=get_context("spawn"), initializer=_start, initargs=(payload, base_dir, device, threads)) as pool:
            maes = dict(pool.map(_one, trials))
        return time.perf_counter() - tick, maes


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def mps_daemon(folder: Path) -> Iterator[dict[str, str] | str]:
    """CUDA MPS for this run's processes: yields their environment, or why it could not start."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        yield "nvidia-cuda-mps-control not found"
        return
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "mps-log")}
    for directory in env.values():
        Path(directory).mkdir(parents=True, exist_ok=True)
    started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True)
    if started.returncode != 0:
        yield f"MPS daemon did not start: {(started.stderr or started.stdout).strip()[:160]}"
        return
    try:
        yield env
    finally:
        subprocess.run([control], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True)


def ops_per_step(family: str, params: dict[str, Any], lookback: int, pack: int, device: str) -> dict[int, int]:
    def build() -> torch.nn.Module:
        return registry.build(family, n_features=1, lookback=lookback, horizon=1, params=params)

    sample = (torch.randn(256, lookback, 1), torch.randn(256, 1))
    sizes = (1, pack) if pack > 1 else (1, 2)
    return measure_pack_size(build, sample, batch=128, device=device, candidates=sizes, steps=1, count=True, min_gain=None).ops_per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="one tiny MLP shape, 2 trials, one round: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="CPU-sized: small models, 8 projects x 2 seeds, 2 epochs, 2 processes, 3 rounds")
    parser.add_argument("--shapes", default=None, help=f"comma-separated, of: {', '.join(SHAPES)} (default: all; --quick: {', '.join(QUICK_SHAPES)})")
    parser.add_argument("--projects", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--length", type=int, default=None, help="series length (default 1000; --quick 300)")
    parser.add_argument("--procs", type=int, default=None, help="concurrent processes for (b), (c): 16 on a GPU, the core count on a CPU")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 1; --quick 3)")
    parser.add_argument("--skip", default="", help="ways to leave out, comma-separated: one,procs,mps,whole")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    shapes, projects, seeds, epochs, length, rounds = SIZES[size_name]
    device = str(resolve_device(args.device))
    if device == "cpu" and size_name != "full":
        torch.set_num_threads(1)
    catalogue = {**SHAPES, **QUICK_SHAPES, **SMOKE_SHAPES}
    names = args.shapes.split(",") if args.shapes else list(shapes)
    unknown = sorted(set(names) - set(catalogue))
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}: use {', '.join(catalogue)}")
    projects, seeds = args.projects or projects, args.seeds or seeds
    epochs, length, rounds = args.epochs or epochs, args.length or length, args.rounds or rounds
    procs = args.procs or (16 if device.startswith("cuda") else min(2, psutil.cpu_count(logical=True)))
    skip = set(filter(None, args.skip.split(",")))
    left_out = []
    if not device.startswith("cuda"):
        left_out.append(f"no CUDA device ({device}): the GPU utilisation and memory columns are empty and way (c), MPS, is left out")
    left_out += [f"way {way!r} left out (--skip)" for way in sorted(skip)]
    for line in left_out:
        print(f"note: {line}", flush=True)
    env = environment(device)
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gpufill-campaign-gpu-") as scratch:
        folder = Path(scratch)
        for name in names:
            family, params, lookback = catalogue[name]
            path = campaign_file(folder, name, family, params, lookback, projects, seeds, length, epochs)
            spec = Campaign.from_yaml(path, folder / f"work-{name}-spec").spec
            payload, base_dir = spec.model_dump(mode="json"), str(path.parent)
            trials = expand(spec, {p: project.fingerprint() for p, project in spec.load_projects().items()})  # the campaign's ids
            n = len(trials)
            ways: dict[str, Any] = {}

            def campaign_way(r: int, name: str = name, path: Path = path) -> tuple[float, dict[str, float], Any]:
                return the_campaign(path, folder / f"work-{name}-{r}")  # a fresh store each round

            ways["gpufill campaign"] = campaign_way
            if "one" not in skip:
                ways["one at a time"] = lambda r, payload=payload, base_dir=base_dir, trials=trials: (*one_at_a_time(payload, base_dir, trials, device), None)
            if "whole" not in skip:  # as a user runs each: a fresh process, start-up included
                ways[WHOLE_CAMPAIGN] = lambda r, name=name, path=path: (*whole_campaign(path, folder / f"work-{name}-whole-{r}"), None)
                if "one" not in skip:
                    ways[WHOLE_ONE] = lambda r, path=path: (*whole_one_at_a_time(path, device), None)
            if "procs" not in skip:
                ways[f"{procs} processes"] = lambda r, payload=payload, base_dir=base_dir, trials=trials: (*processes(payload, base_dir, trials, device, procs), None)
            if "mps" not in skip and device.startswith("cuda"):
                ways[f"{procs} processes + MPS"] = lambda r, payload=payload, base_dir=base_dir, trials=trials: mps_way(folder, payload, base_dir, trials, device, procs)
            measured: dict[str, list[tuple[float | None, dict[str, float], Any, dict[str, Any]]]] = {way: [] for way in ways}
            order = list(ways)
            for r in range(rounds):
                shift = r % len(order)  # each round starts with a different way: drift hits every way alike
                for way in order[shift:] + order[:shift]:
                    print(f"{name}: round {r + 1}/{rounds}: {way}", flush=True)
                    with GpuWatch() as watch:
                        seconds, maes, extra = ways[way](r)
                    measured[way].append((seconds, maes, extra, watch.figures()))
            campaign_runs = measured["gpufill campaign"]
            chosen = median_run(campaign_runs)[2]
            pack = max(chosen["pack_sizes"] or [1])
            ops = ops_per_step(family, params, lookback, pack, device)
            for way, runs in measured.items():
                seconds, _maes, extra, figures = median_run(runs)
                is_campaign = way == "gpufill campaign"
                rows.append({"config": name, "way": way, "trials": n, "seconds": None if seconds is None else round(seconds, 2),
                             "trials_per_hour": None if seconds is None else round(3600 * n / seconds), **figures,
                             "pack_size": pack if is_campaign else 1, "ops_per_step": ops.get(pack if is_campaign else 1),
                             "chosen": extra if isinstance(extra, dict) else {"not_run": extra} if extra else {}, "runs_s": [None if s is None else round(s, 2) for s, *_ in runs]})
                if way == WHOLE_ONE and WHOLE_CAMPAIGN in measured:
                    ratios[f"{name}: whole process: gpufill run vs one at a time"] = statistics.median(
                        o[0] / c[0] for o, c in zip(runs, measured[WHOLE_CAMPAIGN], strict=True))
                if is_campaign or way in (WHOLE_CAMPAIGN, WHOLE_ONE) or any(s is None for s, *_ in runs):
                    continue
                ratios[f"{name}: campaign vs {way}"] = statistics.median(o[0] / c[0] for o, c in zip(runs, campaign_runs, strict=True))
                if way == "one at a time":
                    ratios[f"{name}: max relative test-MAE difference campaign vs one at a time"] = max(
                        abs(c[1][t] - o[1][t]) / abs(o[1][t]) for o, c in zip(runs, campaign_runs, strict=True) for t in o[1])
    run_args = {"size": size_name, "shapes": {n: catalogue[n] for n in names}, "projects": projects, "seeds": seeds, "epochs": epochs,
                "series_length": length, "procs": procs, "rounds": rounds, "device": device, "threads": torch.get_num_threads(),
                "skip": sorted(skip), "left_out": left_out}
    finish("campaign_gpu", "a campaign as gpufill's scheduler runs it vs one at a time vs concurrent processes (vs MPS)", env, run_args, rows, ratios, args.out)


WHOLE_CAMPAIGN, WHOLE_ONE = "gpufill run (whole process)", "one at a time (whole process)"


def whole_campaign(path: Path, workdir: Path) -> tuple[float, dict[str, float]]:
    """`gpufill run FILE` in a fresh process: (wall seconds, test MAE per trial)."""
    seconds, _ = timed_command([sys.executable, "-m", "gpufill", "run", str(path), "--workdir", str(workdir), "--fresh", "--yes"])
    results = read_results(workdir)
    return seconds, dict(zip(results["trial_id"], results["mae"], strict=True))


def whole_one_at_a_time(path: Path, device: str) -> tuple[float, dict[str, float]]:
    """bench/_one_at_a_time.py in a fresh process, at the threads of the in-process way: (wall seconds, test MAE per trial)."""
    seconds, out = timed_command([sys.executable, str(Path(__file__).parent / "_one_at_a_time.py"), str(path), device, str(torch.get_num_threads())])
    return seconds, json.loads(out.strip().splitlines()[-1])


def median_run(runs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The round of median seconds (a way that could not run, None seconds, keeps its first)."""
    timed = [run for run in runs if run[0] is not None]
    return sorted(timed, key=lambda run: run[0])[len(timed) // 2] if timed else runs[0]


def mps_way(folder: Path, payload: dict[str, Any], base_dir: str, trials: list[Trial], device: str, procs: int) -> tuple[float | None, dict[str, float], Any]:
    """(c): the processes of (b) under an MPS daemon started for this run; (None, {}, why) where it cannot start."""
    with mps_daemon(folder) as mps:
        if isinstance(mps, str):
            return None, {}, mps
        return (*processes(payload, base_dir, trials, device, procs, env=mps), None)


if __name__ == "__main__":
    main()
