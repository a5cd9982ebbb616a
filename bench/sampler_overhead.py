"""What the monitor's sampler costs a training: the same step loop without and with a running Sampler.

    python bench/sampler_overhead.py [--smoke | --quick] [--steps N] [--repeats N] [--device auto|cpu|cuda] [--out PATH]

One LSTM forecaster (gpufill.forecasting.models.registry) trains for N steps (forward, backward, AdamW)
three ways, interleaved in each repeat (each repeat starting with a different way): no
sampler; a Sampler every 1 s; a Sampler every 0.1 s. The sampler reads the host (psutil) and the GPUs: NVML where there is one, else a
fake two-GPU source, so the cost of building GPU rows is in the numbers everywhere.
Reported per way: the best repeat's median step time (other load on the machine only ever
adds time, so the best repeat is the least disturbed one) and the median over repeats; the
ratios with/without on the best repeats (the overhead; 1.0 = none) and the median of
per-repeat ratios; and the cost of one ``sample_once()``, whose ratio to the interval is the
expected overhead. On a shared, loaded machine the median ratios carry that machine's noise
(tens of %, bimodal), far more than the sampler's cost.

--smoke: a tiny LSTM, 10 steps, 2 repeats (seconds, CI); --quick: hidden 32, batch 64, 100
steps, 8 repeats. On a CPU torch is pinned to one thread under --smoke and --quick.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402
from gpufill.monitor.sampler import GpuReading, QueueSink, Sampler, decode_throttle, open_gpu_source  # noqa: E402

SIZES = {  # steps, repeats, hidden size, batch, lookback, warm-up steps, sample_once() calls per cost measurement
    "smoke": (10, 2, 8, 16, 12, 3, 5),
    "quick": (100, 8, 32, 64, 30, 20, 50),
    "full": (500, 10, 128, 256, 30, 20, 200),
}


class FakeGpus:
    """Two GPUs with fixed readings: the row-building cost of NVML without the driver calls."""

    def count(self) -> int:
        return 2

    def read(self, index: int) -> GpuReading:
        return GpuReading(index=index, util=80.0, mem_used=2.0e10, mem_total=8.0e10, power_w=300.0, power_limit_w=700.0,
                          temp_c=60.0, sm_clock_mhz=1980.0, throttle=decode_throttle(0x4))


def time_steps(model: torch.nn.Module, optimiser: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Median seconds per step over `steps` steps."""
    times = []
    for _ in range(steps):
        tick = time.perf_counter()
        optimiser.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimiser.step()
        if x.is_cuda:
            torch.cuda.synchronize()  # the step's real end on a GPU
        times.append(time.perf_counter() - tick)
    return statistics.median(times)


def sample_cost(sampler: Sampler, n: int, repeats: int = 5) -> float:
    """Seconds per call: the best of `repeats` means over `n` calls (other load only ever adds time)."""
    sampler.sample_once()
    best = float("inf")
    for _ in range(repeats):
        tick = time.perf_counter()
        for _ in range(n):
            sampler.sample_once()
        best = min(best, (time.perf_counter() - tick) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="a tiny LSTM, 10 steps, 2 repeats: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="small sizes: a couple of minutes on 2 CPU cores")
    parser.add_argument("--steps", type=int, default=None, help="steps per measurement")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats; the median is reported")
    parser.add_argument("--hidden-size", type=int, default=None, help="LSTM hidden size (8 smoke, 32 quick, 128 full)")
    parser.add_argument("--lookback", type=int, default=None, help="12 smoke, 30 otherwise")
    parser.add_argument("--batch", type=int, default=None, help="batch size (16 smoke, 64 quick, 256 full)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    sized_steps, sized_repeats, sized_hidden, sized_batch, sized_lookback, warm_up, n_cost = SIZES[size_name]
    steps, repeats = args.steps or sized_steps, args.repeats or sized_repeats
    hidden, batch, lookback = args.hidden_size or sized_hidden, args.batch or sized_batch, args.lookback or sized_lookback
    device = str(resolve_device(args.device))
    if device == "cpu" and size_name != "full":
        torch.set_num_threads(1)
    env = environment(device)

    gpu_source = open_gpu_source()
    gpu_kind = "nvml" if gpu_source is not None else "fake (2 GPUs)"
    gpu_source = gpu_source or FakeGpus()
    pid = os.getpid()

    torch.manual_seed(0)
    model = registry.build("lstm", n_features=3, lookback=lookback, horizon=1, params={"hidden_size": hidden}).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, lookback, 3, device=device)
    y = torch.randn(batch, 1, device=device)
    time_steps(model, optimiser, x, y, warm_up)  # warm-up: allocator, oneDNN/cuDNN kernel choice

    ways: dict[str, float | None] = {"no sampler": None, "sampler 1 s": 1.0, "sampler 0.1 s": 0.1}
    step_s: dict[str, list[float]] = {way: [] for way in ways}
    samples: dict[str, int] = dict.fromkeys(ways, 0)
    names = list(ways)
    for r in range(repeats):
        shift = r % len(names)  # interleaved, each repeat starting with a different way: drift (thermal, other load) hits every way alike
        for way in names[shift:] + names[:shift]:
            interval = ways[way]
            if interval is None:
                step_s[way].append(time_steps(model, optimiser, x, y, steps))
                continue
            sink = QueueSink()
            sampler = Sampler(interval=interval, gpu_source=gpu_source, pids=lambda: [pid], sink=sink)
            with sampler:
                step_s[way].append(time_steps(model, optimiser, x, y, steps))
            samples[way] += len(sink.drain())

    cost_host = sample_cost(Sampler(gpu_source=None, pids=lambda: [pid]), n_cost)
    cost_gpus = sample_cost(Sampler(gpu_source=gpu_source, pids=lambda: [pid]), n_cost)

    base = min(step_s["no sampler"])
    rows, ratios = [], {}
    for way, interval in ways.items():
        best, median = min(step_s[way]), statistics.median(step_s[way])
        paired = statistics.median(s / b for s, b in zip(step_s[way], step_s["no sampler"], strict=True))
        rows.append({"config": way, "step_ms": round(best * 1e3, 3), "vs_no_sampler": round(best / base, 4),
                     "step_ms_median": round(median * 1e3, 3), "median_vs_no_sampler": round(paired, 4),
                     "rows_written": samples[way], "expected_overhead_pct": None if interval is None else round(100 * cost_gpus / interval, 4),
                     "step_ms_per_repeat": [round(s * 1e3, 3) for s in step_s[way]]})
        if interval is not None:
            ratios[f"step time {way} / no sampler (best repeats)"] = best / base
            ratios[f"step time {way} / no sampler (median of per-repeat ratios)"] = paired
    for config, cost in (("one sample_once(), host only", cost_host), (f"one sample_once(), host + GPUs ({gpu_kind})", cost_gpus)):
        rows.append({**dict.fromkeys(rows[0]), "config": config, "step_ms_per_repeat": [], "sample_ms": round(cost * 1e3, 4)})
    for row in rows:
        row.setdefault("sample_ms", None)
    ratios["sample_once cost / 1 s interval"] = cost_gpus / 1.0

    run_args = {"size": size_name, "model": "lstm", "hidden_size": hidden, "lookback": lookback, "batch": batch,
                "steps": steps, "repeats": repeats, "gpu_source": gpu_kind, "threads": torch.get_num_threads(), "device": device}
    finish("sampler_overhead", "LSTM step loop without / with a running Sampler", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
