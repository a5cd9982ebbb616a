"""Whether a CPU training's torch threads outnumber the cores free to run them, and what fewer gain.

A doctor measures it (thread_trial.py: the same steps at the script's thread count and at fewer,
interleaved, median of per-round ratios); a watch, which never changes the run it watches, infers
it from the load: the cores other processes kept busy (host samples minus the training's own CPU
time) leave fewer free than the script's threads. Either way this verdict comes before any other:
steps timed while threads stall each other say nothing about batch size or the optimizer.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from gpufill.doctor.bottleneck import Verdict
from gpufill.script.thread_trial import MIN_ROUNDS

NOISE_FLOOR = 1.10
"""A measured gain below this is not worth a verdict."""
WINNING_ROUNDS = 0.75
"""The share of rounds fewer threads must win (every round of 2 or 3, 3 of 4): one scheduler hiccup in a block of two
steps may lose a round, a real stall does not lose many."""
SPARE_THREADS = 0.5
"""Threads may exceed the free cores by this much before a watch calls them oversubscribed (sampling noise)."""


@dataclass(frozen=True, slots=True)
class ThreadGain:
    """Fewer threads, measured: the median of per-round step-time ratios (script's / fewer) and their range."""

    threads: int
    fewer: int
    gain: float
    low: float
    high: float
    rounds: int
    won: int
    """Rounds in which fewer threads were faster."""

    @property
    def clear(self) -> bool:
        return self.rounds >= MIN_ROUNDS and self.gain >= NOISE_FLOOR and self.won >= math.ceil(WINNING_ROUNDS * self.rounds)


def measured_gain(timed: dict[str, Any] | None) -> ThreadGain | None:
    """The best of the fewer-thread arms of a doctor's thread trial (None: no complete round)."""
    if not timed or not timed["rounds"]:
        return None
    script, *fewer = timed["arms"]
    best: ThreadGain | None = None
    for arm in fewer:
        ratios = sorted(statistics.median(r[str(script)]) / statistics.median(r[str(arm)]) for r in timed["rounds"])
        gain = ThreadGain(script, arm, statistics.median(ratios), ratios[0], ratios[-1], len(ratios), sum(r > 1.0 for r in ratios))
        if best is None or gain.gain > best.gain:
            best = gain
    return best


def busy_elsewhere(report: dict[str, Any], samples: list[dict[str, Any]]) -> float | None:
    """Cores other processes kept busy while the training stepped: of the cores it may use (its affinity; all where
    unknown), the busy ones minus the training's own (its process and DataLoader workers), from the host samples taken
    during its measured steps (all of the run's where fewer than two fell inside them)."""
    threads = report.get("threads") or {}
    used, window, cores = threads.get("cpu_used"), threads.get("window"), threads.get("affinity")
    host = [(row.get("ts", 0.0), _cores(row)) for row in samples if row.get("source") == "host" and row.get("cpu_per_core") is not None]
    inside = [cores_busy for ts, cores_busy in host if window and window[0] <= ts <= window[1]]
    chosen = inside if len(inside) >= 2 else [cores_busy for _, cores_busy in host]
    if not used or used[1] <= 0 or not chosen:
        return None
    busy = statistics.fmean(sum(c[i] for i in (cores or range(len(c))) if i < len(c)) / 100 for c in chosen)
    return max(0.0, busy - used[0] / used[1])


def _cores(row: dict[str, Any]) -> list[float]:
    values = row["cpu_per_core"]
    return json.loads(values) if isinstance(values, str) else values


def fix_text(threads: int, set_by_script: dict[str, Any] | None = None) -> str:
    """The fix: at the script's own torch.set_num_threads line when it has one (there the variable changes nothing),
    else the environment's OMP_NUM_THREADS."""
    if set_by_script:
        return f"torch.set_num_threads({threads}) at {set_by_script['at']}, where the script sets {set_by_script['to']}"
    # Not torch.set_num_threads: one call at a script's start pins MKL's threads too, and CPU attention then ran 1.77x
    # slower than under the variable (bench/results/cpu_settings-set-once-cpu-amd-epyc-2026-11-30.json).
    return f"OMP_NUM_THREADS={threads} in the script's environment (not torch.set_num_threads({threads}), which also pins MKL's threads)"


def _count_text(threads: dict[str, Any], script_threads: int) -> str:
    """How many threads and who set them: the script's line, OMP_NUM_THREADS, or torch's default."""
    set_by = threads.get("set_by_script")
    if set_by and set_by.get("to") == script_threads:
        return f"{script_threads} torch threads (set at {set_by['at']})"
    if threads.get("omp_num_threads"):
        return f"{script_threads} torch threads (OMP_NUM_THREADS={threads['omp_num_threads']})"
    return f"{script_threads} torch threads"


def thread_verdict(report: dict[str, Any], samples: list[dict[str, Any]]) -> Verdict | None:
    """The thread verdict of a CPU training (None: its threads are not what limits it, or not a CPU training)."""
    threads = report.get("threads") or {}
    script_threads, usable = threads.get("torch", 1), threads.get("usable_cores", 1)
    if script_threads <= 1 or any(d.startswith("cuda") for d in report["devices"]):
        return None
    others = busy_elsewhere(report, samples)
    load = "" if others is None else f"; other processes kept about {others:.1f} of them busy"
    set_by = threads.get("set_by_script")
    count = _count_text(threads, script_threads)
    gain = measured_gain(threads.get("trial"))
    if gain is not None:
        if gain.clear:
            reason = (f"{count} on {usable} usable cores{load}: at {gain.fewer} thread(s) the same steps ran "
                      f"{gain.gain:.2f}x as fast (median of {gain.rounds} interleaved rounds, {gain.low:.2f}-{gain.high:.2f}x); "
                      "each operator waits for all its threads, and a descheduled one stalls the rest")
            return Verdict(kind="thread-oversubscribed", reason=reason, evidence={"threads": script_threads, "usable_cores": usable,
                                                                                 "fewer": gain.fewer, "busy_elsewhere": others, "low": gain.low,
                                                                                 "high": gain.high},
                           fix=fix_text(gain.fewer, set_by), expected_gain=gain.gain,
                           expected_gain_reason=f"measured: {gain.rounds} interleaved rounds of {gain.threads} vs {gain.fewer} threads")
        if script_threads <= usable:
            return None
        # More threads than cores the process may use can only time-share them, whatever one trial measured on a box
        # whose load moves (a trial within the noise is said, not taken as "nothing to gain").
        reason = (f"{count} on {usable} usable cores{load}: the threads beyond the cores only time-share them, and each operator waits "
                  f"for all its threads; the trial measured {gain.gain:.2f}x at {gain.fewer} thread(s) "
                  f"({gain.low:.2f}-{gain.high:.2f}x over {gain.rounds} rounds: within this box's noise)")
        return Verdict(kind="thread-oversubscribed", reason=reason, evidence={"threads": script_threads, "usable_cores": usable, "fewer": usable,
                                                                             "busy_elsewhere": others},
                       fix=fix_text(usable, set_by), expected_gain=None,
                       expected_gain_reason="not measured clearly: more threads than usable cores never run at once")
    free = usable - (others or 0.0)
    if script_threads <= free + SPARE_THREADS:
        return None
    fewer = max(1, int(free))
    reason = (f"{count} on {usable} usable cores{load}, leaving {max(free, 0.0):.1f} free: each operator waits for "
              "all its threads, and a descheduled one stalls the rest")
    unfinished = trial_unfinished(report)  # a doctor's trial the script ended too soon for; a watch never runs one
    return Verdict(kind="thread-oversubscribed", reason=reason, evidence={"threads": script_threads, "usable_cores": usable, "busy_elsewhere": others},
                   fix=fix_text(fewer, set_by), expected_gain=None,
                   expected_gain_reason=f"inferred from the load, not measured: {unfinished}" if unfinished else
                   "inferred from the load, not measured (a watch does not change the run): `gpufill doctor -- COMMAND` times the steps at fewer threads")


def trial_unfinished(report: dict[str, Any]) -> str | None:
    """Why a doctor's thread trial measured nothing and what fits it in the script (None: none began, or it finished):
    the trial runs after the measured steps, and a script that ends first leaves fewer than MIN_ROUNDS rounds."""
    timed = (report.get("threads") or {}).get("trial")
    if timed is None or len(timed["rounds"]) >= MIN_ROUNDS:
        return None
    needed = MIN_ROUNDS * len(timed["arms"]) * timed["block"]
    before = report["warmup"] + report["steps_wanted"]
    seen = report["steps_seen"]
    fits = seen - report["warmup"] - needed
    shorter = f", or pass --steps {fits} so that it fits in the {seen} steps the script runs" if fits >= 2 else ""
    return (f"the thread trial could not finish: the script ended {max(seen - before, 0)} steps into it, and its {MIN_ROUNDS} rounds of "
            f"{' vs '.join(map(str, timed['arms']))} threads need {needed}; run the script for at least {before + needed} optimizer steps "
            f"(more epochs or data){shorter}")
