"""gpufill.fit against what its user would write instead, side by side in one run.

Per model (the MLP, LSTM and Transformer forecasters, lm_char's small GPT), in interleaved
rounds from the same initial weights and the same optimizer (AdamW, constant lr):
- before: the guides' loop (per-sample Dataset in a DataLoader, Adam, loss.item() every step);
- hand: a careful hand loop (resident tensors, index batches, zero_grad(set_to_none=True),
  fused AdamW, no per-step sync);
- hand, tuned: the same loop with what the guides say to switch on by hand, unmeasured:
  bf16 autocast where the device has fast bf16, TF32 on a GPU, torch.compile;
- lightning: Lightning's Trainer with its speed defaults (no logger, checkpoints, progress bar);
- gpufill: gpufill.fit, its probe included (the process's tune cache is cleared before each run).
Each row: samples/s over the steady epochs (validation included, the first epoch left out),
the whole training's seconds (set-up, probe and compile included), the final validation loss,
and gpufill's measured plan. Ratios: the median over rounds of each round's ratio.

On a CPU every loop runs with torch pinned to one thread (two threads stall a loaded 2-core
box 3-16x); gpufill measures its own thread count, that pinned one among the candidates.

    python bench/fit_speed.py [--smoke | --quick] [--models mlp,lstm,transformer,lm] [--rounds N] [--device auto|cpu|cuda] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).parent), str(ROOT / "examples")]
from _common import environment, finish  # noqa: E402

from gpufill.bench import lightning  # noqa: E402
from gpufill.bench.guides import head  # noqa: E402
from gpufill.bench.loops import LoopMeasurement, baseline_fit, gpufill_fit, lightning_measured, minimal_measured  # noqa: E402
from gpufill.engine.config import FitConfig  # noqa: E402
from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.engine.measure.cache import clear_memory  # noqa: E402
from gpufill.forecasting.data import Split, load_projects, make_windows  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402

# Sizes per model: (series length or text bytes, epochs). "full" is sized so that gpufill's probe
# (10 % of the expected training time) can measure its stages on a 2-core CPU: about 30 minutes in all.
SIZES = {
    "smoke": {"mlp": (600, 2), "lstm": (600, 2), "transformer": (600, 2), "lm": (20_000, 1)},
    "quick": {"mlp": (8000, 6), "lstm": (5000, 4), "transformer": (2000, 3), "lm": (80_000, 2)},
    "full": {"mlp": (40_000, 20), "lstm": (20_000, 10), "transformer": (5000, 15), "lm": (320_000, 6)},
}
FORECASTERS = {"mlp": {"hidden_size": 64}, "lstm": {"hidden_size": 64}, "transformer": {"d_model": 64}}
LOOKBACK = 30
BATCH = 128


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    make_model: Callable[[], torch.nn.Module]
    train: Any
    val: Any
    loss: str
    lr: float
    epochs: int
    args: dict[str, Any]


def workload(name: str, size: str) -> Workload:
    amount, epochs = SIZES[size][name]
    if name == "lm":
        import lm_char

        data = lm_char.make_data(context=32, limit=amount)

        def make_lm() -> torch.nn.Module:
            return lm_char.make_model(context=32, width=64, layers=2, heads=4)

        return Workload("lm", make_lm, data["train"], data["val"], "cross_entropy", 3e-3, epochs,
                        {"text_bytes": amount, "context": 32, "width": 64, "layers": 2, "train_samples": int(data["train"][0].shape[0])})
    project = next(iter(load_projects("synthetic", n_projects=1, length=amount, seed=0).values()))
    windows = make_windows(project, LOOKBACK, 1, Split(val=0.1, test=0.2))
    params = FORECASTERS[name]

    def make_forecaster() -> torch.nn.Module:
        torch.manual_seed(0)  # every loop starts from the same weights
        return registry.build(name, n_features=windows.n_features, lookback=LOOKBACK, horizon=1, params=params)

    return Workload(name, make_forecaster, (windows.x_train, windows.y_train), (windows.x_val, windows.y_val), "mse", 1e-3, epochs,
                    {**params, "lookback": LOOKBACK, "series_length": amount, "train_samples": int(windows.x_train.shape[0])})


Arm = Callable[[Workload, Any, int, int], LoopMeasurement]


def arms(device: str, *, tuned_compile: bool) -> dict[str, Arm]:
    def before(w: Workload, train: Any, epochs: int, seed: int) -> LoopMeasurement:
        return baseline_fit(w.make_model(), train, w.val, epochs=epochs, loss=w.loss, lr=w.lr, batch_size=BATCH, device=device, seed=seed)

    def hand(w: Workload, train: Any, epochs: int, seed: int) -> LoopMeasurement:
        return minimal_measured(w.make_model(), train, w.val, epochs=epochs, device=device, seed=seed, loss=w.loss, lr=w.lr, batch_size=BATCH,
                                name="hand")

    def tuned(w: Workload, train: Any, epochs: int, seed: int) -> LoopMeasurement:
        model = w.make_model()
        if not tuned_compile:  # --smoke: the rest of the guides' settings, without compile's tens of seconds
            torch_compile, torch.compile = torch.compile, lambda m, **_k: m  # type: ignore[assignment]
        try:
            return minimal_measured(model, train, w.val, epochs=epochs, device=device, seed=seed, loss=w.loss, lr=w.lr, batch_size=BATCH,
                                    tuned=True, name="hand, tuned")
        finally:
            if not tuned_compile:
                torch.compile = torch_compile  # type: ignore[assignment]

    def lightning_arm(w: Workload, train: Any, epochs: int, seed: int) -> LoopMeasurement:
        return lightning_measured(w.make_model(), train, w.val, epochs=epochs, device=device, seed=seed, loss=w.loss, lr=w.lr, batch_size=BATCH)

    def gpufill(w: Workload, train: Any, epochs: int, seed: int) -> LoopMeasurement:
        clear_memory()  # every run pays its own probe
        config = FitConfig(device=device, seed=seed, loss=w.loss, lr=w.lr, batch_size=BATCH)
        return gpufill_fit(w.make_model(), train, w.val, epochs=epochs, config=config, name="gpufill")

    out = {"before": before, "hand": hand, "hand, tuned": tuned}
    if lightning.available():
        out["lightning"] = lightning_arm
    out["gpufill"] = gpufill
    return out


def run_model(w: Workload, loops: dict[str, Arm], rounds: int, say: Callable[[str], None]) -> dict[str, list[LoopMeasurement]]:
    runs: dict[str, list[LoopMeasurement]] = {name: [] for name in loops}
    names = list(loops)
    warm = head(w.train, 2 * BATCH)
    say(f"{w.name}: warm-up (untimed)")
    for name in names:  # lazy initialisation, allocator and kernel caches: paid by nobody's timing
        loops[name](w, warm, 1, 0)
    for r in range(rounds):
        shift = r % len(names)  # each round starts one loop later, so no loop always runs first
        for name in names[shift:] + names[:shift]:
            say(f"{w.name}: round {r + 1}/{rounds}: {name}")
            runs[name].append(loops[name](w, w.train, w.epochs, r))
    return runs


def summarise(model: str, name: str, runs: list[LoopMeasurement]) -> dict[str, Any]:
    median = sorted(runs, key=lambda m: m.samples_per_s)[len(runs) // 2]
    row = {"model": model, "loop": name, "samples_per_s": round(median.samples_per_s, 1), "epoch_s": round(median.epoch_s, 4),
           "total_s": round(statistics.median(m.total_s or 0.0 for m in runs), 2),
           "val_loss": round(statistics.fmean(m.val_loss for m in runs), 5)}
    if name == "gpufill":
        row["probe_s"] = round(statistics.median(m.probe_s or 0.0 for m in runs), 3)
        row["probe_budget_s"] = round(statistics.median(m.probe_budget_s or 0.0 for m in runs), 3)
        row["plan"] = median.plan
    row["samples_per_s_runs"] = [round(m.samples_per_s, 1) for m in runs]
    row["val_loss_runs"] = [round(m.val_loss, 5) for m in runs]
    return row


def ratios_of(model: str, runs: dict[str, list[LoopMeasurement]]) -> dict[str, float]:
    out: dict[str, float] = {}
    gpufill = runs["gpufill"]
    for name, other in runs.items():
        if name == "gpufill":
            continue
        key = name.replace(", ", "_")
        out[f"{model}:gpufill_over_{key}"] = statistics.median(g.samples_per_s / o.samples_per_s for g, o in zip(gpufill, other, strict=True))
        out[f"{model}:val_loss_gpufill_over_{key}"] = statistics.fmean(m.val_loss for m in gpufill) / statistics.fmean(m.val_loss for m in other)
    totals = [m.total_s or 0.0 for m in gpufill]
    budgets = [(m.probe_s or 0.0) / m.probe_budget_s for m in gpufill if m.probe_budget_s]
    if budgets:  # the probe's cost against the budget its plan states (<= 1: within it); the worst run
        out[f"{model}:probe_over_budget_max"] = max(budgets)
    out[f"{model}:probe_share_of_gpufill_total"] = statistics.median((m.probe_s or 0.0) / t for m, t in zip(gpufill, totals, strict=True) if t > 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="seconds: every loop and model at toy sizes (CI)")
    size.add_argument("--quick", action="store_true", help="a few minutes on 2 CPU cores")
    parser.add_argument("--models", default="mlp,lstm,transformer,lm")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(SIZES["full"]))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: use mlp, lstm, transformer, lm")
    rounds = args.rounds or (1 if args.smoke else 3)
    device = str(resolve_device(args.device))
    if device == "cpu":
        torch.set_num_threads(1)
    env = environment(device)
    loops = arms(device, tuned_compile=not args.smoke)
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    model_args: dict[str, Any] = {}
    for model in models:
        w = workload(model, size_name)
        model_args[model] = {**w.args, "epochs": w.epochs}
        runs = run_model(w, loops, rounds, lambda text: print(text, flush=True))
        rows += [summarise(model, name, measured) for name, measured in runs.items()]
        ratios.update(ratios_of(model, runs))
    run_args = {"size": size_name, "rounds": rounds, "batch_size": BATCH, "threads": torch.get_num_threads() if device == "cpu" else None,
                "lightning": lightning.available(), "models": model_args}
    finish("fit_speed", "gpufill.fit against the loops its user would write", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
