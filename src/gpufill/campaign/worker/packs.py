"""A worker's side of fused packs: when a shape is measured, which trials train together, what is handed back.

For a shape the scheduler has not sized yet, the worker first measures one model at a time against
fused packs of 2, 4, ... 64 on its device (`forecasting.packs.size_pack`), tells the scheduler at once (the
size, and each size's peak memory with the trials' data, which GPU admission adds up), trains one pack of the
measured size, and hands the other trials back (not attempted); later packs of that shape arrive at the
measured size. How a pack trains and scores is forecasting's (forecasting/packs.py); a pack that fails
trains its trials one at a time, saying why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from gpufill.campaign.policy.messages import Outcome, PackMeasured, PackOrder, Progress, Started, TaskEnded, TrialEnded
from gpufill.campaign.worker.attempt import attempt
from gpufill.forecasting.packs import PackSizeChoice, by_width, size_pack, train_pack
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
    """Train `trials` (one shape) as packs of the order's size and kind (size None: measure both here first, unless
    the shape's waiting trials train in less time than measuring takes)."""
    windows = {t.trial_id: runner.trial_windows(t) for t in trials}
    choice = None
    pack_size, kind = order.size, order.kind
    if pack_size is None:  # a new shape: measure on this device
        first = trials[0]
        try:
            choice = size_pack(first, windows[first.trial_id], runner.setup(first), most=len(trials), waiting=order.waiting or len(trials))
        except Exception as error:  # the trials themselves will report it, one by one
            choice = PackSizeChoice(size=1, samples_per_s={}, reason=f"unfused: measuring packs failed ({type(error).__name__})")
        pack_size, kind = choice.size, choice.kind
        runner.note(PackMeasured(_pack_message(choice)))  # the scheduler sizes and admits this shape from now on
    # Run one pack of the measured size; hand the rest back, so other workers share them.
    trials, returned = trials[:pack_size], tuple(t.trial_id for t in trials[pack_size:])
    outcomes: list[Outcome] = []
    if pack_size == 1:
        unfused = PackEntry(1, choice.reason) if choice is not None else None
        outcomes = [runner.attempt(t, lambda t=t: runner.run(t, pack=unfused)) for t in trials]
    else:
        for group in by_width(trials, windows):
            for start in range(0, len(group), pack_size):
                outcomes += _train_chunk(runner, group[start : start + pack_size], windows, choice.reason if choice else None, kind)
    return TaskEnded(tuple(outcomes), None if choice is None else _pack_message(choice), returned)


def _pack_message(choice: PackSizeChoice) -> dict[str, Any]:
    """What the scheduler learns of a shape: the size, why, and a pack's peak device memory per K
    (the measured step's peak plus K trials' data, which a pack keeps on the device)."""
    return {"size": choice.size, "reason": choice.reason, "kind": choice.kind, "samples_per_s": {str(k): v for k, v in choice.samples_per_s.items()},
            "peak_bytes": {str(k): peak for k, peak in choice.peak_bytes.items()}}


def _train_chunk(runner: PackHost, chunk: list[Trial], windows: dict[str, Any], reason: str | None, kind: str | None) -> list[Outcome]:
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
