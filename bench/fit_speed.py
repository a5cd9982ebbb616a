"""gpufill.fit against what its user would write instead, each a whole script: interpreter start to trained model.

Per model (the MLP, LSTM and Transformer forecasters, lm_char's small GPT), every arm is a fresh Python process
(`bench/_fit_arm.py`) that imports what its script would, loads the same data, builds the same initial weights and
trains with the same optimizer (AdamW, constant lr, batch 128):
- before: the guides' loop (per-sample Dataset in a DataLoader, Adam, loss.item() every step), torch's default threads;
- hand: a careful loop (resident tensors, index batches, fused AdamW, no per-step sync), torch's default threads;
- hand, 1 thread: the same loop pinned to one thread (on a busy 2-core box the faster of the two);
- hand, bf16 and hand, bf16, 1 thread (CPU) / hand, tuned (GPU: bf16 autocast and TF32 switched on by hand): the
  guides' settings, unmeasured (gpufill's ratio to each is reported beside the baseline's);
- lightning: Lightning's Trainer with its speed defaults, torch's default threads (when installed);
- gpufill: `gpufill.fit` with everything automatic, as a first run on this machine (its probe included);
- gpufill, cached: the same with GPUFILL_TUNE_CACHE set, after one earlier run (untimed) measured this shape: what
  every later run of the script pays.
Each arm's process time comes from this parent (spawn to exit); the process reports steady-epoch samples/s (the first
epoch left out, validation included) and the loss of the model it returns on a held-out test split (never the
validation split gpufill's restore_best chose on). Rounds interleave the arms, each round starting one arm later; each
ratio is the median of per-round ratios, against the faster hand loop of that round (default threads or one thread).

    python bench/fit_speed.py [--smoke | --quick] [--models mlp,lstm,transformer,lm] [--rounds N] [--core] [--device auto|cpu|cuda] [--out PATH]
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
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).parent), str(ROOT / "examples")]
from _common import environment, finish, turned  # noqa: E402

from gpufill.bench import lightning  # noqa: E402
from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.forecasting.data import Split, load_projects, make_windows  # noqa: E402

# Per model: (series length or text bytes, epochs). "quick" trains 10-40 s per process on a 2-core CPU, so that a
# script's fixed costs (imports, data, a probe) weigh as they do in a real training of that length.
SIZES = {
    "smoke": {"mlp": (600, 2), "lstm": (600, 2), "transformer": (600, 2), "lm": (20_000, 1)},
    "quick": {"mlp": (40_000, 6), "lstm": (8000, 4), "transformer": (4000, 4), "lm": (120_000, 4)},  # lm: 3 steady epochs, not 1
    "full": {"mlp": (80_000, 20), "lstm": (20_000, 10), "transformer": (8000, 15), "lm": (320_000, 6)},
}
FORECASTERS = {"mlp": {"hidden_size": 64}, "lstm": {"hidden_size": 64}, "transformer": {"d_model": 64}}
LOOKBACK = 30
BATCH = 128
HANDS = ("hand", "hand, 1 thread")
"""The careful loop at torch's default threads and at one: each round's faster of the two is the baseline."""
ARM_TIMEOUT_S = 1800


def write_workload(name: str, size: str, directory: Path, device: str) -> dict[str, Any]:
    """The data file and the spec every arm reads: train / val / test tensors, the model and its training."""
    amount, epochs = SIZES[size][name]
    if name == "lm":
        import lm_char

        data = lm_char.make_data(context=32, limit=amount)
        half = data["val"][0].shape[0] // 2  # the held-out text split in two: validation, then test
        splits = {"train": data["train"], "val": tuple(t[:half] for t in data["val"]), "test": tuple(t[half:] for t in data["val"])}
        model_args: dict[str, Any] = {"context": 32, "width": 64, "layers": 2, "heads": 4}
        loss, lr, args = "cross_entropy", 3e-3, {"text_bytes": amount, **model_args}
    else:
        project = next(iter(load_projects("synthetic", n_projects=1, length=amount, seed=0).values()))
        w = make_windows(project, LOOKBACK, 1, Split(val=0.1, test=0.2))
        splits = {"train": (w.x_train, w.y_train), "val": (w.x_val, w.y_val), "test": (w.x_test, w.y_test)}
        model_args = {"n_features": w.n_features, "lookback": LOOKBACK, "horizon": 1, "params": FORECASTERS[name]}
        loss, lr, args = "mse", 1e-3, {**FORECASTERS[name], "lookback": LOOKBACK, "series_length": amount}
    path = directory / f"{name}.pt"
    torch.save({key: tuple(t.clone() for t in pair) for key, pair in splits.items()}, path)  # clones: a view would save its whole storage
    spec = {"data": str(path), "model": name, "model_args": model_args, "loss": loss, "lr": lr, "batch_size": BATCH, "epochs": epochs,
            "device": device}
    (directory / f"{name}.json").write_text(json.dumps(spec))
    return {**args, "epochs": epochs, "train_samples": int(splits["train"][0].shape[0]), "test_samples": int(splits["test"][0].shape[0])}


OPTIONAL = ("before", "hand, bf16", "hand, bf16, 1 thread", "hand, tuned", "lightning")
"""Arms a machine may not run (oneDNN has no bf16 LSTM on a CPU without bf16 instructions): a failure is recorded as
the arm's row, not the benchmark's end."""


def run_arm(spec_path: Path, arm: str, seed: int, cache: Path) -> dict[str, Any]:
    """One whole process; its wall time measured here, from spawn to exit. An optional arm that fails: {"error": ...}."""
    env = {key: value for key, value in os.environ.items() if key != "GPUFILL_TUNE_CACHE"}
    if arm == "gpufill, cached":
        env["GPUFILL_TUNE_CACHE"] = str(cache)
    tick = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "_fit_arm.py"), str(spec_path), arm, str(seed)], env=env, capture_output=True,
                          text=True, timeout=ARM_TIMEOUT_S, check=False)
    process_s = time.perf_counter() - tick
    if done.returncode != 0 and arm in OPTIONAL:
        return {"arm": arm, "error": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1][:200]}
    if done.returncode != 0:
        raise SystemExit(f"fit_speed: arm {arm!r} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": process_s}


def arms_for(device: str) -> list[str]:
    names = ["before", *HANDS, *(("hand, bf16", "hand, bf16, 1 thread") if device == "cpu" else ("hand, tuned",))]
    if device != "cpu":
        names.remove("hand, 1 thread")  # host threads only launch work on a GPU
    if lightning.available():
        names.append("lightning")
    return [*names, "gpufill", "gpufill, cached"]


def measure_model(spec_path: Path, arms: list[str], rounds: int, cache: Path, say: Any) -> dict[str, list[dict[str, Any]]]:
    say(f"{spec_path.stem}: warm-up (untimed; also the earlier run whose measurements 'gpufill, cached' reuses)")
    run_arm(spec_path, "gpufill, cached", 0, cache)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in turned(arms, r):
            say(f"{spec_path.stem}: round {r + 1}/{rounds}: {arm}")
            runs[arm].append(run_arm(spec_path, arm, r, cache))
    return runs


def summarise(model: str, arm: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    failed = [m["error"] for m in runs if "error" in m]
    runs = [m for m in runs if "error" not in m]
    if not runs:
        return {"model": model, "loop": arm, "error": failed[0]}
    middle = sorted(runs, key=lambda m: m["process_s"])[len(runs) // 2]
    row = {"model": model, "loop": arm, "process_s": round(statistics.median(m["process_s"] for m in runs), 2),
           "train_s": round(statistics.median(m["train_s"] for m in runs), 2),
           "samples_per_s": round(statistics.median(m["samples_per_s"] for m in runs), 1),
           "test_loss": float(f"{statistics.fmean(m['test_loss'] for m in runs):.5g}"), "threads": middle["threads"]}
    if arm.startswith("gpufill"):
        row["setup_s"] = round(statistics.median(m["setup_s"] for m in runs), 3)
        row["probe_s"] = round(statistics.median(m["probe_s"] for m in runs), 3)
        row["plan"] = middle["plan"]
    row["process_s_runs"] = [round(m["process_s"], 2) for m in runs]
    row["samples_per_s_runs"] = [round(m["samples_per_s"], 1) for m in runs]
    return row


def ratios_of(model: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Per round: the faster hand loop (default threads or one) over each gpufill arm; medians over rounds."""
    hands = [arm for arm in HANDS if arm in runs]
    rounds = len(runs[hands[0]])
    best_process = [min(runs[a][r]["process_s"] for a in hands) for r in range(rounds)]
    best_rate = [max(runs[a][r]["samples_per_s"] for a in hands) for r in range(rounds)]
    hand_loss = statistics.fmean(m["test_loss"] for a in hands for m in runs[a])
    out: dict[str, float] = {}
    for arm in ("gpufill", "gpufill, cached"):
        key = arm.replace(", ", "_")
        out[f"{model}:{key}_process_vs_best_hand"] = round(statistics.median(b / m["process_s"] for b, m in zip(best_process, runs[arm], strict=True)), 3)
        out[f"{model}:{key}_samples_per_s_vs_best_hand"] = round(statistics.median(m["samples_per_s"] / b for b, m in zip(best_rate, runs[arm], strict=True)), 3)
        out[f"{model}:{key}_test_loss_vs_hand"] = round(statistics.fmean(m["test_loss"] for m in runs[arm]) / hand_loss, 4)
    for arm in runs:
        if arm.startswith("gpufill") or arm in hands or any("error" in m for m in runs[arm]):
            continue
        key = arm.replace(", ", "_").replace(" ", "_")
        out[f"{model}:gpufill_cached_process_vs_{key}"] = round(statistics.median(
            o["process_s"] / g["process_s"] for o, g in zip(runs[arm], runs["gpufill, cached"], strict=True)), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="seconds per process: the MLP at a toy size, one round (CI; --models mlp,lstm adds the LSTM)")
    size.add_argument("--quick", action="store_true", help="10-40 s per process on 2 CPU cores, 3 rounds")
    parser.add_argument("--models", default=None, help="default mlp,lstm,transformer,lm (--smoke: mlp)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--core", action="store_true", help="only the two hand loops (default threads, one) and the two gpufill arms: more rounds in the same time")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    models = [m.strip() for m in (args.models or ("mlp" if args.smoke else "mlp,lstm,transformer,lm")).split(",") if m.strip()]
    unknown = sorted(set(models) - set(SIZES["full"]))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: use mlp, lstm, transformer, lm")
    rounds = args.rounds or (1 if args.smoke else 3)
    device = str(resolve_device(args.device))
    env = environment(device)
    arms = arms_for(device)
    if args.core:
        arms = [a for a in arms if a in HANDS or a.startswith("gpufill")]
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    model_args: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpufill-fit-speed-") as scratch:
        directory = Path(scratch)
        for model in models:
            model_args[model] = write_workload(model, size_name, directory, device)
            cache = directory / f"{model}-cache"
            cache.mkdir()
            runs = measure_model(directory / f"{model}.json", arms, rounds, cache, lambda text: print(text, flush=True))
            rows += [summarise(model, arm, measured) for arm, measured in runs.items()]
            ratios.update(ratios_of(model, runs))
    run_args = {"size": size_name, "rounds": rounds, "batch_size": BATCH, "default_threads": torch.get_num_threads(), "arms": arms,
                "lightning": "lightning" in arms, "models": model_args, "process": "each arm a fresh interpreter (bench/_fit_arm.py)"}
    finish("fit_speed", "gpufill.fit against the scripts its user would write, each a whole process", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
