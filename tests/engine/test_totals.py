"""The epoch's device sums: eager steps keep their values and sum them in blocks, with the
same means as adding every step."""

import pytest
import torch

from gpufill.engine.step import KEEP_STEPS, Totals


def test_kept_values_read_as_the_weighted_mean_of_every_step():
    torch.manual_seed(0)
    kept, added = Totals(torch.device("cpu")), Totals(torch.device("cpu"))
    steps = 2 * KEEP_STEPS + 5  # two full blocks, a partial one, then a short last batch of another weight
    losses = torch.rand(steps + 1, dtype=torch.float64)
    accuracy = torch.rand(steps + 1)
    for i in range(steps + 1):
        weight = 128 if i < steps else 40
        values = {"loss": losses[i].float().requires_grad_(), "accuracy": accuracy[i]}
        kept.keep(values, weight)
        added.add(values, weight)
        kept.samples += weight
        added.samples += weight
    expected_loss = float((losses[:steps].sum() * 128 + losses[steps] * 40) / (steps * 128 + 40))
    kept_read, added_read = kept.read(), added.read()
    assert kept_read["loss"] == pytest.approx(expected_loss, rel=1e-6)
    assert kept_read["accuracy"] == pytest.approx(added_read["accuracy"], rel=1e-6)
    assert kept.samples == steps * 128 + 40


def test_a_reset_drops_what_was_kept_and_a_block_holds_at_most_keep_steps():
    totals = Totals(torch.device("cpu"))
    for _ in range(KEEP_STEPS - 1):
        totals.keep({"loss": torch.tensor(5.0)}, 1)
    assert len(totals.kept["loss"]) == KEEP_STEPS - 1 and totals.sums == {}  # nothing summed yet: no operator per step
    totals.keep({"loss": torch.tensor(5.0)}, 1)
    assert totals.kept["loss"] == [] and float(totals.sums["loss"]) == 5.0 * KEEP_STEPS
    totals.keep({"loss": torch.tensor(9.0)}, 1)
    totals.reset()
    totals.keep({"loss": torch.tensor(2.0)}, 3)
    totals.samples = 3
    assert totals.read() == {"loss": pytest.approx(2.0)}
