"""Re-forming a pack from its survivors when members stop early (a search's pruner, early stopping, divergence).

A stopped member is masked: it stops changing, but its rows still run through every kernel, so a pack that lost
two thirds of its members at an ASHA rung still pays for all of them. Re-forming builds a smaller pack of the
members still training (their weights, optimizer moments and step counts, their data and random streams, all
carried over row by row: the survivors train on exactly as before) and continues with it. Whether that pays is
measured, not assumed: on a CPU a step costs about K times one model's; on a GPU a small pack's step may cost the
same at any K, and a re-formed pack recompiles or recaptures its step. The decision and its numbers are an event
of every member's training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpufill.engine.packs.optim import PackAdamW, PackSGD, pack_optimizer

REFORM_MODES = ("measured", "always", "never")
"""fit_pack's `reform`: measured (the default: re-form where a measured step of the smaller pack repays building it),
always or never (tests and benchmarks comparing the two)."""

MEASURED_STEPS = 3
"""Timed steps of the re-formed candidate (after one warm step); the masked pack's step is timed by its own epochs."""

PROBE_SHARE = 0.1
"""A measurement is taken only where its steps are at most this share of the steps left to train."""

MARGIN = 0.9
"""Re-form only where the smaller pack's remaining time, its build and set-up included, is under this share of the
masked pack's: a few per cent either way is timing noise."""


@dataclass(frozen=True, slots=True)
class Decision:
    reform: bool
    event: str


def survivors_optimizer(name: str, optimizer: PackAdamW | PackSGD, params: Sequence[torch.nn.Parameter], keep: Sequence[int]) -> PackAdamW | PackSGD:
    """The optimizer of the re-formed pack over `params`: the rows `keep` of `optimizer`'s lr, weight decay, step
    counts and moments, so each survivor's next step is the one it would have taken in the full pack."""
    rows = torch.tensor(list(keep), device=optimizer.flat.device)
    smaller = pack_optimizer(name, params, optimizer.base_lr[rows], optimizer.weight_decay[rows])
    with torch.no_grad():
        for new, old in zip(smaller.state_tensors(), optimizer.state_tensors(), strict=True):
            new.copy_(old[rows])
    return smaller


def decide(*, mode: str, k: int, kept: int, epoch: int, epochs_left: int, masked_epoch_s: float,
           reformed_epoch_s: float | None = None, build_s: float = 0.0) -> Decision:
    """Whether a pack of `k` slots with `kept` members still training re-forms after `epoch`, `epochs_left` to go.
    `masked_epoch_s`: the masked pack's epoch as its own epochs measured it; `reformed_epoch_s`: the smaller pack's,
    from its measured step (None: not measured, `needs_measurement` said no); `build_s`: building the smaller pack
    and setting up its step (a compile, a graph capture)."""
    where = f"after epoch {epoch}, {kept} of the pack's {k} members still training"
    if mode == "always":
        return Decision(True, f"pack re-formed {where} (reform=always)")
    if mode == "never":
        return Decision(False, f"pack kept its {k} slots {where} (reform=never): the stopped members masked")
    if reformed_epoch_s is None:
        return Decision(False, f"pack kept its {k} slots {where}: the steps left do not repay measuring a smaller pack")
    masked_total = masked_epoch_s * epochs_left
    reformed_total = build_s + reformed_epoch_s * epochs_left
    numbers = (f"an epoch {reformed_epoch_s:.3g} s re-formed against {masked_epoch_s:.3g} s masked (measured), "
               f"{reformed_total:.3g} s left against {masked_total:.3g} s, building it {build_s:.3g} s")
    if reformed_total < MARGIN * masked_total:
        return Decision(True, f"pack re-formed {where}: {numbers}")
    return Decision(False, f"pack kept its {k} slots {where}: re-forming would not repay itself, {numbers}")


def needs_measurement(mode: str, steps_left: int) -> bool:
    """A measured decision measures where its steps are a small share of what is left."""
    return mode == "measured" and (1 + MEASURED_STEPS) <= PROBE_SHARE * steps_left
