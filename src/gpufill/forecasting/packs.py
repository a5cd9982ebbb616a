"""Same-shape neural trials trained as one fused pack, each scored alone (the engine fuses: engine/packs).

`size_pack` says how many trials of a shape to fuse on this device (measured; unfused with the reason where a
pack cannot train them); `train_pack` trains one pack and gives each trial's result to make, so its caller can
record each trial's failure on its own. A member's result has the same shape as the trial's alone, with the
pack's time shared among its models and the pack's peak memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from gpufill.engine.packs.size import CANDIDATE_SIZES, PackSizeChoice, choose_pack_size
from gpufill.engine.packs.stacked import pack_kind
from gpufill.engine.packs.train import PackMember, fit_pack
from gpufill.forecasting.data import WindowedProject
from gpufill.forecasting.run import TrialSetup, Watch, build_model, member_result
from gpufill.forecasting.trial import PackEntry, Trial, TrialResult

__all__ = ["CANDIDATE_SIZES", "PackSizeChoice", "data_bytes", "size_pack", "train_pack"]


def size_pack(trial: Trial, windows: WindowedProject, setup: TrialSetup, *, most: int, waiting: int | None = None) -> PackSizeChoice:
    """How many trials of `trial`'s shape to fuse (at most `most`): measured on its windows and device, unless the
    `waiting` trials of the shape train in less time than measuring would take."""
    return choose_pack_size(lambda: build_model(trial, windows, setup.config.loss), (windows.x_train, windows.y_train), config=setup.config, name=trial.family,
                            candidates=[k for k in CANDIDATE_SIZES if k <= most], data_bytes=data_bytes(windows), trainings=waiting)


def data_bytes(windows: WindowedProject) -> int:
    """One trial's windows as a pack holds them on the device (train and validation)."""
    return sum(int(t.numel()) * t.element_size() for t in (windows.x_train, windows.y_train, windows.x_val, windows.y_val))


def train_pack(trials: Sequence[Trial], windows: Mapping[str, WindowedProject], setups: Mapping[str, TrialSetup], *, kind: str | None,
               reason: str | None, watches: Mapping[str, Watch] | None = None, folded: Mapping[str, WindowedProject] | None = None
               ) -> list[tuple[float, Callable[[], TrialResult]]]:
    """Train `trials` (one shape, one width) as one pack: per trial, its share of the pack's seconds and its result,
    made when called (scoring may fail for one trial alone). Raises where the pack itself fails: its trials can
    still train one at a time. `watches`: per trial id, what watches it train (a search's pruner stops a member
    inside the pack, the others go on). `folded`: per trial id, the windows its refit trains on (train.refit): each
    member's own length, so each refits alone, as it would have unpacked."""
    watches, folded = watches or {}, folded or {}
    widths = sorted({windows[t.trial_id].n_features for t in trials})
    if len(widths) > 1:  # the scheduler's queue keeps widths apart (policy/queue.py): a pack that mixes them was mis-sent
        raise ValueError(f"the pack's projects take inputs of {widths} features; only equal widths fuse")
    first = setups[trials[0].trial_id].config
    on_cuda = str(first.device).startswith("cuda")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    models, members = [], []
    for trial in trials:
        w, config = windows[trial.trial_id], setups[trial.trial_id].config
        models.append(build_model(trial, w, config.loss))  # the same initial weights as the trial alone
        watch = watches.get(trial.trial_id)
        members.append(PackMember(train=(w.x_train, w.y_train), val=(w.x_val, w.y_val) if w.x_val.shape[0] else None,
                                  lr=config.lr, weight_decay=config.weight_decay, seed=trial.seed, watch=watch.member() if watch else None))
    fits = fit_pack(models, members, config=first, kind=kind)  # first's tune cache: the pack's compile measurement, once per shape
    peak = int(torch.cuda.max_memory_reserved()) if on_cuda else None  # the pack's, for GPU admission
    pack = PackEntry(len(trials), reason or f"a pack of {len(trials)} ({kind or pack_kind(fits[0].model)}): "
                                            "the size the scheduler sent (measured for this shape, or resources.pack_size)")
    return [(fitted.timings["train_s"], lambda trial=trial, fitted=fitted: member_result(trial, fitted, windows, setups, folded, pack, peak, watches))
            for trial, fitted in zip(trials, fits, strict=True)]
