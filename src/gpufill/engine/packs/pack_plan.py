"""What a pack's plan says: a single training's plan corrected to what packs do, and the reasons of the pack's
own optimizers (recorded with every trial trained in a pack)."""

from __future__ import annotations

from gpufill.engine.measure.candidates import Context
from gpufill.engine.plan import Choice, Plan


def resident_plan(plan: Plan, *, placement: str) -> Plan:
    """What every pack does with its data and batches (a campaign's fused pack, `fit_many`'s variants): the data on the
    device, no loader, each model's whole batch per step, the batch never searched."""
    batch = plan.effective_batch.value
    return plan.replace(
        data_placement=Choice("device", placement),
        loader=Choice(None, "no DataLoader: pack data is resident"),
        loader_tuning=Choice(False, "off: pack data is resident"),
        micro_batch=Choice(batch, "each model's whole batch per step (packs do not accumulate)"),
        accumulation=Choice(1, "1: no accumulation in packs"),
        batch_search=Choice(False, "off in packs: each model keeps its batch; the pack size is what is measured"),
    )


def pack_plan(plan: Plan) -> Plan:
    """A single training's plan, corrected to what a fused pack does (the plan is recorded with every trial)."""
    return resident_plan(plan, placement="fused packs keep every member's windows on the device, padded to the longest").replace(
        optimizer_kernel=Choice("fused", "the pack's own optimizer (PackAdamW or PackSGD): ~20 operators over one flat (K, P) buffer of every "
                                         "parameter of all K models (per-model lr, weight decay and step mask)"),
        grad_scaler=Choice(plan.grad_scaler.value, f"{plan.grad_scaler.reason}; one dynamic scale for the pack, an overflowed step skipped for all"
                           if plan.grad_scaler.value else plan.grad_scaler.reason),
    )


PACK_OPTIMIZER_REASONS = {
    "adamw": "AdamW as fit builds it (decay on weight matrices and embeddings only), stepped for the pack by PackAdamW",
    "adam": "Adam as fit builds it (L2 penalty on every parameter), stepped for the pack by PackAdamW",
    "sgd": "SGD as fit builds it (momentum 0.9, L2 penalty on every parameter), stepped for the pack by PackSGD",
}

PACK_CONTEXT = Context(resident=True, distributed=False, optimizer="pack")
"""What the probe's stages need to know of a pack: resident data, one process, its own optimizer."""
