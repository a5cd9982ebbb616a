"""Campaigns: when and where thousands of trials run; what a trial is and how it trains is `gpufill.forecasting`'s
(trial.py, run.py, packs.py). Its folders, each importing only those above it here:

    spec/       the campaign file: its models, `file:line` errors, limits, grid checks
    policy/     the scheduler's decisions on plain values: lanes, queue, admission, what runs next
    store/      the workdir: the SQLite store (writes, reads, health), the run lock, the run's files
    trials/     which trials: expansion and ids, a search's proposals, its pruner
    results/    the store read back: status, results, ensembles, provenance, export
    worker/     a worker's side: the task loop, one trial's attempt, fused packs
    executors/  how tasks reach workers: local processes, Ray actors, Slurm jobs
    run/        a run: Campaign, the scheduler loop, progress, stopping, estimate, its tracking follower

Names load lazily, on first use, so importing one submodule does not import the others.
"""

from __future__ import annotations

from gpufill.lazy import lazy_names

# name -> submodule of gpufill.campaign that defines it
_HOME = {
    "CampaignSpec": "spec.spec",
    "load_campaign": "spec.spec",
    "Trial": "trials.trials",
    "expand": "trials.trials",
    "trial_id": "trials.trials",
    "Campaign": "run.runner",
    "best_per_project": "results.reading",
    "demo_campaign_path": "run.runner",
    "describe_lanes": "run.runner",
    "find_workdir": "results.reading",
    "read_results": "results.reading",
    "read_status": "results.reading",
    "read_trials": "results.reading",
    "write_frame": "results.export",
}
__all__ = sorted(_HOME)


__getattr__, __dir__ = lazy_names(__name__, _HOME)
