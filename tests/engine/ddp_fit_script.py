"""Run under torchrun by test_equivalence.py: fit with a loss callable on dict batches; rank 0 saves its weights.

Usage: python -m torch.distributed.run --nproc_per_node 2 tests/engine/ddp_fit_script.py OUT.pt
"""

import sys

import torch
import torch.distributed as dist

from gpufill.engine.distributed import leave_together
from gpufill.engine.loop import fit
from tests.engine.equivalence import SETTINGS, data, dict_loss, make_model

SIZES = (90, 97)
"""90: a last batch of 26 (13 per rank); 97: a last batch of 1 (rank 1 runs a zero-weight stand-in)."""
DDP_SETTINGS = {**SETTINGS, "optimizer": "adam", "micro_batch": 8}

if __name__ == "__main__":
    saved: dict = {}
    for n in SIZES:
        result = fit(make_model(), data(n), loss=dict_loss, **DDP_SETTINGS)
        saved[str(n)] = {"state": result.model.state_dict(), "train_loss": [r.train_loss for r in result.history], "events": result.events}
    if dist.get_rank() == 0:
        saved["world"] = dist.get_world_size()
        torch.save(saved, sys.argv[1])
    leave_together()
