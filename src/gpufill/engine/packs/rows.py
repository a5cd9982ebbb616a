"""A fused pack as the epoch loop (engine/epochs.py) drives it: its members are the rows.

A member that stops (the loop's `Stopping` decides) is masked: it stops changing while the others train on. Where
members stopped and a pack of the survivors alone measures faster than going on masked (packs/reform.py), the
survivors go on as that smaller pack; the stopped members' weights stay in the first pack, the survivors' are
written back into it at the end, so every member is unfused from the pack it started in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TypeVar
import torch

from gpufill.engine.packs.pack_run import PackRun
from gpufill.engine.packs.probe import PackProbe, configure
from gpufill.engine.packs.reform import MEASURED_STEPS, decide, needs_measurement
from gpufill.engine.result import EpochRecord
from gpufill.engine.epochs import BestWeights, Stopping, Trained

T = TypeVar("T")

MemberWatch = Callable[[int, Callable[[], torch.Tensor]], "str | None"]
"""(epoch, a getter of the member's validation predictions (N_val, ...), in the pack's scaled units) -> a reason to stop."""


class PackRows:
    """The pack's members by row; `run` is the pack training them now (the first, or one re-formed from survivors),
    `members[j]` the member its row j is."""

    def __init__(self, home: PackRun, generators: Sequence[torch.Generator], stopping: Stopping, watches: Sequence[MemberWatch | None],
                 *, reform: str):
        self.home = self.run = home
        self.members = list(range(home.k))
        self.generators, self.stopping, self.watches, self.reform = list(generators), stopping, list(watches), reform
        self.best = BestWeights(home.fused.state_dict, stacked=True)
        self.has_validation = home.data.vx is not None
        self.seconds: list[float] = []
        """The pack's epoch seconds, whichever pack trained them."""
        self.run_seconds: list[float] = []
        """The current pack's own epoch seconds (a re-formed pack starts its own)."""
        self.considered = home.k
        """Members training when the pack last considered re-forming (it considers again when fewer are)."""

    def _by_member(self, values: Sequence[T], fill: T) -> list[T]:
        """The current pack's values by row, as the first pack's members (`fill` for those not in it)."""
        out = [fill] * self.home.k
        for j, i in enumerate(self.members):
            out[i] = values[j]
        return out

    def train_epoch(self, epoch: int, steps_left: Sequence[int] | None) -> Trained:
        tick = time.perf_counter()
        left = None if steps_left is None else [steps_left[i] for i in self.members]
        loss, finite, steps, samples = self.run.epoch([self.generators[i] for i in self.members], left)
        seconds = time.perf_counter() - tick
        self.seconds.append(seconds)
        self.run_seconds.append(seconds)
        return Trained(values={"loss": self._by_member(loss, math.nan)}, samples=self._by_member(samples, 0), steps=self._by_member(steps, 0),
                       seconds=seconds / self.run.k, finite=self._by_member(finite, True))

    def validate(self) -> dict[str, Sequence[float]]:
        return {"loss": self._by_member(self.run.validate(), math.nan)}

    def lrs(self) -> Sequence[float]:
        return self._by_member(self.run.learning_rates(), math.nan)

    def keep_best(self, rows: Sequence[int]) -> None:
        if self.run is self.home:
            self.best.keep(rows)
        else:
            self.best.keep(rows, source=self.run.fused.state_dict(), at=self.members)

    def epoch_end(self, epoch: int, records: dict[int, EpochRecord], ending: set[int]) -> dict[int, str]:
        """Each still-training member's watch asked whether to stop it here (the predictions made once for all, when
        the first watch asks)."""
        if not self.has_validation or not any(self.watches):
            return {}
        predictions: list[torch.Tensor] = []

        def member(i: int) -> torch.Tensor:
            if not predictions:
                predictions.append(self.run.predict())
            j = self.members.index(i)
            n_val = self.run.data.n_val
            assert n_val is not None
            return predictions[0][j, : int(n_val[j])]

        reasons = {}
        for i in self.stopping.training:
            watch = self.watches[i]
            if watch is not None and i not in ending and (reason := watch(epoch, lambda i=i: member(i))):
                reasons[i] = reason
        return reasons

    def after_epoch(self, epoch: int, last: bool) -> None:
        """Stopped members masked; where fewer train than when last considered, perhaps a smaller pack from here."""
        training = set(self.stopping.training)
        stopped = [j for j, i in enumerate(self.members) if i not in training]
        if stopped:
            self.run.active[stopped] = False
        if not last:
            self._reform(epoch, [i for i in self.members if i in training])

    def _reform(self, epoch: int, keep: list[int]) -> None:
        """Where members stopped: the survivors as a smaller pack when that measures faster than going on masked
        (packs/reform.py); the decision is an event of every member of the current pack."""
        if len(keep) >= self.considered:
            return
        self.considered = len(keep)
        run, cfg = self.run, self.run.cfg
        rows = [self.members.index(i) for i in keep]
        epochs_left = cfg.epochs - epoch
        smaller, reformed_epoch_s, build_s = None, None, 0.0
        if self.reform == "always" or needs_measurement(self.reform, run.steps_per_epoch * epochs_left):
            tick = time.perf_counter()
            smaller = run.survivors(rows)
            build_s = time.perf_counter() - tick
            if self.reform == "measured":
                measured = PackProbe(smaller).measure(run.plan, timed_steps=MEASURED_STEPS, check=False)
                if measured.step_s is not None:
                    reformed_epoch_s, build_s = measured.step_s * smaller.steps_per_epoch, build_s + measured.setup_s
        decision = decide(mode=self.reform, k=run.k, kept=len(keep), epoch=epoch, epochs_left=epochs_left,
                          masked_epoch_s=min(self.run_seconds), reformed_epoch_s=reformed_epoch_s, build_s=build_s)
        for events in run.events:
            events.append(decision.event)
        if not decision.reform or smaller is None:
            return
        assert run.plan is not None
        smaller.plan = configure(smaller, run.plan)
        self._write_home()
        run.let_go()
        self.run, self.members, self.run_seconds = smaller, keep, []

    def _write_home(self) -> None:
        """The current pack's members' weights into their rows of the first pack (nothing when it is the first)."""
        if self.run is self.home:
            return
        rows = torch.tensor(self.members, device=self.home.device)
        with torch.no_grad():
            theirs = self.run.fused.state_dict()
            for name, tensor in self.home.fused.state_dict().items():
                tensor[rows] = theirs[name]

    def finish(self) -> None:
        """Every member's last weights in the first pack, then the best weights back where restore_best asks."""
        self._write_home()
        self.stopping.restore_best(self.best)
