"""What the scheduler and its workers say to each other, wherever a worker runs: a local process, the scheduler's
own process (inline), a Ray actor, a Slurm job.

The scheduler sends a `Task`: the trials, and how they train together (`PackOrder`, the policy's decision). A worker
answers with one `TaskEnded`; a worker that reports progress (local, inline) also sends, as they happen, `Ready`
once it has started, a `Heartbeat` every few seconds, `Started` when trials begin, `TrialEnded` with each trial's
`Outcome`, and `PackMeasured` when it measured a new shape's pack size. Frozen dataclasses of plain values: they
pickle through a pipe, Ray and submitit alike, and an executor needs nothing else to carry them
(tests/campaign/executors/test_executor_suite.py holds every executor to the same checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpufill.forecasting.trial import Trial, TrialResult

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PackOrder:
    """How a task's trials train (policy/policy.py decides): one at a time (`size` 1), all as one fused pack of `kind`
    (a measured size: the task holds at most that many, of one input width), or, for a new shape (`size` None), as
    `split` says once the worker measured the size, weighing the measurement against the `waiting` trials of the shape."""

    size: int | None = 1
    kind: str | None = None
    reason: str | None = None
    waiting: int = 1
    """The shape's trials in this task and still queued."""

    def split(self, trials: Sequence[T], measured: int) -> tuple[list[T], list[T]]:
        """A measuring task's trials: the first `measured` (campaign order) train as one pack (one at a time where
        `measured` is 1), the rest go back to the queue untouched, for any worker to take at the measured size."""
        return list(trials[:measured]), list(trials[measured:])


@dataclass(frozen=True, slots=True)
class Task:
    """One trial, or neural trials of one shape to train as fused packs."""

    trials: tuple[Trial, ...]
    pack: PackOrder = PackOrder()
    pruning: dict[str, Any] | None = None
    """A pruned search's settings and its earlier rounds' trials (campaign/trials/pruning.py); None without a pruner."""

    @property
    def shape(self) -> str:
        return self.trials[0].shape


@dataclass(frozen=True, slots=True)
class Outcome:
    """One trial's attempt: its result, or its error (`environment`: the machine's failure, which uses no retry)."""

    trial_id: str
    ok: bool
    seconds: float = 0.0
    """The worker's own clock: a pack member's share of the pack's training plus its refit and scoring."""
    result: TrialResult | None = None
    error: str = ""
    traceback: str = ""
    environment: bool = False


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker finished starting (imports, CUDA context): heartbeats count from here."""

    pid: int
    context_bytes: int | None = None
    """Device memory its CUDA context holds outside PyTorch's allocator (None: not on a GPU, or unknown)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    at: float


@dataclass(frozen=True, slots=True)
class Started:
    """These trials began training (together: a pack)."""

    trial_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TrialEnded:
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class PackMeasured:
    """A new shape's pack size, as measured: {"size", "reason", "kind", "samples_per_s", "peak_bytes"} (policy/admission.py)."""

    pack: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TaskEnded:
    """The task's end: every outcome not sent before, the pack size it measured (if it did), and the trials it
    handed back unattempted (a measured pack trains one pack of the size; the rest go back to the queue)."""

    outcomes: tuple[Outcome, ...] = ()
    pack: dict[str, Any] | None = None
    returned: tuple[str, ...] = field(default_factory=tuple)


Progress = Ready | Heartbeat | Started | TrialEnded | PackMeasured
Message = Progress | TaskEnded
