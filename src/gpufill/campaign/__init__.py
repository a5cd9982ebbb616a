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

from gpufill.lazy import by_home, lazy_names

# each submodule of gpufill.campaign and the names it defines
_HOME = by_home({
    "spec.spec": ["CampaignSpec", "load_campaign"],
    "trials.trials": ["Trial", "expand", "trial_id"],
    "run.runner": ["Campaign", "demo_campaign_path", "describe_lanes"],
    "results.reading": ["best_per_project", "find_workdir", "read_results", "read_status", "read_trials"],
    "results.export": ["write_frame"],
})
__all__ = sorted(_HOME)


__getattr__, __dir__ = lazy_names(__name__, _HOME)
