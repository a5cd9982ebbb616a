"""One arm of bench/fit_speed.py as its user runs it: a fresh interpreter that loads the data, trains, scores.

    python bench/_fit_arm.py SPEC.json ARM SEED

`SPEC.json` (written by fit_speed.py) names the data file (train / val / test tensors), the model and the training's
settings. The arms import only what their user's script would: the hand loops import torch and the model's own
module, nothing of gpufill's engine; `gpufill` imports `gpufill.fit`. The parent times the whole process; this prints
one JSON line with what only the process can see: steady-epoch samples/s, the training's seconds, the loss of the
returned model on the held-out test split (and, for gpufill, its plan and set-up).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("before", "hand", "hand, 1 thread", "hand, bf16", "hand, bf16, 1 thread", "hand, tuned", "lightning", "gpufill", "gpufill, cached")


def build_model(spec: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)  # every arm starts from the same weights
    if spec["model"] == "lm":
        sys.path.insert(0, str(ROOT / "examples"))
        import lm_char

        return lm_char.make_model(**spec["model_args"])
    from gpufill.forecasting.models import registry  # the user's model file: torch and this module only

    return registry.build(spec["model"], **spec["model_args"])


def loss_of(name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if name == "cross_entropy":
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))
    return F.mse_loss(output.float(), target)


@torch.no_grad()
def evaluate(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], loss: str, device: torch.device) -> float:
    """The mean loss over `data` in chunks, fp32, eval mode."""
    model.eval()
    x, y = data
    total = 0.0
    for start in range(0, x.shape[0], 1024):
        xb, yb = x[start:start + 1024].to(device), y[start:start + 1024].to(device)
        total += float(loss_of(loss, model(xb), yb)) * xb.shape[0]
    model.train()
    return total / x.shape[0]


def hand(model: nn.Module, spec: dict[str, Any], data: dict[str, Any], device: torch.device, seed: int, *, bf16: bool = False,
         tuned: bool = False) -> list[float]:
    """The careful loop a user writes: resident tensors, index batches, fused AdamW, no per-step sync, validation each epoch.
    `bf16`: autocast to bf16; `tuned`: the guides' GPU settings by hand (bf16 autocast, TF32), unmeasured."""
    if tuned and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        bf16 = True
    model.to(device)
    x, y = (t.to(device) for t in data["train"])
    val = tuple(t.to(device) for t in data["val"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"], fused=True)
    generator = torch.Generator(device=device).manual_seed(seed)
    n, batch, seconds = x.shape[0], spec["batch_size"], []
    for _ in range(spec["epochs"]):
        tick = time.perf_counter()
        order = torch.randperm(n, device=device, generator=generator)
        for start in range(0, n, batch):
            index = order[start:start + batch]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = loss_of(spec["loss"], model(x[index]), y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        evaluate(model, val, spec["loss"], device)  # the epoch's validation, as every arm does
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - tick)
    return seconds


def run(spec: dict[str, Any], arm: str, seed: int) -> dict[str, Any]:
    device = torch.device(spec["device"])
    if device.type == "cpu" and "1 thread" in arm:
        torch.set_num_threads(1)
    data = torch.load(spec["data"], weights_only=True)
    model = build_model(spec)
    out: dict[str, Any] = {}
    tick = time.perf_counter()
    if arm.startswith("hand"):
        seconds = hand(model, spec, data, device, seed, bf16="bf16" in arm, tuned=arm == "hand, tuned")
    elif arm == "gpufill" or arm == "gpufill, cached":
        import gpufill

        result = gpufill.fit(model, data["train"], data["val"], device=str(device), seed=seed, loss=spec["loss"], lr=spec["lr"],
                             batch_size=spec["batch_size"], epochs=spec["epochs"], verbose=False)
        model = result.model
        seconds = [record.seconds + result.timings["val_s"] / len(result.history) for record in result.history]
        out = {"setup_s": round(result.timings["setup_s"], 3), "probe_s": round(result.timings["probe_s"], 3),
               "plan": {name: getattr(result.plan, name).value for name in ("threads", "precision", "optimizer_kernel", "step_graph", "compile")}}
    elif arm == "before":
        from gpufill.bench.loops import baseline_fit

        seconds = _seconds_of(baseline_fit(model, data["train"], data["val"], epochs=spec["epochs"], loss=spec["loss"], lr=spec["lr"],
                                           batch_size=spec["batch_size"], device=str(device), seed=seed))
    elif arm == "lightning":
        from gpufill.bench.lightning import lightning_fit

        seconds = lightning_fit(model, data["train"], data["val"], epochs=spec["epochs"], device=str(device), seed=seed, loss=spec["loss"],
                                lr=spec["lr"], batch_size=spec["batch_size"])
    else:
        raise SystemExit(f"_fit_arm.py: unknown arm {arm!r}: use one of {', '.join(ARMS)}")
    train_s = time.perf_counter() - tick
    steady = statistics.median(seconds[1:] or seconds)
    return {"arm": arm, "seed": seed, "samples_per_s": data["train"][0].shape[0] / steady, "train_s": round(train_s, 3),
            "test_loss": evaluate(model.to(device), data["test"], spec["loss"], device),
            "val_loss": evaluate(model, data["val"], spec["loss"], device), "threads": torch.get_num_threads(), **out}


def _seconds_of(measured: Any) -> list[float]:
    """The guides' loop reports its median steady epoch: the steady seconds it stands for."""
    return [measured.first_epoch_s, measured.epoch_s]


if __name__ == "__main__":
    spec_path, arm_name, seed_text = sys.argv[1:4]
    print(json.dumps(run(json.loads(Path(spec_path).read_text()), arm_name, int(seed_text))))
