"""What a run reports: per-lane progress and the live view's snapshot while it runs, and its outcome at the end."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class LaneProgress:
    name: str
    slots: int
    threads: int
    done: int = 0
    failed: int = 0
    running: int = 0
    pending: int = 0
    finished_this_run: int = 0
    pruned: int = 0
    """Stopped by a search's pruner: finished (shown with done), never ranked."""

    @property
    def total(self) -> int:
        return self.done + self.pruned + self.failed + self.running + self.pending


@dataclass(slots=True)
class Snapshot:
    """What the live view shows: per-lane counts, rate and ETA, and the running trials."""

    lanes: dict[str, LaneProgress]
    elapsed_s: float
    running: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trials_per_min(self) -> float:
        finished = sum(lane.finished_this_run for lane in self.lanes.values())
        return 60.0 * finished / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def eta_s(self, lane: str) -> float | None:
        progress = self.lanes[lane]
        left = progress.pending + progress.running
        if left == 0:
            return 0.0
        if progress.finished_this_run == 0 or self.elapsed_s <= 0:
            return None
        return left * self.elapsed_s / progress.finished_this_run


@dataclass(slots=True)
class RunOutcome:
    done: int
    failed: int
    retried: int
    crashed: int
    elapsed_s: float
    environment: int = 0
    """Environment failures (data missing or changed, a full disk, a killed worker) retried without using an attempt."""
    waiting: int = 0
    """Trials left pending at the end because the environment kept failing them: a re-run once it is fixed runs them."""
    waiting_reason: str = ""
    """The last environment failure's error."""
    pruned: int = 0
    """Trials a search's pruner stopped (campaign/trials/pruning.py): finished, never ranked."""
    tracking: str = ""
    """What reached the tracking server (campaign/run/tracking.py), one line; empty without `tracking:`."""


def snapshot(counts: Any, lanes: Sequence[Any], finished_this_run: Mapping[str, int], busy: Sequence[Any], started_at: Mapping[str, float],
             now: float, elapsed_s: float) -> Snapshot:
    """The live view of a run: the store's `counts` per lane, and the first trial of each `busy` worker's task."""
    progress: dict[str, LaneProgress] = {}
    first_of_queue = {lane.queue: lane.name for lane in reversed(lanes)}
    for lane in lanes:
        by_status = dict(counts.lanes.get(lane.name, {}))
        if lane.queue != lane.name and first_of_queue[lane.queue] == lane.name:  # a shared queue's waiting trials, shown once
            by_status["pending"] = by_status.get("pending", 0) + counts.lanes.get(lane.queue, {}).get("pending", 0)
        progress[lane.name] = LaneProgress(
            name=lane.name,
            slots=lane.slots,
            threads=lane.threads,
            done=by_status.get("done", 0),
            failed=by_status.get("failed", 0),
            running=by_status.get("running", 0),
            pending=by_status.get("pending", 0),
            finished_this_run=finished_this_run[lane.name],
            pruned=by_status.get("pruned", 0),
        )
    running = [
        {
            "trial_id": trial.trial_id,
            "family": trial.family + (f" x{len(w.task.trials)}" if len(w.task.trials) > 1 else ""),
            "project": trial.project,
            "worker": w.name,
            "seconds": now - started_at.get(trial.trial_id, now),
        }
        for w in busy
        for trial in w.task.trials[:1]
    ]
    return Snapshot(lanes=progress, elapsed_s=elapsed_s, running=running)
