"""fit with a loss callable ends with the weights of a hand-written loop over the same batches (to 1e-5):
without accumulation, with accumulation (short last batch and micro-batch), and under 2-process gloo DDP."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from gpufill.engine.loop import fit
from tests.engine.common import assert_same_weights
from tests.engine.equivalence import SETTINGS, data, dict_loss, hand_loop, make_model
from tests.helpers import run_ranks

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fit_equals_a_hand_loop_without_accumulation(optimizer):
    """One forward/backward per optimizer step: the same weights and the same epoch losses as plain PyTorch."""
    batches = data()
    result = fit(make_model(), batches, loss=dict_loss, optimizer=optimizer, **SETTINGS)
    assert (result.plan.accumulation.value, result.plan.lr_scale.value, result.plan.data_placement.value) == (1, 1.0, "device")
    reference = make_model()
    means = hand_loop(reference, batches, optimizer=optimizer, **SETTINGS)
    assert_same_weights(result.model, reference, atol=1e-5)
    assert [r.train_loss for r in result.history] == pytest.approx(means, abs=1e-5)
    assert means[-1] < means[0]  # it trained: the comparison is not of two untouched models


@pytest.mark.parametrize(("optimizer", "grad_clip"), [("sgd", None), ("adam", None), ("sgd", 0.5)])
def test_accumulated_micro_batches_equal_whole_batches_of_a_hand_loop(optimizer, grad_clip):
    """micro_batch 12 of batches 32, 32, 26 (12+12+8 and 12+12+2): weighted by their share, the micro-batches
    give each batch's exact gradient, so the weights equal the hand loop's whole-batch steps (also when clipped)."""
    batches = data()
    result = fit(make_model(), batches, loss=dict_loss, optimizer=optimizer, micro_batch=12, grad_clip=grad_clip, **SETTINGS)
    assert (result.plan.micro_batch.value, result.plan.accumulation.value) == (12, 3)
    reference = make_model()
    means = hand_loop(reference, batches, optimizer=optimizer, grad_clip=grad_clip, **SETTINGS)
    assert_same_weights(result.model, reference, atol=1e-5)
    assert [r.train_loss for r in result.history] == pytest.approx(means, abs=1e-5)
    # The metric is accumulated the same way: the epoch's sample-weighted mean of each batch's mean.
    assert result.metrics["train_mae"] == pytest.approx(result.history[-1].train_metrics["mae"])
    assert 0 < result.metrics["train_mae"] < 2



@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_and_the_hand_loop(tmp_path):
    """Under torchrun (2 gloo processes), fit with a loss callable on dict batches ends with the weights of one
    process and of the hand loop: 90 samples (a last batch of 26 split 13/13) and 97 (a last batch of one
    sample: rank 1 runs a zero-weight stand-in), each with micro-batches of 8 under no_sync."""
    out = tmp_path / "ddp.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "tests/engine/ddp_fit_script.py", str(out)]
    done = run_ranks(command, cwd=ROOT, env=env, timeout=240)
    assert done.returncode == 0, f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-4000:]}"
    saved = torch.load(out, weights_only=True)
    assert saved["world"] == 2
    from tests.engine.ddp_fit_script import DDP_SETTINGS, SIZES

    for n in SIZES:
        outcome = saved[str(n)]
        assert any(e.startswith("DDP: rank 0 of 2 (gloo)") for e in outcome["events"]), outcome["events"]
        single = fit(make_model(), data(n), loss=dict_loss, **DDP_SETTINGS)
        assert_same_weights(outcome["state"], single.model, atol=1e-5)
        assert outcome["train_loss"] == pytest.approx([r.train_loss for r in single.history], abs=1e-5)
        reference = make_model()
        means = hand_loop(reference, data(n), **DDP_SETTINGS)
        assert_same_weights(outcome["state"], reference, atol=1e-5)
        assert outcome["train_loss"] == pytest.approx(means, abs=1e-5)
