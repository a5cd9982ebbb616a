"""How trials run: local worker processes (default), Ray actors, Slurm jobs through submitit, or inline in the
scheduler's own process (a trial to step through in a debugger; tests whose subject is not process isolation).

All four implement :class:`~gpufill.campaign.executors.base.Executor`; the scheduler
drives whichever :func:`make_executor` returns and stays the store's only writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpufill.campaign.executors.base import (
    Crashed,
    Executor,
    Finished,
    JobInfo,
    LaneRequest,
    Worker,
)
from gpufill.errors import InputError

if TYPE_CHECKING:
    from gpufill.campaign.spec.spec import CampaignSpec

__all__ = ["EXECUTORS", "Crashed", "Executor", "Finished", "JobInfo", "LaneRequest", "Worker", "check_executor", "make_executor"]

EXECUTORS = ("local", "inline", "ray", "slurm")


def check_executor(kind: str, address: str | None = None) -> None:
    """Fail early, before a run asks or touches anything: an unknown name, a stray --address, a missing package."""
    if kind not in EXECUTORS:
        raise InputError(f"unknown executor {kind!r}", where="command line", field="--executor", fix=f"use one of {', '.join(EXECUTORS)}")
    if address is not None and kind != "ray":
        raise InputError(f"--address applies to --executor ray, not {kind}", where="command line", field="--address", fix="add --executor ray, or drop --address")
    if kind == "ray":
        from gpufill.campaign.executors.ray import import_ray

        import_ray()
    elif kind == "slurm":
        from gpufill.campaign.executors.slurm import import_submitit

        import_submitit()


def make_executor(kind: str, *, spec: CampaignSpec, base_dir: str, workdir: Path, address: str | None = None) -> Executor:
    """The executor named by `--executor`; a missing optional dependency is an InputError with the install line."""
    check_executor(kind, address)
    payload = spec.model_dump(mode="json")
    tune_cache = str(workdir.resolve() / "tune")
    if kind == "ray":
        from gpufill.campaign.executors.ray import RayExecutor

        return RayExecutor(spec_payload=payload, base_dir=base_dir, tune_cache=tune_cache, address=address)
    if kind == "slurm":
        from gpufill.campaign.executors.slurm import SlurmExecutor

        return SlurmExecutor(spec_payload=payload, base_dir=base_dir, folder=workdir.resolve() / "slurm", settings=spec.resources.slurm, name=spec.name, tune_cache=tune_cache)
    if kind == "inline":
        from gpufill.campaign.executors.inline import InlineExecutor

        return InlineExecutor(spec_payload=payload, base_dir=base_dir, tune_cache=tune_cache)
    from gpufill.campaign.executors.local import LocalExecutor

    return LocalExecutor(spec_payload=payload, base_dir=base_dir, tune_cache=tune_cache)
