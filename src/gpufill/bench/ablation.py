"""Ablations: gpufill with one speed-up switched off, for each speed-up its plan turned on.

The list comes from the Plan gpufill chooses on this device, so a row exists only for a
speed-up that is on here (no TF32 row on a CPU, no compile row when the training is too
short for compile to be chosen). Each ablation is a FitConfig override, measured by
`compare` as a variant; its "worth" is gpufill / ablated samples/s.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from gpufill.engine import loop
from gpufill.engine.config import FitConfig
from gpufill.engine.inputs import Data
from gpufill.engine.plan import Choice, Plan


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

    @property
    def key(self) -> str:
        """A JSON-friendly name: "resident data" -> "resident_data"."""
        return re.sub(r"[^a-z0-9]+", "_", self.name.lower()).strip("_")

    @property
    def label(self) -> str:
        """The row's name in tables: what ran."""
        return f"gpufill - {self.name}"

    def overrides(self) -> dict[str, Any]:
        return {self.setting: self.value}

    def describe(self) -> str:
        return f"{self.setting}={self.value}"


def automatic_plan(config: FitConfig, train: Data, val: Data | None) -> Plan:
    """The plan fit() makes for this data and these settings (compile settled for its step count), as fit does."""
    return loop.automatic_plan(train, val, config=config)


def ablations(plan: Plan) -> list[Ablation]:
    """One Ablation per speed-up that is on in `plan`, in the plan's order.

    Batch search gets a row only where this version's Plan has that setting (read at run
    time, so the row appears with the version that adds it).
    """
    rows: list[Ablation] = []
    if plan.precision.value in ("bf16", "fp16"):
        rows.append(Ablation(f"{plan.precision.value} autocast", "precision", "fp32", plan.precision.reason))
    if plan.tf32.value:
        rows.append(Ablation("TF32", "tf32", False, plan.tf32.reason))
    if plan.cudnn_benchmark.value:
        rows.append(Ablation("cudnn.benchmark", "cudnn_benchmark", False, plan.cudnn_benchmark.reason))
    if plan.compile.value:
        rows.append(Ablation("torch.compile", "compile", False, plan.compile.reason))
    if plan.data_placement.value == "device":
        rows.append(Ablation("resident data", "data_placement", "loader", plan.data_placement.reason))
    search = getattr(plan, "batch_search", None)
    if isinstance(search, Choice) and search.value and "batch_search" in _CONFIG_FIELDS:
        rows.append(Ablation("batch search", "batch_search", False, search.reason))
    if plan.optimizer_kernel.value in ("fused", "foreach"):
        name = "fused optimizer" if plan.optimizer_kernel.value == "fused" else "multi-tensor optimizer"
        rows.append(Ablation(name, "optimizer_kernel", "for-loop", plan.optimizer_kernel.reason))
    if not plan.step_sync.value:
        rows.append(Ablation("no per-step sync", "sync_every_step", True, plan.step_sync.reason))
    return rows


_CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(FitConfig))
