"""Data-parallel training of one model under torchrun: the context fit() needs.

`gpufill.fit` works unchanged under `torchrun --nproc_per_node N`: it finds the
process group from the environment torchrun sets (WORLD_SIZE, RANK, LOCAL_RANK,
MASTER_ADDR/PORT), gives each rank its share of every batch (the effective batch stays
the global one), wraps the model in DistributedDataParallel, and lets only rank 0 write
checkpoints and call user callbacks. Validation is sharded too: each rank scores a contiguous
block of the validation set. Decisions that must agree across ranks (the batch search's
outcome) are broadcast from rank 0; losses are summed across ranks once per epoch.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Distributed:
    rank: int
    world_size: int
    local_rank: int
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self) -> str:
        """One GPU per process (the local rank's), else the CPU."""
        return f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu"

    def shard(self, index: torch.Tensor) -> torch.Tensor:
        """This rank's samples of a global batch: every world_size-th, so shares differ by at most one."""
        return index[self.rank :: self.world_size]

    def block(self, n: int) -> range:
        """This rank's contiguous share of n ordered samples (validation): shares differ by at most one."""
        return range(n * self.rank // self.world_size, n * (self.rank + 1) // self.world_size)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def broadcast(self, value: T) -> T:
        """Rank 0's value on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


# How long a rank waits at exit for the others before tearing down alone (a peer that died is not waited for longer).
LEAVE_TOGETHER_TIMEOUT = timedelta(seconds=10)


def leave_together() -> None:
    """Wait for every rank, then destroy the group: gloo can abort a rank ("terminate called without an
    active exception") whose peer closed its connections first, after training succeeded."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo" and dist.get_world_size() > 1:
        try:
            dist.monitored_barrier(timeout=LEAVE_TOGETHER_TIMEOUT)
        except RuntimeError:
            pass  # a peer failed or left: tear down anyway, torchrun reports that rank
    dist.destroy_process_group()


def from_environment() -> Distributed | None:
    """The process group torchrun describes (started here if the caller has not), or None when not distributed."""
    if not dist.is_available():
        return None
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        # We started it, so we end it: a group left to interpreter shutdown can abort the
        # process ("terminate called without an active exception") after training succeeded.
        atexit.register(leave_together)
    if dist.get_world_size() <= 1:
        return None
    return Distributed(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        backend=dist.get_backend(),
    )
