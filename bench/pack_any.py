"""K variants (seeds) of one model trained the ways a user would write it, each timed as a whole call.

    python bench/pack_any.py [--smoke | --quick] [--models mlp32,mlp256,cnn,gru,lstm] [--sizes 4,16,64] [--optimizers adam,adamw]
                             [--rounds N] [--device auto|cpu|cuda] [--out PATH]

Every arm builds the K models (`torch.manual_seed(seed); make_model()`), trains them for the same epochs on the same
resident data with the same optimizer, scores the validation split after every epoch and keeps each model's best
weights; the time is the whole call (construction, checks, measurement, training, validation), not a step. The arms:
- one at a time: a careful loop per model (resident data, a per-model permutation, torch's fused optimizer);
- vmap by hand: PyTorch's model-ensembling recipe (`stack_module_state`, `functional_call` under `torch.vmap`) with
  one fused optimizer of the same kind over the stacked tensors, the validation of all K in one vmapped forward;
  a model vmap cannot batch (nn.GRU, nn.LSTM) has no such arm;
- gpufill fit_many: `gpufill.fit_many(make_model, train, val, variants=[{"seed": s}, ...], optimizer=...)` with
  everything left to `auto` (pack or not, threads); its in-process caches are cleared before every call, so each
  call pays its checks and measurement.
The hand-written arms run at torch's default threads and at one thread; ratios are against the faster of the two
in each round. Rounds interleave the arms (each round starts with another), ratios are medians of per-round ratios.
Each arm's models are then scored on a held-out test split (`test_loss`: the median over the K models), and
`max_dev` is the largest weight difference of a fit_many pack from the same models trained alone by `gpufill.fit`, and
`rounding_floor` the same difference between those models trained alone at one thread and at torch's default (float
rounding alone, which a chaotic training amplifies: the scale `max_dev` is read on).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

sys.path.insert(0, str(Path(__file__).parent))
from _common import default_out, environment, finish, turned, write_result  # noqa: E402

import gpufill  # noqa: E402
from gpufill.engine.backend import synchronize  # noqa: E402
from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.engine.packs import many  # noqa: E402

SIZES = {  # K, rounds, train/val/test rows, batch, epochs
    "smoke": ((2,), 1, (256, 64, 64), 64, 1),
    "quick": ((4, 16, 64), 3, (5000, 1000, 1000), 256, 3),
    "full": ((4, 16, 64), 5, (5000, 1000, 1000), 256, 3),
}
HEAVY_ROWS = 0.4
"""The CNN and the GRU train on this share of the rows (a step costs them 5-10x an MLP's; the same minutes in all)..."""
HEAVY_BATCH = 0.25
"""...in batches of this share of the MLP's: as many steps as the MLP's training takes, not a handful (a training
of 24 steps is too short to be worth measuring, so it would only show the one-at-a-time fallback)."""
LR = {"adam": 5e-3, "adamw": 5e-3}
WEIGHT_DECAY = {"adam": 0.0, "adamw": 0.01}


class RecurrentNet(nn.Module):
    """A sequence (b, 16, 4) read by a GRU or LSTM of width 32, its last step's output to one value."""

    def __init__(self, cell: type[nn.Module]):
        super().__init__()
        self.rnn = cell(4, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def gru() -> nn.Module:
    return RecurrentNet(nn.GRU)


def lstm() -> nn.Module:
    return RecurrentNet(nn.LSTM)


def mlp(width: int) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(16 * 16, 10))


def data(name: str, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if name.startswith("mlp"):
        x = torch.randn(n, 64, generator=g)
        return x, x[:, :2] * 2 - x[:, 2:4] + 0.1 * torch.randn(n, 2, generator=g)
    if name == "cnn":
        x = torch.rand(n, 1, 8, 8, generator=g)
        return x, (x.flatten(1)[:, :10].argmax(dim=1))
    x = torch.randn(n, 16, 4, generator=g)
    return x, x[:, -4:, 0].sum(dim=1, keepdim=True)


MODELS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "mlp32": (mlp(32), "mse"), "mlp256": (mlp(256), "mse"), "cnn": (cnn, "cross_entropy"), "gru": (gru, "mse"), "lstm": (lstm, "mse"),
}


def loss_of(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return nn.functional.mse_loss if kind == "mse" else nn.functional.cross_entropy


def optimizer_of(name: str, params: Any, fused: bool) -> torch.optim.Optimizer:
    kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return kind(params, lr=LR[name], weight_decay=WEIGHT_DECAY[name], fused=fused)


class Task:
    """One model, K, optimizer and data: the arms as whole calls, each returning its K trained models."""

    def __init__(self, name: str, k: int, optimizer: str, splits: dict[str, tuple[torch.Tensor, torch.Tensor]], batch: int, epochs: int,
                 device: torch.device):
        self.name, self.k, self.optimizer, self.batch, self.epochs, self.device = name, k, optimizer, batch, epochs, device
        self.make, self.kind = MODELS[name]
        self.loss = loss_of(self.kind)
        self.splits = {key: (x.to(device), y.to(device)) for key, (x, y) in splits.items()}
        self.fused = device.type in ("cpu", "cuda")

    def seeded(self) -> list[nn.Module]:
        models = []
        for seed in range(self.k):
            torch.manual_seed(seed)
            models.append(self.make().to(self.device))
        return models

    def one_at_a_time(self) -> list[nn.Module]:
        x, y = self.splits["train"]
        vx, vy = self.splits["val"]
        out = []
        for seed, model in enumerate(self.seeded()):
            optimizer = optimizer_of(self.optimizer, model.parameters(), self.fused)
            order = torch.Generator(device=self.device).manual_seed(seed)
            best, kept = float("inf"), None
            for _ in range(self.epochs):
                model.train()
                perm = torch.randperm(x.shape[0], device=self.device, generator=order)
                for start in range(0, x.shape[0], self.batch):
                    index = perm[start : start + self.batch]
                    self.loss(model(x[index]), y[index]).backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                model.eval()
                with torch.no_grad():
                    val = float(self.loss(model(vx), vy))
                if val < best:
                    best, kept = val, copy.deepcopy(model.state_dict())
            model.load_state_dict(kept)
            out.append(model)
        return out

    def vmap_by_hand(self) -> list[nn.Module]:
        models = self.seeded()
        params, buffers = stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")
        optimizer = optimizer_of(self.optimizer, list(params.values()), self.fused)

        def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xk: torch.Tensor) -> torch.Tensor:
            return functional_call(base, (p, b), (xk,))

        each, shared = torch.vmap(one), torch.vmap(one, in_dims=(0, 0, None))
        x, y = self.splits["train"]
        vx, vy = self.splits["val"]
        orders = [torch.Generator(device=self.device).manual_seed(seed) for seed in range(self.k)]
        best = torch.full((self.k,), float("inf"), device=self.device)
        kept = {name: p.detach().clone() for name, p in params.items()}
        for _ in range(self.epochs):
            perms = torch.stack([torch.randperm(x.shape[0], device=self.device, generator=g) for g in orders])
            for start in range(0, x.shape[0], self.batch):
                index = perms[:, start : start + self.batch]
                xb, yb = x[index], y[index]
                out = each(params, buffers, xb)
                losses = torch.vmap(self.loss)(out, yb)
                losses.sum().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                val = torch.vmap(self.loss, in_dims=(0, None))(shared(params, buffers, vx), vy)
                better = val < best
                best = torch.where(better, val, best)
                for name, p in params.items():
                    kept[name][better] = p.detach()[better]
        for k, model in enumerate(models):
            model.load_state_dict({**{n: t[k] for n, t in kept.items()}, **{n: t[k] for n, t in buffers.items()}})
        return models

    def gpufill(self) -> list[nn.Module]:
        many.clear_caches()  # every call pays its checks and measurement, as a script's one call does
        results = gpufill.fit_many(self.make, self.splits["train"], self.splits["val"], variants=[{"seed": s} for s in range(self.k)],
                                   optimizer=self.optimizer, loss=self.kind, epochs=self.epochs, batch_size=self.batch, lr=LR[self.optimizer],
                                   weight_decay=WEIGHT_DECAY[self.optimizer], device=str(self.device), verbose=False)
        self.plan = results[0].plan
        return [r.model for r in results]

    def test_loss(self, models: list[nn.Module]) -> float:
        x, y = self.splits["test"]
        with torch.no_grad():
            return statistics.median(float(self.loss(m.eval()(x), y)) for m in models)

    def settings(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "loss": self.kind, "epochs": self.epochs, "batch_size": self.batch, "lr": LR[self.optimizer],
                "weight_decay": WEIGHT_DECAY[self.optimizer], "device": str(self.device), "threads": 1, "verbose": False}

    def alone(self, seed: int, **changes: Any) -> nn.Module:
        torch.manual_seed(seed)
        return gpufill.fit(self.make(), self.splits["train"], self.splits["val"], seed=seed, **{**self.settings(), **changes}).model

    def deviation(self) -> float:
        """Largest weight difference of a fit_many pack (pack=True) from the same two models trained alone by fit."""
        packed = gpufill.fit_many(self.make, self.splits["train"], self.splits["val"], variants=[{"seed": 0}, {"seed": 1}], pack=True,
                                  **self.settings())
        if packed[0].plan.pack_size.value == 1:
            return 0.0  # trained alone: nothing to compare
        return max(_largest_difference(result.model, self.alone(seed)) for seed, result in enumerate(packed))

    def rounding_floor(self) -> float:
        """The same difference between the same two models trained alone at 1 thread and at torch's default: how far
        float rounding alone carries this training (Adam on a ReLU CNN amplifies it), the scale `deviation` is read on."""
        threads = torch.get_num_threads()
        return max(_largest_difference(self.alone(seed), self.alone(seed, threads=threads)) for seed in (0, 1)) if threads > 1 else 0.0


def _largest_difference(a: nn.Module, b: nn.Module) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def at_threads(arm: Callable[[], list[nn.Module]], threads: int) -> Callable[[], list[nn.Module]]:
    def run() -> list[nn.Module]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return arm()
        finally:
            torch.set_num_threads(before)
    return run


def timed(arm: Callable[[], list[nn.Module]], device: torch.device) -> tuple[float, list[nn.Module]]:
    synchronize(device)
    tick = time.perf_counter()
    models = arm()
    synchronize(device)
    return time.perf_counter() - tick, models


def vmap_runs(task: Task) -> bool:
    """Whether the hand vmap recipe can run this model at all (nn.GRU and nn.LSTM have no batching rule)."""
    try:
        small = Task(task.name, 2, task.optimizer, {key: (x[:8], y[:8]) for key, (x, y) in task.splits.items()}, 4, 1, task.device)
        small.vmap_by_hand()
        return True
    except Exception:  # noqa: BLE001
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="seconds: mlp32 and cnn, K 2, one epoch (CI)")
    size.add_argument("--quick", action="store_true", help="K 4, 16, 64; minutes on 2 CPU cores")
    parser.add_argument("--models", default=None, help="default mlp32,mlp256,cnn,gru,lstm (--smoke mlp32,cnn)")
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--optimizers", default="adam,adamw")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes, rounds, (n_train, n_val, n_test), batch, epochs = SIZES[size_name]
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else sizes
    rounds = args.rounds or rounds
    names = (args.models or ("mlp32,cnn" if args.smoke else "mlp32,mlp256,cnn,gru,lstm")).split(",")
    optimizers = args.optimizers.split(",")
    device = torch.device(resolve_device(args.device))
    default_threads = torch.get_num_threads()
    env = environment(str(device))
    out = args.out or default_out("pack_any", env)
    settings = {"size": size_name, "models": names, "sizes": list(sizes), "optimizers": optimizers, "rounds": rounds, "batch": batch,
                "epochs": epochs, "rows": [n_train, n_val, n_test], "default_threads": default_threads}
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    for name in names:
        g = torch.Generator().manual_seed(0)
        share = 1.0 if name.startswith("mlp") else HEAVY_ROWS
        a, b, c = (max(batch, int(n * share)) for n in (n_train, n_val, n_test))
        x, y = data(name, a + b + c, g)
        splits = {"train": (x[:a], y[:a]), "val": (x[a:a + b], y[a:a + b]), "test": (x[a + b:], y[a + b:])}
        for optimizer in optimizers:
            for k in sizes:
                task = Task(name, k, optimizer, splits, batch if name.startswith("mlp") else int(batch * HEAVY_BATCH), epochs, device)
                hand: dict[str, Callable[[], list[nn.Module]]] = {}
                counts = dict.fromkeys([default_threads, 1]) if device.type == "cpu" else {default_threads: None}
                for threads in counts:
                    suffix = f"{threads} thread{'s' if threads > 1 else ''}"
                    hand[f"one at a time, {suffix}"] = at_threads(task.one_at_a_time, threads)
                    if vmap_runs(task):
                        hand[f"vmap by hand, {suffix}"] = at_threads(task.vmap_by_hand, threads)
                arms = {**hand, "gpufill fit_many": task.gpufill}
                for arm in arms.values():  # warm-up: the process's first vmap, allocator, kernel selection
                    arm()
                seconds: dict[str, list[float]] = {arm: [] for arm in arms}
                losses: dict[str, float] = {}
                for r in range(rounds):
                    for arm in turned(list(arms), r):
                        spent, models = timed(arms[arm], device)
                        seconds[arm].append(spent)
                        losses[arm] = task.test_loss(models)
                deviation = task.deviation()
                ours = seconds["gpufill fit_many"]
                for arm in arms:
                    rows.append({"model": name, "optimizer": optimizer, "k": k, "arm": arm, "call_s": round(statistics.median(seconds[arm]), 3),
                                 "models_per_s": round(k / statistics.median(seconds[arm]), 2), "test_loss": float(f"{losses[arm]:.5g}"),
                                 "vs_gpufill": round(statistics.median(s / o for s, o in zip(seconds[arm], ours, strict=True)), 3),
                                 "choice": task.plan.pack_size.reason[:90] if arm == "gpufill fit_many" else None,
                                 "max_dev": float(f"{deviation:.3g}") if arm == "gpufill fit_many" else None})
                for family in ("vmap by hand", "one at a time"):
                    mine = [a for a in arms if a.startswith(family)]
                    if mine:  # against the faster thread count of each round
                        best = [min(seconds[a][r] for a in mine) for r in range(rounds)]
                        key = f"{name}_{optimizer}_k{k}_fit_many_over_{family.replace(' ', '_')}"
                        ratios[key] = round(statistics.median(b / o for b, o in zip(best, ours, strict=True)), 3)
                ratios[f"{name}_{optimizer}_k{k}_max_deviation"] = float(f"{deviation:.3g}")
                if k == sizes[0]:  # per model and optimizer: the scale the deviations are read on
                    ratios[f"{name}_{optimizer}_rounding_floor"] = float(f"{task.rounding_floor():.3g}")
                shown = {key.rsplit("_over_", 1)[1]: value for key, value in ratios.items() if key.startswith(f"{name}_{optimizer}_k{k}_fit_many")}
                print(f"{name} {optimizer} K={k}: fit_many is {shown} x as fast; {task.plan.pack_size.reason[:80]}", flush=True)
                # A run stopped part-way (minutes per cell on 2 cores) keeps the cells it measured, marked incomplete.
                write_result(out, env, {**settings, "complete": False}, rows, ratios)
    finish("pack_any", "K variants as whole calls: one at a time, PyTorch's vmap recipe, gpufill fit_many", env, {**settings, "complete": True},
           rows, ratios, out)


if __name__ == "__main__":
    main()
