"""Where a step's microseconds go: gpufill's hot loop against the careful hand loop, piece by piece.

    python bench/step_overhead.py [--smoke | --quick] [--device cpu|cuda] [--out PATH]

Two models, each at its batch: a "null" one (a 4 -> 1 linear layer at batch 32: nearly all of
a step is overhead) and the MLP forecaster at batch 128. For each, blocks of optimizer steps
alternate between the hand loop (index a permutation, gather, forward, loss, backward, fused
AdamW, zero_grad(set_to_none=True)) and gpufill's epoch over the same resident data
(`step.train_epoch` with the kit the loop builds); each pair's ratio is gpufill / hand seconds
per step, reported as the median over pairs. Then what gpufill does beyond the hand loop is
timed piece by piece, each alone over many repetitions: drawing an epoch's batches, splitting
a batch into micro-batches and gathering it, the named loss's wrapper (a dict) over the plain
loss call, adding the loss into the device sums, and the clock reads and step callback; and the optimizer step
gpufill does differently (torch's fused AdamW class against gpufill's eager one, which lists its tensors once on a
CPU: `engine/optim_eager.py`), interleaved. The operators dispatched per step (`engine/measure/ops.py`) are counted
for both loops.
On a CPU one thread is pinned.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.engine.backend import synchronize  # noqa: E402
from gpufill.engine.batches import ResidentBatches, take  # noqa: E402
from gpufill.engine.config import FitConfig  # noqa: E402
from gpufill.engine.hardware import detect, fused_optimizer_devices, resolve_device  # noqa: E402
from gpufill.engine.kit import build_kit  # noqa: E402
from gpufill.engine.losses import resolve as resolve_loss  # noqa: E402
from gpufill.engine.measure.ops import count_ops  # noqa: E402
from gpufill.engine.optim_eager import eager_class  # noqa: E402
from gpufill.engine.plan import DataFacts, make_plan  # noqa: E402
from gpufill.engine.step import EpochTiming, Totals, train_epoch  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402


def models(device: torch.device) -> dict[str, tuple[Callable[[], nn.Module], tuple[torch.Tensor, torch.Tensor], int]]:
    g = torch.Generator().manual_seed(0)

    def null() -> nn.Module:
        torch.manual_seed(0)
        return nn.Linear(4, 1)

    def forecaster() -> nn.Module:
        torch.manual_seed(0)
        return registry.build("mlp", n_features=1, lookback=30, horizon=1, params={"hidden_size": 64})

    return {
        "null (linear 4->1, batch 32)": (null, (torch.randn(4096, 4, generator=g), torch.randn(4096, 1, generator=g)), 32),
        "mlp forecaster (batch 128)": (forecaster, (torch.randn(8192, 30, 1, generator=g), torch.randn(8192, 1, generator=g)), 128),
    }


def hand_epoch(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], batch: int, device: torch.device) -> Callable[[], int]:
    fused = {"fused": True} if device.type in fused_optimizer_devices() else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **fused)
    n = data[0].shape[0]

    def epoch() -> int:
        order = torch.randperm(n, device=device)
        for start in range(0, n, batch):
            optimizer.zero_grad(set_to_none=True)
            x, y = take(data, order[start : start + batch])
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        return -(-n // batch)

    return epoch


def gpufill_epoch(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], batch: int, device: torch.device) -> Callable[[], int]:
    cfg = FitConfig(batch_size=batch, lr=1e-3, probe=False, device=str(device))
    plan = make_plan(detect(str(device)), DataFacts(n_train=data[0].shape[0], bytes_total=1), cfg, epochs=1)
    kit = build_kit(model, plan, cfg, resolve_loss("mse")[0], device)
    batches = ResidentBatches(data, device)
    generator = torch.Generator(device=device).manual_seed(0)
    timing = EpochTiming()

    def on_step(_seconds: float, _samples: int, _wait: float) -> None:
        """What the loop's own callback does (the first-step flag; no monitor)."""

    def epoch() -> int:
        train_epoch(kit.step, batches, batch, generator, kit.totals, timing=timing, on_step=on_step)
        return -(-batches.n // batch)

    return epoch


def per_step(epoch: Callable[[], int], device: torch.device) -> float:
    synchronize(device)
    tick = time.perf_counter()
    steps = epoch()
    synchronize(device)
    return (time.perf_counter() - tick) / steps


def pieces(data: tuple[torch.Tensor, torch.Tensor], batch: int, device: torch.device, repeats: int) -> dict[str, float]:
    """Microseconds per step of each thing gpufill's loop does that the hand loop does not (or does differently)."""
    batches = ResidentBatches(data, device)
    generator = torch.Generator(device=device).manual_seed(0)
    loss_fn = resolve_loss("mse")[0]
    model = nn.Identity()
    y = data[1][:batch]  # the identity model's output: the loss compares the targets with themselves
    totals = Totals(device)
    values = {"loss": torch.zeros((), device=device)}
    index = torch.randperm(data[0].shape[0], device=device)[:batch]

    def timed(block: Callable[[], Any], count: int) -> float:
        block()
        tick = time.perf_counter()
        for _ in range(count):
            block()
        return (time.perf_counter() - tick) / count * 1e6

    steps = -(-batches.n // batch)
    out = {
        "epoch's batches (generator + permutation slice), per step": timed(lambda: sum(1 for _ in batches.epoch(batch, generator)), max(1, repeats // steps)) / steps,
        "micro-batch split + gather (hand: take())": timed(lambda: next(next(batches.epoch(batch, generator)).micro_batches(batch)), repeats)
        - timed(lambda: next(batches.epoch(batch, generator)), repeats),
        "hand loop's take()": timed(lambda: take(data, index), repeats),
        "named loss wrapper (dict) over mse_loss": timed(lambda: loss_fn(model, (y, y)), repeats) - timed(lambda: nn.functional.mse_loss(y, y), repeats),
        "loss into the device sums (Totals.add)": timed(lambda: totals.add(values, batch), repeats),
        "two clock reads + step callback": timed(lambda: (time.perf_counter(), time.perf_counter(), (lambda *a: None)(0.0, batch, 0.0)), repeats),
    }
    return {name: round(value, 2) for name, value in out.items()}


def optimizer_steps(make: Callable[[], nn.Module], device: torch.device, repeats: int) -> dict[str, float]:
    """Microseconds of one AdamW step (lr 1e-3, the same gradients each time) by torch's class and by gpufill's eager
    class, blocks of each alternating; medians of the blocks."""
    fused = {"fused": True} if device.type in fused_optimizer_devices() else {}
    steps: dict[str, Callable[[], Any]] = {}
    for name, kind in (("torch AdamW", torch.optim.AdamW), ("gpufill's eager AdamW", eager_class(torch.optim.AdamW))):
        model = make().to(device)
        for param in model.parameters():
            param.grad = torch.full_like(param, 1e-3)
        optimizer = kind(model.parameters(), lr=1e-3, **fused)
        optimizer.step()  # the state exists from here on, as in every step after a training's first
        steps[name] = optimizer.step
    blocks: dict[str, list[float]] = {name: [] for name in steps}
    count = max(1, repeats // 10)
    for i in range(10):
        for name in (list(steps) if i % 2 == 0 else list(steps)[::-1]):
            synchronize(device)
            tick = time.perf_counter()
            for _ in range(count):
                steps[name]()
            synchronize(device)
            blocks[name].append((time.perf_counter() - tick) / count * 1e6)
    return {name: round(statistics.median(values), 2) for name, values in blocks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="seconds (CI)")
    size.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pairs", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = resolve_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    pairs = args.pairs or (2 if args.smoke else 8 if args.quick else 20)
    repeats = 200 if args.smoke else 2000
    rows, ratios = [], {}
    for name, (make, data, batch) in models(device).items():
        data = (data[0][:512], data[1][:512]) if args.smoke else data
        data = (data[0].to(device), data[1].to(device))
        hand_model, gpufill_model = make().to(device), make().to(device)
        hand, gpufill = hand_epoch(hand_model, data, batch, device), gpufill_epoch(gpufill_model, data, batch, device)
        hand(), gpufill()  # warm-up
        hand_s, gpufill_s = [], []
        for i in range(pairs):
            for which in (("hand", "gpufill") if i % 2 == 0 else ("gpufill", "hand")):
                (hand_s if which == "hand" else gpufill_s).append(per_step(hand if which == "hand" else gpufill, device))
        ops_hand = count_ops(lambda: hand()).total / (-(-data[0].shape[0] // batch))
        ops_gpufill = count_ops(lambda: gpufill()).total / (-(-data[0].shape[0] // batch))
        ratio = statistics.median(g / h for g, h in zip(gpufill_s, hand_s, strict=True))
        rows.append({"model": name, "hand_us_per_step": round(statistics.median(hand_s) * 1e6, 1),
                     "gpufill_us_per_step": round(statistics.median(gpufill_s) * 1e6, 1),
                     "gpufill_over_hand_time": round(ratio, 4), "extra_us_per_step": round(statistics.median(g - h for g, h in zip(gpufill_s, hand_s, strict=True)) * 1e6, 1),
                     "ops_per_step_hand": round(ops_hand, 1), "ops_per_step_gpufill": round(ops_gpufill, 1),
                     "pieces_us": pieces(data, batch, device, repeats), "optimizer_step_us": optimizer_steps(make, device, repeats)})
        ratios[f"{name}: gpufill / hand step time"] = ratio
    finish("step_overhead", "gpufill's hot loop against the hand loop, piece by piece", environment(str(device)),
           {"pairs": pairs, "repeats": repeats, "smoke": args.smoke, "quick": args.quick, "threads": torch.get_num_threads()}, rows, ratios, args.out)
    for row in rows:
        print(row["model"])
        for piece, us in row["pieces_us"].items():
            print(f"  {us:8.2f} us  {piece}")
        for arm, us in row["optimizer_step_us"].items():
            print(f"  {us:8.2f} us  optimizer step, {arm}")


if __name__ == "__main__":
    main()
