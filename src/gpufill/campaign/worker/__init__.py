"""A worker's side, wherever it runs (a local process, a Ray actor, a Slurm job): the task loop (worker), one trial's
work as a message for the scheduler (attempt), and fused packs sized and trained (packs). Never touches the store.
Imports campaign.trials, campaign.spec and campaign.policy."""
