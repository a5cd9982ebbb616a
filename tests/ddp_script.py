"""Run under torchrun by tests/engine/test_distributed.py: fits on the shared data, rank 0 saves the outcomes.

Three training sizes with a global batch of 64: 192 (every batch splits evenly), 225 (the last
batch of 33 splits 17/16) and 193 (the last batch of 1 leaves rank 1 only a stand-in sample).
"""

import sys

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from gpufill.engine.distributed import leave_together
from gpufill.engine.loop import fit
from tests.engine.test_fit import make_data, model

N_TRAIN = (192, 225, 193)

if __name__ == "__main__":
    out = sys.argv[1]
    x, y = make_data(n=256)
    outcomes = {}
    for n_train in N_TRAIN:
        result = fit(model(), (x[:n_train], y[:n_train]), (x[225:], y[225:]), epochs=3, batch_size=64, micro_batch=16,
                     checkpoint_dir=f"{sys.argv[2]}/{n_train}", seed=0)
        outcomes[n_train] = {"state": result.model.state_dict(), "history": [(r.train_loss, r.val_loss) for r in result.history],
                             "events": result.events}
    # A Dataset (DataLoader + DistributedSampler): validation is sharded over the ranks too.
    result = fit(model(), TensorDataset(x[:192], y[:192]), TensorDataset(x[225:], y[225:]), epochs=2, batch_size=64, seed=0,
                 restore_best=False)
    outcomes["dataset"] = {"state": result.model.state_dict(), "history": [(r.train_loss, r.val_loss) for r in result.history],
                           "events": result.events}
    if dist.get_rank() == 0:
        torch.save({"outcomes": outcomes, "world": dist.get_world_size()}, out)
    leave_together()
