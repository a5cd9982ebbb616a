"""The ``resources`` section of a campaign file: slots, retries, packing and Slurm jobs.

Never part of a trial's identity.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator

from gpufill.campaign.spec.spec_errors import LocatedError
from gpufill.campaign.spec.spec_types import Count, Float, Spec

__all__ = ["ResourcesSpec", "SlurmSpec"]


_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9-]*$")


class SlurmSpec(Spec):
    """Slurm jobs for ``gpufill run --executor slurm`` (through submitit); other executors ignore it.

    One job runs one task (a trial or a fused pack) in a fresh process; jobs submitted in one
    scheduler round go in as one job array.
    """

    cluster: Literal["slurm", "local"] = "slurm"
    """slurm: sbatch job arrays; local: the same jobs as processes on this machine (submitit's
    local executor), to try a campaign or test it without a Slurm cluster."""
    partition: str | None = None
    """Partition to submit to; null: the cluster's default partition."""
    timeout_min: Count = 60
    """Wall-clock limit of one job, in minutes; a job that hits it is retried like a crashed worker."""
    gpus_per_job: Annotated[StrictInt, Field(ge=0, le=1)] = 1
    """GPUs for each neural job (1: a trial or pack trains on one GPU; 0: neural trials run on CPUs).
    Classical jobs never ask for a GPU."""
    cpus_per_task: Count = 1
    """CPU cores of each job, and the threads its trial uses (torch, BLAS, XGBoost, LightGBM)."""
    mem_gb: Annotated[Float, Field(gt=0)] | None = None
    """Memory per job in GB; null: the partition's default."""
    max_jobs: Count = 32
    """Jobs queued or running at once per lane (Slurm queues the rest of a big array anyway;
    this keeps the queue short so a re-run or a change of plan waits on few jobs)."""
    sbatch: dict[str, StrictInt | Float | str | StrictBool] = {}
    """Extra ``#SBATCH`` options by long name without dashes, e.g. ``{account: proj42, qos: high, constraint: a100}``."""

    @field_validator("sbatch")
    @classmethod
    def _check_sbatch(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _SBATCH_KEY.match(key):
                raise LocatedError((key,), f"{key!r} is not an sbatch option name", fix="write the long option without dashes, in lower case, e.g. account, qos, constraint, mail-type")
        return value


class ResourcesSpec(Spec):
    """How much of the machine the campaign may use. Never part of a trial's identity."""

    gpu_slots: Count | Literal["auto"] = "auto"
    """Trainings (or packs) running at once on the GPU lane."""
    cpu_slots: Count | Literal["auto"] = "auto"
    """Classical trials running at once on the CPU lane."""
    retries: Annotated[StrictInt, Field(ge=0)] = 2
    """Extra attempts for a failed trial."""
    memory_margin: Annotated[Float, Field(gt=0, le=1)] = 0.85
    """Share of device memory the GPU lane may plan to use."""
    threads_per_trial: Count | Literal["auto"] = "auto"
    """CPU threads per classical trial; "auto" keeps slots x threads <= cores."""
    trial_timeout: Annotated[Float, Field(gt=0)] | Literal["auto"] = "auto"
    """Seconds one trial may run before it is stopped and retried (under ``retries``). "auto":
    10x the slowest finished trial of its shape, at least 60 s; the first trials of a shape
    have no time limit (a worker that stops answering is still caught)."""
    heartbeat_timeout: Annotated[Float, Field(gt=0)] = 120.0
    """Seconds of silence after which a local worker counts as hung (workers send a heartbeat
    every 2 s; a stopped or frozen process sends none): it is stopped and its trial retried."""
    pack_size: Count | Literal["auto"] = "auto"
    """Neural trials of one shape fused into one pack: "auto" measures per shape and device; 1 turns fusion off."""
    slurm: SlurmSpec = SlurmSpec()
    """Job settings for ``--executor slurm``."""
