"""Failures of the environment, not of the trial: its data file missing, unreadable or changed since the run
began, a full disk, its worker killed from outside. They use none of the trial's retries.

The scheduler sends such a trial back to the queue and pauses dispatching for a while that grows with each
environment failure in a row (a success ends the streak), so a data file missing for a few seconds costs a
few seconds, not every trial's retries. A trial the environment fails `TRIAL_LIMIT` times in one run, and
every waiting trial once the failures have gone on for `PATIENCE_S` without a success, stay pending: the run
ends saying why, and a plain re-run once the cause is gone finishes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

PAUSES_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Dispatch pauses after the 1st, 2nd, ... environment failure in a row (the last repeats): short for a file
being rewritten, long enough not to spin through the queue while a disk is full."""
TRIAL_LIMIT = 5
"""Environment failures of one trial in one run before it is left pending for a re-run."""
PATIENCE_S = 300.0
"""How long environment failures may go on without a single success before the run stops waiting."""
CHANGED_PATIENCE_S = 60.0
"""...and how long when they say the data changed (read whole, with another fingerprint): a file being rewritten
changes for seconds; one that stays changed for a minute was replaced, and waiting longer will not bring it back."""
CHANGED = "changed since the run began"
"""The words of a worker's failure for data that is not the data the trial's id names (worker/worker.py writes them)."""


@dataclass(slots=True)
class EnvironmentWait:
    """What a run knows of its environment's failures: the streak, the pause, each trial's count."""

    clock: Callable[[], float] = time.monotonic
    patience_s: float = PATIENCE_S
    trial_limit: int = TRIAL_LIMIT
    streak: int = 0
    """Environment failures since the last success."""
    since: float | None = None
    """When the streak began (None: no failure since the last success)."""
    pause_until: float = float("-inf")
    failures: dict[str, int] = field(default_factory=dict)
    """Trial id -> its environment failures in this run."""
    last_error: str = ""
    changed_since: float | None = None
    """When the streak's first changed-data failure came (None: none since the last success)."""
    changed_patience_s: float = CHANGED_PATIENCE_S

    def failed(self, trial_id: str, error: str) -> float | None:
        """Record one; the seconds dispatching pauses, or None when this trial is left pending for this run."""
        now = self.clock()
        self.streak += 1
        self.since = now if self.since is None else self.since
        if CHANGED in error and self.changed_since is None:
            self.changed_since = now
        self.last_error = error
        pause = PAUSES_S[min(self.streak, len(PAUSES_S)) - 1]
        self.pause_until = max(self.pause_until, now + pause)
        self.failures[trial_id] = self.failures.get(trial_id, 0) + 1
        return pause if self.failures[trial_id] < self.trial_limit else None

    def succeeded(self) -> None:
        """A trial finished: the environment works again."""
        self.streak, self.since, self.changed_since, self.pause_until = 0, None, None, float("-inf")

    def paused(self) -> bool:
        return self.clock() < self.pause_until

    def exhausted(self) -> bool:
        """Failures have gone on for longer than the patience without a success (or the data stayed changed for
        longer than its own): stop waiting."""
        now = self.clock()
        return (self.since is not None and now - self.since > self.patience_s) or self._stayed_changed(now)

    def why_stopped(self, left: int) -> str:
        """The one line a run that stops waiting says."""
        if self._stayed_changed(self.clock()):
            return (f"the data stayed changed for {self.changed_patience_s:g} s (replaced, not being rewritten): {left} trials registered "
                    f"under the data as it was stay pending; run the same command again to register and train the new data's trials "
                    f"(last: {self.last_error})")
        return f"the environment failed every trial for {self.patience_s:g} s: {left} trials stay pending for a re-run (last: {self.last_error})"

    def _stayed_changed(self, now: float) -> bool:
        return self.changed_since is not None and now - self.changed_since > self.changed_patience_s
