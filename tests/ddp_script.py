"""Run under torchrun by tests/test_distributed.py: one fit on the shared data, rank 0 saves the outcome."""

import sys

import torch
import torch.distributed as dist

from gpufill.fit import fit
from tests.test_fit import make_data, model

if __name__ == "__main__":
    out = sys.argv[1]
    x, y = make_data(n=256)
    result = fit(model(), (x[:192], y[:192]), (x[192:], y[192:]), epochs=3, batch_size=64, micro_batch=16,
                 checkpoint_dir=sys.argv[2], seed=0)
    if dist.get_rank() == 0:
        torch.save({"state": result.model.state_dict(), "history": [(r.train_loss, r.val_loss) for r in result.history],
                    "events": result.events, "world": dist.get_world_size()}, out)
    dist.destroy_process_group()
