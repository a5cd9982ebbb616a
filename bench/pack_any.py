"""Packs of any model (torch.func vmap) against what a user writes instead: per model and K.

    python bench/pack_any.py [--smoke | --quick] [--models mlp,cnn,gpt] [--sizes 1,4,16] [--rounds N] [--device auto|cpu|cuda] [--out PATH]

Ways to train K variants (seeds) of one architecture, each for the same steps on the same
batches from the same initial weights, every arm computing the same loss (cross-entropy alone):
- one at a time: each model alone, a careful loop (resident data, torch's fused AdamW);
- vmap by hand: PyTorch's ensembling recipe (`stack_module_state`, `functional_call` under
  `torch.vmap`) with one fused AdamW over the stacked tensors (one lr for all: all it can do);
- gpufill pack: the step `fit_many` trains a pack with (`engine/packs/variants.py`: the same
  vmap, StackedAdam's per-model lr and weight decay through torch's AdamW kernel);
- on a CPU, gpufill pack at its measured threads: `fit_many` times the pack's step at 1 thread
  and at every core and keeps the faster (the others stay pinned to one thread, as the project's
  CPU benchmarks are: the user's hand-written arms at torch's default would be its choice too).
Each row: samples/s per model and in all, peak device memory (CUDA), and the largest weight deviation of the gpufill pack
from the models trained alone (`max_dev`: float rounding, which Adam amplifies on near-zero
gradients). Ratios: the median of per-round ratios, arms interleaved, each round starting with
a different arm. Models: an MLP of width 64 (`mlp`, the size of the forecasting MLPs: launch-
bound on one core) and of width 256 (`mlp256`: compute-bound), a small CNN (`cnn`), the lm_char
GPT (`gpt`, tied embeddings).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
from _common import environment, finish  # noqa: E402

from gpufill.engine.backend import synchronize  # noqa: E402
from gpufill.engine.hardware import cpu_count, resolve_device  # noqa: E402
from gpufill.engine.measure.resolver import MIN_GAIN  # noqa: E402
from gpufill.engine.losses import resolve as resolve_loss  # noqa: E402
from gpufill.engine.packs.variants import pack_step  # noqa: E402
from gpufill.engine.packs.optim import StackedAdam  # noqa: E402
from gpufill.engine.packs.stacked import StackedModule  # noqa: E402

RUNS = {  # sizes, steps per measurement, rounds, batch
    "smoke": ((1, 2), 2, 1, 16),
    "quick": ((1, 4, 16), 20, 5, 64),
    "full": ((1, 4, 16, 64), 10, 3, 64),
}
LR = 1e-3


def mlp(width: int = 64) -> tuple[nn.Module, Any, str]:
    model = nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))
    return model, lambda n, g: (torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)), "cross_entropy"


def cnn(channels: int = 16) -> tuple[nn.Module, Any, str]:
    model = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * channels * 16, 10))
    return model, lambda n, g: (torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)), "cross_entropy"


def gpt() -> tuple[nn.Module, Any, str]:
    from lm_char import GPT

    model = GPT(vocab=64, context=32, width=64, layers=2, heads=4)

    def data(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 64, (n, 33), generator=g)
        return ids[:, :-1], ids[:, 1:]

    return model, data, "cross_entropy"


MODELS = {"mlp": mlp, "mlp256": lambda: mlp(256), "cnn": cnn, "gpt": gpt}
SMOKE_MODELS = {"mlp": lambda: mlp(32), "cnn": lambda: cnn(4)}


def build(name: str, k: int, smoke: bool) -> tuple[list[nn.Module], Any, str]:
    models = []
    data, loss = None, "mse"
    for seed in range(k):
        torch.manual_seed(seed)
        model, data, loss = (SMOKE_MODELS if smoke else MODELS)[name]()
        models.append(model)
    return models, data, loss


def cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The loss every arm trains on, the loss alone (logits of any rank: per position for the GPT)."""
    return nn.functional.cross_entropy(model(batch[0]).flatten(0, -2), batch[1].flatten())


class Arms:
    """The three ways for one model and K, each a closure of one training step on batch `i`."""

    def __init__(self, models: list[nn.Module], batches: list[tuple[torch.Tensor, torch.Tensor]], loss: str, device: torch.device):
        self.k, self.batches, self.device = len(models), batches, device
        self.loss_fn = cross_entropy  # every arm computes the same: the loss alone, as the hand vmap does
        self.pack_loss_fn, _ = resolve_loss(cross_entropy)  # as fit_many calls a loss function
        fused = device.type in ("cpu", "cuda")
        self.alone = [copy.deepcopy(m).to(device).train() for m in models]
        self.alone_opt = [torch.optim.AdamW(m.parameters(), lr=LR, fused=fused) for m in self.alone]
        params, buffers = stack_module_state([copy.deepcopy(m).to(device) for m in models])
        self.hand_params = {name: p.detach().clone().requires_grad_() for name, p in params.items()}
        self.hand_buffers = buffers
        self.hand_opt = torch.optim.AdamW(list(self.hand_params.values()), lr=LR, fused=fused)
        # The recipe's blueprint, as a real copy: a "meta" one fails on the GPT's tied embedding under functional_call.
        self.base = copy.deepcopy(models[0]).to(device)
        self.stacked = StackedModule.from_models([copy.deepcopy(m) for m in models]).to(device).train()
        self.pack_opt = StackedAdam(list(self.stacked.parameters()), [LR] * self.k, [0.0] * self.k)
        # The same pack once more, stepped at the thread count fit_many measures for it (CPU).
        self.threaded = StackedModule.from_models([copy.deepcopy(m) for m in models]).to(device).train()
        self.threaded_opt = StackedAdam(list(self.threaded.parameters()), [LR] * self.k, [0.0] * self.k)
        self.threads = 1
        self.everyone = list(range(self.k))

    def one_at_a_time(self, i: int) -> None:
        x, y = self.batches[i]
        for k, (model, optimizer) in enumerate(zip(self.alone, self.alone_opt, strict=True)):
            self.loss_fn(model, (x[k], y[k])).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def vmap_by_hand(self, i: int) -> None:
        x, y = self.batches[i]

        def loss(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], xk: torch.Tensor, yk: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(functional_call(self.base, (params, buffers), (xk,)).flatten(0, -2), yk.flatten())

        torch.vmap(loss)(self.hand_params, self.hand_buffers, x, y).sum().backward()
        self.hand_opt.step()
        self.hand_opt.zero_grad(set_to_none=True)

    def gpufill_pack(self, i: int) -> None:
        pack_step(self.stacked, self.pack_opt, self.pack_loss_fn, self.batches[i], self.everyone)

    def gpufill_pack_threads(self, i: int) -> None:
        torch.set_num_threads(self.threads)
        try:
            pack_step(self.threaded, self.threaded_opt, self.pack_loss_fn, self.batches[i], self.everyone)
        finally:
            torch.set_num_threads(1)

    def choose_threads(self, steps: int) -> int:
        """fit_many's choice: the pack's step timed at 1 thread and at every core, the faster kept
        (by at least the probe's MIN_GAIN, else 1)."""
        seconds: dict[int, float] = {}
        for _ in range(2):
            for t in dict.fromkeys((1, cpu_count())):
                self.threads = t
                spent = timed(self.gpufill_pack_threads, steps, self.device)
                seconds[t] = min(seconds.get(t, spent), spent)
        best = min(seconds, key=seconds.__getitem__)
        self.threads = best if seconds[best] * MIN_GAIN <= seconds[1] else 1
        return self.threads

    def deviation(self) -> float:
        """Largest |weight| difference of the gpufill pack's models from the same models trained alone."""
        worst = 0.0
        for k, model in enumerate(self.alone):
            plain = self.stacked.unfuse(k)
            for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values(), strict=True):
                worst = max(worst, float((a.double() - b.double()).abs().max()))
        return worst


def timed(step, steps: int, device: torch.device) -> float:
    synchronize(device)
    tick = time.perf_counter()
    for i in range(steps):
        step(i)
    synchronize(device)
    return time.perf_counter() - tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="seconds: MLP and CNN, K 1 and 2 (CI)")
    size.add_argument("--quick", action="store_true", help="K 1, 4, 16; a few minutes on 2 CPU cores")
    parser.add_argument("--models", default=None, help="default mlp,mlp256,cnn,gpt (--smoke mlp,cnn)")
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes, steps, rounds, batch = RUNS[size_name]
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else sizes
    rounds = args.rounds or rounds
    names = (args.models or ("mlp,cnn" if args.smoke else "mlp,mlp256,cnn,gpt")).split(",")
    device = torch.device(resolve_device(args.device))
    if device.type == "cpu":
        torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    for name in names:
        for k in sizes:
            models, make_data, loss = build(name, k, args.smoke)
            g = torch.Generator().manual_seed(0)
            batches = []
            for _ in range(steps + 1):  # each model its own batch: (K, b, ...)
                x, y = zip(*(make_data(batch, g) for _ in range(k)), strict=True)
                batches.append((torch.stack(x).to(device), torch.stack(y).to(device)))
            arms = Arms(models, batches, loss, device)
            ways = {"one at a time": arms.one_at_a_time, "vmap by hand": arms.vmap_by_hand, "gpufill pack": arms.gpufill_pack}
            if device.type == "cpu":
                threads = arms.choose_threads(min(steps, 5))
                ways[f"gpufill pack, {threads} thread{'s' if threads > 1 else ''} (measured)"] = arms.gpufill_pack_threads
            for step in ways.values():  # warm-up: allocator, kernel selection
                step(steps)
            seconds: dict[str, list[float]] = {way: [] for way in ways}
            deviation = None
            peak: dict[str, int | None] = {way: None for way in ways}
            for r in range(rounds):
                order = list(ways)[r % len(ways):] + list(ways)[: r % len(ways)]
                for way in order:
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    seconds[way].append(timed(ways[way], steps, device))
                    if device.type == "cuda":
                        peak[way] = max(peak[way] or 0, torch.cuda.max_memory_allocated(device))
                if r == 0:  # every arm has taken the same steps on the same batches from the same weights
                    deviation = arms.deviation()
            samples = k * batch * steps
            per_round = {way: [samples / s for s in seconds[way]] for way in ways}
            for way in ways:
                rows.append({"model": name, "k": k, "way": way, "samples_per_s_per_model": round(statistics.median(per_round[way]) / k, 1),
                             "samples_per_s": round(statistics.median(per_round[way]), 1),
                             "peak_mib": None if peak[way] is None else round(peak[way] / 2**20, 1),
                             "max_dev": deviation if way == "gpufill pack" else None})
            pack_over = [p / o for p, o in zip(per_round["gpufill pack"], per_round["one at a time"], strict=True)]
            pack_over_vmap = [p / v for p, v in zip(per_round["gpufill pack"], per_round["vmap by hand"], strict=True)]
            ratios[f"{name}_k{k}_pack_over_one_at_a_time"] = round(statistics.median(pack_over), 3)
            ratios[f"{name}_k{k}_pack_over_vmap_by_hand"] = round(statistics.median(pack_over_vmap), 3)
            ratios[f"{name}_k{k}_max_deviation"] = float(f"{deviation:.3g}")
            measured = next((way for way in ways if way.endswith("(measured)")), None)
            if measured is not None:
                over = [p / v for p, v in zip(per_round[measured], per_round["vmap by hand"], strict=True)]
                ratios[f"{name}_k{k}_measured_pack_over_vmap_by_hand"] = round(statistics.median(over), 3)
                over = [p / o for p, o in zip(per_round[measured], per_round["one at a time"], strict=True)]
                ratios[f"{name}_k{k}_measured_pack_over_one_at_a_time"] = round(statistics.median(over), 3)
            print(f"{name} K={k}: pack/one-at-a-time {ratios[f'{name}_k{k}_pack_over_one_at_a_time']}, "
                  f"pack/vmap-by-hand {ratios[f'{name}_k{k}_pack_over_vmap_by_hand']}, max deviation {deviation:.2g}", flush=True)
    env = environment(str(device))
    finish("pack_any", "packs of any model vs one at a time and a hand vmap ensemble", env,
           {"size": size_name, "models": names, "sizes": list(sizes), "steps": steps, "rounds": rounds, "batch": batch,
            "threads": torch.get_num_threads()}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
