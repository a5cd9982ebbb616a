"""DDP for one training: 2 CPU processes on gloo match one process on the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpufill.engine.loop import fit
from tests.helpers import run_ranks
from tests.engine.test_fit import assert_same_weights, make_data, model

ROOT = Path(__file__).resolve().parents[2]



def streams(done: subprocess.CompletedProcess) -> str:
    """A failed run's output for the assertion message: the ranks' own lines come before torchrun's summary."""
    return f"stdout: {done.stdout[-2000:]}\nstderr (start): {done.stderr[:3000]}\nstderr (end): {done.stderr[-2000:]}"


def torchrun(*args, nproc=2, timeout=180):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *map(str, args)]
    return run_ranks(command, cwd=ROOT, env=env, timeout=timeout)


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_on_the_same_global_batch(tmp_path):
    from tests.ddp_script import N_TRAIN

    done = torchrun("tests/ddp_script.py", tmp_path / "ddp.pt", tmp_path / "checkpoints")
    assert done.returncode == 0, streams(done)
    ddp = torch.load(tmp_path / "ddp.pt")
    assert ddp["world"] == 2 and set(ddp["outcomes"]) == {*N_TRAIN, "dataset"}
    x, y = make_data(n=256)
    # Even shares, shares of 17/16 in the last batch, and a last batch of one sample (rank 1 runs
    # a zero-weight stand-in): each is the single-process training on the same global batches.
    for n_train in N_TRAIN:
        outcome = ddp["outcomes"][n_train]
        assert any(e.startswith("DDP: rank 0 of 2 (gloo)") for e in outcome["events"])
        single = fit(model(), (x[:n_train], y[:n_train]), (x[225:], y[225:]), epochs=3, batch_size=64, micro_batch=16, seed=0)
        reference = model()
        reference.load_state_dict(outcome["state"])
        assert_same_weights(reference, single.model, atol=1e-5)
        for (ddp_train, ddp_val), record in zip(outcome["history"], single.history, strict=True):
            assert abs(ddp_train - record.train_loss) < 1e-5 and abs(ddp_val - record.val_loss) < 1e-5
        # Only rank 0 wrote the checkpoint (and holds the folder's lock: other ranks take none).
        assert sorted(p.name for p in (tmp_path / "checkpoints" / str(n_train)).iterdir()) == [".gpufill-training.lock", "last.pt", "meta.json"]
    # Each rank scored half the validation set (31 samples: 15 + 16); their sum is the whole set's mean.
    outcome = ddp["outcomes"]["dataset"]
    trained = model()
    trained.load_state_dict(outcome["state"])
    with torch.no_grad():
        whole = torch.nn.functional.mse_loss(trained(x[225:]), y[225:]).item()
    assert abs(outcome["history"][-1][1] - whole) < 1e-6


@pytest.mark.slow
def test_gpufill_train_nproc_launches_torchrun_and_prints_once(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_ranks(
        [sys.executable, "-m", "gpufill.cli", "train", "--model", "mlp", "--epochs", "2", "--batch-size", "64", "--nproc", "2", "--json"],
        cwd=tmp_path, env=env, timeout=180,
    )
    assert done.returncode == 0, streams(done)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, streams(done)  # rank 0 prints; rank 1 trains silently
    result = json.loads(lines[0])
    assert any(e.startswith("DDP: rank 0 of 2") for e in result["events"])
    assert result["metrics"]["test"]["mae"] < result["metrics"]["naive"]["mae"]
