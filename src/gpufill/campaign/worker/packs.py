"""A worker's side of fused packs: it trains the pack its task names, measuring a new shape's size first.

Which trials train together is the policy's (policy/policy.py): a task of a measured shape is one pack, of one
input width. For a shape the scheduler has not sized yet, the worker first measures one model at a time against
fused packs of 2, 4, ... 64 on its device (`forecasting.packs.size_pack`), tells the scheduler at once (the
size, and each size's peak memory with the trials' data, which GPU admission adds up), trains the pack the order's
`split` names and hands the other trials back (not attempted); later packs of that shape arrive at the
measured size. How a pack trains and scores is forecasting's (forecasting/packs.py); a pack that fails
trains its trials one at a time, saying why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from gpufill.campaign.policy.messages import Outcome, PackMeasured, PackOrder, Progress, Started, TaskEnded, TrialEnded
from gpufill.campaign.worker.attempt import attempt
from gpufill.forecasting.packs import PackSizeChoice, size_pack, train_pack
from gpufill.forecasting.run import TrialSetup
from gpufill.forecasting.trial import PackEntry, Trial, TrialResult


class PackHost(Protocol):
    """What packs need of the worker's TrialRunner (campaign/worker/worker.py)."""

    device: str

    def trial_windows(self, trial: Trial) -> Any: ...
    def setup(self, trial: Trial) -> TrialSetup: ...
    def folded_windows(self, trial: Trial, setup: TrialSetup) -> list[Any] | None: ...
    def watch(self, trial: Trial, windows: list[Any]) -> Any: ...
    def run(self, trial: Trial, *, pack: PackEntry | None = None) -> TrialResult: ...
    def note(self, message: Progress) -> None: ...
    def attempt(self, trial: Trial, run: Any) -> Outcome: ...


def run_pack(runner: PackHost, trials: list[Trial], order: PackOrder) -> TaskEnded:
    """Train `trials` (one shape and input width) as the order says: one pack of them all, or, for a new shape (size
    None), the pack `order.split` names once the size is measured here (unless the shape's waiting trials train in
    less time than measuring takes); the rest are handed back."""
    windows = {t.trial_id: runner.trial_windows(t) for t in trials}
    if order.size is not None:  # its plan names the size sent and the pack's kind (the measurement's reason stays the first pack's)
        return TaskEnded(tuple(_train_pack(runner, trials, windows, None, order.kind)))
    first = trials[0]
    try:
        choice = size_pack(first, windows[first.trial_id], runner.setup(first), most=len(trials), waiting=order.waiting or len(trials))
    except Exception as error:  # the trials themselves will report it, one by one
        choice = PackSizeChoice(size=1, samples_per_s={}, reason=f"unfused: measuring packs failed ({type(error).__name__})")
    runner.note(PackMeasured(_pack_message(choice)))  # the scheduler sizes and admits this shape from now on
    pack, returned = order.split(trials, choice.size)
    if choice.size == 1:
        unfused = PackEntry(1, choice.reason)
        outcomes = [runner.attempt(t, lambda t=t: runner.run(t, pack=unfused)) for t in pack]
    else:
        outcomes = _train_pack(runner, pack, windows, choice.reason, choice.kind)
    return TaskEnded(tuple(outcomes), _pack_message(choice), tuple(t.trial_id for t in returned))


def _pack_message(choice: PackSizeChoice) -> dict[str, Any]:
    """What the scheduler learns of a shape: the size, why, and a pack's peak device memory per K
    (the measured step's peak plus K trials' data, which a pack keeps on the device)."""
    return {"size": choice.size, "reason": choice.reason, "kind": choice.kind, "samples_per_s": {str(k): v for k, v in choice.samples_per_s.items()},
            "peak_bytes": {str(k): peak for k, peak in choice.peak_bytes.items()}}


def _train_pack(runner: PackHost, chunk: list[Trial], windows: dict[str, Any], reason: str | None, kind: str | None) -> list[Outcome]:
    """One pack of a shape that trains fused; a lone trial too, as a pack of one: the same kernels, and a member's
    numbers do not depend on how many train beside it, so a resumed run's leftover trains what an uninterrupted run's
    pack did (test_resume_numerics)."""
    runner.note(Started(tuple(t.trial_id for t in chunk)))
    try:
        watches = {t.trial_id: found for t in chunk if (found := runner.watch(t, [windows[t.trial_id]])) is not None}
        setups = {t.trial_id: runner.setup(t) for t in chunk}
        folded = {t.trial_id: found[0] for t in chunk if (found := runner.folded_windows(t, setups[t.trial_id]))}
        scored = train_pack(chunk, windows, setups, kind=kind, reason=reason, watches=watches, folded=folded)
    except Exception as error:  # a fused kernel failed: these trials still run, one at a time, saying why
        said = str(error).splitlines()[0][:120] if str(error) else ""
        unfused = PackEntry(1, f"the pack of {len(chunk)} failed ({type(error).__name__}: {said}); trained one at a time")
        return [runner.attempt(t, lambda t=t: runner.run(t, pack=unfused)) for t in chunk]
    out = []
    for trial, (seconds, score) in zip(chunk, scored, strict=True):
        outcome = attempt(trial, score)  # its refit and scoring, timed as an unpacked trial's are
        outcome = dataclasses.replace(outcome, seconds=outcome.seconds + seconds)  # and its share of the pack's training
        runner.note(TrialEnded(outcome))
        out.append(outcome)
    return out
