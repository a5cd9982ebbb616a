"""Ablations: gpufill with one speed-up switched off, for each speed-up its plan turned on.

The list comes from the plan gpufill measured on this device (`measured_plan`), so a row
exists only for a speed-up that is on here (no TF32 row on a CPU, no bf16 row where the
probe kept fp32). Each ablation pins every measured setting to the plan's value (the probe
off) and reverts one to the plain loop's: torch's defaults, fp32, eager, the thread count
torch has now. It is measured by `compare` as a variant; its "worth" is gpufill / ablated
samples/s.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from gpufill.engine import loop
from gpufill.engine.config import FitConfig
from gpufill.engine.inputs import Data
from gpufill.engine.plan import Choice, Plan, torch_default_kernel


@dataclasses.dataclass(frozen=True, slots=True)
class Ablation:
    """One speed-up and the setting that switches it off."""

    name: str
    """The speed-up, e.g. "resident data"."""
    setting: str
    """The FitConfig field that switches it off."""
    value: Any
    """The value that switches it off."""
    reason: str
    """Why the plan turned it on (the plan's reason)."""
    pinned: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The plan's other measured settings, held at their values (and the probe off) while this one is reverted."""

    @property
    def key(self) -> str:
        """A JSON-friendly name: "resident data" -> "resident_data"."""
        return re.sub(r"[^a-z0-9]+", "_", self.name.lower()).strip("_")

    @property
    def label(self) -> str:
        """The row's name in tables: what ran."""
        return f"gpufill - {self.name}"

    def overrides(self) -> dict[str, Any]:
        return {**self.pinned, self.setting: self.value}

    def describe(self) -> str:
        return f"{self.setting}={self.value}"


def automatic_plan(config: FitConfig, train: Data, val: Data | None) -> Plan:
    """The plan fit() starts from for this data and these settings, before its probe measures anything."""
    return loop.automatic_plan(train, val, config=config)


def pinned_settings(plan: Plan) -> dict[str, Any]:
    """FitConfig overrides that reproduce `plan`'s measured settings without measuring again."""
    return {"precision": plan.precision.value, "tf32": plan.tf32.value, "cudnn_benchmark": plan.cudnn_benchmark.value,
            "cuda_graph": plan.step_graph.value, "compile": plan.compile.value or False, "threads": plan.threads.value,
            "optimizer_kernel": plan.optimizer_kernel.value, "micro_batch": plan.micro_batch.value, "batch_search": False, "probe": False}


def ablations(plan: Plan) -> list[Ablation]:
    """One Ablation per speed-up that is on in `plan`, in the plan's order."""
    pinned = pinned_settings(plan)
    rows: list[Ablation] = []

    def add(name: str, setting: str, value: Any, choice: Choice[Any]) -> None:
        rows.append(Ablation(name, setting, value, choice.reason, {k: v for k, v in pinned.items() if k != setting}))

    if plan.precision.value in ("bf16", "fp16"):
        add(f"{plan.precision.value} autocast", "precision", "fp32", plan.precision)
    if plan.tf32.value:
        add("TF32", "tf32", False, plan.tf32)
    if plan.cudnn_benchmark.value:
        add("cudnn.benchmark", "cudnn_benchmark", False, plan.cudnn_benchmark)
    if plan.step_graph.value:
        add("CUDA graph step", "cuda_graph", False, plan.step_graph)
    if plan.compile.value:
        add("torch.compile", "compile", False, plan.compile)
    if plan.threads.value != torch.get_num_threads():
        add(f"{plan.threads.value} threads", "threads", torch.get_num_threads(), plan.threads)
    if plan.data_placement.value == "device":
        add("resident data", "data_placement", "loader", plan.data_placement)
    if plan.batch_search.value and plan.micro_batch.value != plan.effective_batch.value:
        add("batch search", "micro_batch", plan.effective_batch.value, plan.micro_batch)
    default = torch_default_kernel(plan.device.value.split(":")[0])
    if plan.optimizer_kernel.value != default:
        name = {"fused": "fused optimizer", "foreach": "multi-tensor optimizer"}.get(plan.optimizer_kernel.value, f"{plan.optimizer_kernel.value} optimizer")
        add(name, "optimizer_kernel", default, plan.optimizer_kernel)
    if not plan.step_sync.value:
        add("no per-step sync", "sync_every_step", True, plan.step_sync)
    return rows
