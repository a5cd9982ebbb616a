"""N same-shape trials three ways: one at a time, as P concurrent processes, as fused packs.

    python bench/campaign_gpu.py [--quick] [--families lstm,gru,tcn,transformer] [--trials N]
                                 [--procs P] [--pack K] [--device auto|cpu|cuda] [--out PATH]

(a) one at a time: `gpufill.fit` per trial in this process;
(b) P concurrent worker processes, one trial each at a time (the guides' "run 16 at once");
(c) fused packs of K trials (`gpufill.engine.packs.train.fit_pack`) in this process.
Each trial is one project with its own seed. Reported per family and way: trials/hour,
mean GPU utilisation (NVML; "n/a" without a GPU), peak memory, the ratios against (a)
and (b), and how closely the per-trial test MAE of (c) matches (a). Defaults follow the
issue (64 trials, hidden 128, lookback 60, 16 processes); --quick shrinks them for a CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import psutil
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.forecasting.data import forecast_metrics, load_projects, make_windows  # noqa: E402
from gpufill.engine.config import FitConfig  # noqa: E402
from gpufill.forecasting.task import predict, train_forecaster  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402
from gpufill.engine.packs.train import PackMember, fit_pack  # noqa: E402

PARAMS = {"lstm": {"hidden_size": 128}, "gru": {"hidden_size": 128}, "tcn": {"channels": 128}, "transformer": {"d_model": 128, "nhead": 4, "num_layers": 2}}
QUICK_PARAMS = {"lstm": {"hidden_size": 32}, "gru": {"hidden_size": 32}, "tcn": {"channels": 32}, "transformer": {"d_model": 32, "nhead": 4, "num_layers": 1}}


class Utilisation:
    """Mean GPU utilisation while a block runs, sampled through NVML every 0.2 s (None without NVML)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def __enter__(self) -> Utilisation:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._nvml is not None:
            self._thread.join()

    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def _trial(args: tuple[str, dict[str, Any], int, int, int, int, str, int]) -> tuple[float, float]:
    """One trial in a worker process: (test MAE, peak memory in MiB)."""
    family, params, seed, lookback, length, epochs, device, threads = args
    torch.set_num_threads(threads)
    project = load_projects("synthetic", n_projects=seed + 1, length=length, seed=0, projects=[f"p{seed:03d}"])[f"p{seed:03d}"]
    windows = make_windows(project, lookback, 1)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    run = train_forecaster(windows, family, params, config=FitConfig(epochs=epochs, seed=seed, device=device))
    peak = torch.cuda.max_memory_reserved() / 2**20 if device.startswith("cuda") else psutil.Process().memory_info().rss / 2**20
    return run.test["mae"], peak


def one_at_a_time(family, params, windows, epochs, device) -> tuple[float, list[float], float]:
    maes = []
    start = time.perf_counter()
    for seed, w in enumerate(windows):
        maes.append(train_forecaster(w, family, params, config=FitConfig(epochs=epochs, seed=seed, device=device)).test["mae"])
    return time.perf_counter() - start, maes, _peak(device)


def concurrent(family, params, n, lookback, length, epochs, device, procs) -> tuple[float, list[float], float]:
    threads = 1 if device.startswith("cuda") else max(1, psutil.cpu_count(logical=True) // procs)
    jobs = [(family, params, seed, lookback, length, epochs, device, threads) for seed in range(n)]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=procs, mp_context=get_context("spawn")) as pool:
        out = list(pool.map(_trial, jobs))
    # Peak: all processes hold their memory (and, on a GPU, their own CUDA context) at once.
    return time.perf_counter() - start, [m for m, _ in out], max(p for _, p in out) * min(procs, n)


def packed(family, params, windows, epochs, device, pack) -> tuple[float, list[float], float]:
    maes = []
    start = time.perf_counter()
    for first in range(0, len(windows), pack):
        chunk = windows[first : first + pack]
        models, members = [], []
        for seed, w in enumerate(chunk, start=first):
            torch.manual_seed(seed)
            models.append(registry.build(family, n_features=w.n_features, lookback=w.lookback, horizon=w.horizon, params=params))
            members.append(PackMember(train=(w.x_train, w.y_train), val=(w.x_val, w.y_val), lr=1e-3, weight_decay=0.0, seed=seed))
        for w, fitted in zip(chunk, fit_pack(models, members, config=FitConfig(epochs=epochs, device=device)), strict=True):
            prediction = w.inverse_target(predict(fitted.model, w.x_test, dtype=fitted.plan.autocast_dtype))
            maes.append(forecast_metrics(w.test_truth, prediction, w.mase_scale)["mae"])
    return time.perf_counter() - start, maes, _peak(device)


def _peak(device: str) -> float:
    if device.startswith("cuda"):
        value = torch.cuda.max_memory_reserved() / 2**20
        torch.cuda.reset_peak_memory_stats()
        return value
    return psutil.Process().memory_info().rss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU-sized: 8 trials, small models, lookback 30, 2 epochs")
    parser.add_argument("--families", default="lstm,gru,tcn,transformer")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--procs", type=int, default=None, help="concurrent processes for (b): 16 on a GPU, the core count on a CPU")
    parser.add_argument("--pack", type=int, default=None, help="models per fused pack (default: all trials, up to 64)")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = str(resolve_device(args.device))
    n = args.trials or (8 if args.quick else 64)
    lookback, length, epochs = (30, 600, args.epochs or 2) if args.quick else (60, 2000, args.epochs or 5)
    procs = args.procs or (16 if device.startswith("cuda") else psutil.cpu_count(logical=True))
    pack = args.pack or min(n, 64)
    params_by_family = QUICK_PARAMS if args.quick else PARAMS
    env = environment(device)
    projects = load_projects("synthetic", n_projects=n, length=length, seed=0)
    windows = [make_windows(p, lookback, 1) for p in projects.values()]
    rows, ratios = [], {}
    for family in args.families.split(","):
        params = params_by_family[family]
        measured = {}
        for way, run in (
            ("one at a time", lambda: one_at_a_time(family, params, windows, epochs, device)),
            (f"{procs} processes", lambda: concurrent(family, params, n, lookback, length, epochs, device, procs)),
            (f"fused packs of {pack}", lambda: packed(family, params, windows, epochs, device, pack)),
        ):
            with Utilisation() as gpu:
                seconds, maes, peak = run()
            measured[way] = (seconds, maes)
            rows.append({"config": family, "way": way, "trials": n, "seconds": round(seconds, 2), "trials_per_hour": round(3600 * n / seconds, 1),
                         "gpu_util_pct": None if gpu.mean() is None else round(gpu.mean(), 1), "peak_memory_mib": round(peak, 1)})
        (t_one, mae_one), (t_procs, _), (t_pack, mae_pack) = measured.values()
        ratios[f"{family}: fused vs one at a time"] = t_one / t_pack
        ratios[f"{family}: fused vs {procs} processes"] = t_procs / t_pack
        ratios[f"{family}: max relative MAE difference fused vs one at a time"] = max(abs(a - b) / abs(b) for a, b in zip(mae_pack, mae_one, strict=True))
    run_args = {"trials": n, "lookback": lookback, "series_length": length, "epochs": epochs, "procs": procs, "pack": pack, "quick": args.quick, "device": device,
                "params": {f: params_by_family[f] for f in args.families.split(",")}}
    finish("campaign_gpu", "N trials one at a time vs concurrent processes vs fused packs", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
