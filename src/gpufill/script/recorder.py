"""The state of gpufill's instrumentation inside a user's process (instrument.py installs the hooks that
feed it): each optimizer step's marks, their digest into per-step phases (data wait, copy, backward,
optimizer, the rest as forward) on the host's or the GPU's clock (clocks.py), host reads of device
values per script line, one step's census (FLOPs, operators, bytes, matmul dtypes), and the JSON
report written per process (per rank under torchrun).

The hot path (every optimizer step) only appends one tuple of marks; everything else happens once
per timeline interval (a whole run) or at the end (a doctor's N steps).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufill.cpus import usable_cpus
from gpufill.errors import InputError
from gpufill.files import append_whole, write_atomically
from gpufill.script.census import StepCensus, compiled
from gpufill.script.clocks import Clock, CudaClock, HostClock
from gpufill.script.hand_updates import HandUpdates
from gpufill.script.lines import in_library, short_path
from gpufill.script.thread_trial import ThreadTrial, affinity, tree_cpu_seconds

WHOLE_RUN = 0
"""GPUFILL_SCRIPT_STEPS for a watch: never stop the script."""
STOPPED_EXIT = 0
DIGEST_EVERY = 4096
"""Marks digested at the latest after this many steps (very fast steps within one timeline interval)."""
RECORDS_KEPT = 10_000
"""Per-step records kept for medians (a doctor's few dozen; a day-long watch keeps totals and its timeline)."""
PHASES = ("step_s", "data_s", "copy_s", "backward_s", "optimizer_s", "forward_s")

_clock = time.perf_counter


class Recorder:
    """The hooks' shared state. The hot path (every optimizer step) only appends one tuple of clock
    marks, (end, optimizer start, the step's data/copy/backward spans); `_digest` turns them into
    per-step phases, (step, data, copy, backward, optimizer, forward) seconds in PHASES order, once
    per timeline interval (a whole run) or at the end (a doctor's N steps)."""

    def __init__(self, out: Path, steps: int, warmup: int, bucket_s: float = 1.0, settings: tuple[str, ...] = (), thread_trial: bool = False):
        self.out, self.steps, self.warmup, self.bucket_s, self.settings = out, steps, warmup, bucket_s, settings
        self.wants_thread_trial = thread_trial and steps != WHOLE_RUN
        self.trial: ThreadTrial | None = None
        self.cpu_start: tuple[float, float, float] | None = None
        """(CPU seconds of this process and its children, host clock, wall clock) when the measured steps began."""
        self.cpu_used: tuple[float, float] | None = None
        """(CPU seconds of this process and its children, wall seconds) over the measured steps: the cores the training kept busy."""
        self.cpu_window: tuple[float, float] | None = None
        """Wall-clock start and end of the measured steps (the host samples within it are the load beside them)."""
        self.whole_run = steps == WHOLE_RUN
        self.stop_at = -1 if self.whole_run else warmup + steps
        self.stop_sent = False
        """The stop was raised (SystemExit at stop_step); a step after it means the script caught it."""
        self.stop_step = self.stop_at
        """The step at which the stop was raised (after the measured steps, or after a thread trial)."""
        self.flop_step = max(1, warmup - 1)  # FLOPs counted on the next step: the last warm-up step (compiled, autotuned)
        self.rank = int(os.environ.get("RANK", "0"))
        self.step_count = 0
        self.measuring = warmup == 0
        self.pre_at: Any = None
        self.marks: list[tuple[Any, Any, list[Any]]] = []
        """(end of the step, start of its optimizer step, its spans) per step not yet digested."""
        self._use(HostClock())
        self.first_mark = 1
        """The step number (1-based) whose end is marks[0]: after a digest the last mark stays, the next step starts at it."""
        self.next_digest = time.perf_counter() + bucket_s
        self.wall_offset = time.time() - time.perf_counter()
        self.records: list[tuple[float, ...]] = []
        self.totals = [0.0] * len(PHASES)
        self.measured = 0
        self.syncs: Counter[str] = Counter()
        self.sync_steps: Counter[str] = Counter()
        """Per site, the steps (gaps between optimizer steps) with at least one read there."""
        self._site_step: dict[str, int] = {}
        self._sites: dict[tuple[str, str, int], str | None] = {}
        self.loaders: list[dict[str, Any]] = []
        self.optimizers: dict[int, dict[str, Any]] = {}
        self.built_at: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        """The script's line that built each optimizer (for `fused=True` there)."""
        self.threads_set: dict[str, Any] | None = None
        """The script's own torch.set_num_threads(N): {"at": file:line, "to": N}, its first call (the thread fix names it)."""
        self.backward_at: str | None = None
        self.hand = HandUpdates()
        self.by_hand = False
        """The script updates its parameters by hand: a step ends at each backward's end (hand_updates.py)."""
        self.batch_size: int | None = None
        self.flops: float | None = None
        self.matmul_dtypes: Counter[str] = Counter()
        self.devices: set[str] = set()
        self.written = False
        self.write_error: str | None = None
        """Why the step timeline stopped being written (a full disk), if it did."""
        self.started_at = time.time()
        self.stop_reason = "the script ended before the measured steps"
        self.error: str | None = None
        self.ops: int | None = None
        self.bytes: int | None = None
        self._flop_mode: Any = None
        self._census: Any = None

    # -- the hot path -----------------------------------------------------------------------
    def pre_step(self, optimizer: Any, *_: Any) -> None:
        if self.by_hand:
            return  # steps are counted at each backward already
        if id(optimizer) not in self.optimizers:
            self.hand.optimizer_stepped()
            self._first_seen(optimizer)
        self.pre_at = self.now()

    def before_backward(self, loss: Any) -> None:
        if self.by_hand or self.hand.decided is False:
            return
        try:
            seen = self.hand.before(loss)
        except Exception:  # noqa: BLE001 - a parameter moved or changed shape: the script's backward never fails for its measurement
            self.hand.decided = False
            return
        if seen:
            self.by_hand = True
            self.optimizers[0] = self.hand.describe()
            self._seen_parameters(self.hand.parameters)

    def after_backward(self) -> None:
        if self.by_hand:
            self.post_step(None)
        elif self.hand.decided is None:
            self.hand.after()

    def _add_on_host(self, kind: int, start: Any) -> None:
        self.spans[kind] += _clock() - start

    def _add_on_gpu(self, kind: int, start: Any) -> None:
        if start is not None and not isinstance(start, float):  # a span begun on the host clock (before the switch) is dropped
            self.spans.append((kind, start, self.now()))

    def _now_on_gpu(self) -> Any:
        """A GPU mark, from the training's own thread only: a background thread's next() or copy would
        put its events between the step's kernels (None: not timed)."""
        return self.clock.now() if threading.get_ident() == self._thread else None

    def post_step(self, optimizer: Any, *_: Any) -> None:
        if self.by_hand and optimizer is not None:
            return
        if self.trial is not None and not self.stop_sent:
            self.step_count += 1
            if self.trial.after_step():
                self._stop()
            return
        if self.stop_sent:  # the script caught the stop (a bare `except:`) and trains on: count its steps, measure nothing more
            self.step_count += 1
            self.spans = self.clock.fresh()
            return
        self.marks.append((self.now(), self.pre_at, self.spans))
        self.spans = self.clock.fresh()
        now = _clock()
        self.step_count += 1
        self.measuring = self.step_count >= self.warmup  # for the syncs: a doctor's run stops at stop_at
        if self.cpu_start is None and self.step_count >= self.warmup:
            self.cpu_start = (tree_cpu_seconds(), now, time.time())
        if self._flop_mode is not None or self.step_count == self.flop_step:
            self._count_flops_around()
        if now >= self.next_digest or len(self.marks) >= DIGEST_EVERY:
            try:
                self._digest()
            except Exception as error:  # noqa: BLE001 - the script's training never fails for its measurement
                self._give_up_timing(error)
        if self.step_count == self.stop_at:
            self._end_measured_steps()
            if self.trial is None:
                self._stop()

    def _end_measured_steps(self) -> None:
        """The measured steps are over: their CPU use, and on a CPU training the thread trial begins."""
        self.measuring = False
        self._note_cpu_used()
        # Under torchrun each rank would time its own blocks: ranks that step in lockstep must stop together.
        one_process = int(os.environ.get("WORLD_SIZE", "1")) == 1
        if not (self.wants_thread_trial and one_process and self.devices and all(d == "cpu" for d in self.devices)):
            return
        import torch

        threads = torch.get_num_threads()
        if threads > 1:
            self._digest(final=True)
            from gpufill.engine.backend import set_threads

            self.trial = ThreadTrial(torch, threads, usable_cpus(), set_threads=set_threads)
            self.trial.start()

    def _note_cpu_used(self) -> None:
        if self.cpu_start is not None and self.cpu_used is None:
            self.cpu_used = (tree_cpu_seconds() - self.cpu_start[0], _clock() - self.cpu_start[1])
            self.cpu_window = (self.cpu_start[2], time.time())

    def _stop(self) -> None:
        self.stop_reason = f"stopped after {self.warmup} warm-up and {self.steps} measured steps" + (
            f" and a thread trial of {self.step_count - self.stop_at} steps" if self.trial is not None else "")
        self.write()
        self.stop_sent, self.measuring, self.stop_step = True, False, self.step_count
        raise SystemExit(STOPPED_EXIT)

    def ran_on(self) -> bool:
        """The script caught gpufill's stop (a bare `except:` or `except BaseException:` around its step) and trained on."""
        return self.stop_sent and self.step_count > self.stop_step

    # -- off the hot path -------------------------------------------------------------------
    def _first_seen(self, optimizer: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.optimizers[id(optimizer)] = {"class": type(optimizer).__name__, "parameters": int(sum(p.numel() for p in params)),
                                          "tensors": len(params), "lr": optimizer.param_groups[0].get("lr"),
                                          "foreach": optimizer.defaults.get("foreach"), "fused": optimizer.defaults.get("fused"),
                                          "at": self.built_at.get(optimizer)}
        self._seen_parameters(params)

    def _seen_parameters(self, params: list[Any]) -> None:
        self.devices.update(str(p.device) for p in params)
        cuda = next((p.device for p in params if p.is_cuda), None)
        if not self.whole_run and isinstance(self.clock, HostClock) and cuda is not None:
            self._time_on_the_gpu(device=cuda)

    def _time_on_the_gpu(self, clock: Clock | None = None, device: Any = None) -> None:
        """From this step on, the phases are timed on the GPU's timeline (clocks.py says why). The steps
        before it (warm-up: a training is seen at its first optimizer step) had host marks: dropped."""
        if clock is None:
            import torch

            clock = CudaClock(torch, device=device)
        self._thread = threading.get_ident()
        self._use(clock, now=self._now_on_gpu, add=self._add_on_gpu)
        self.first_mark = self.step_count + 1
        # A DataLoader worker forked from here must not touch CUDA (it cannot initialise it): back to the host's clock.
        os.register_at_fork(after_in_child=lambda: self._use(HostClock()))

    def _give_up_timing(self, error: Exception) -> None:
        """GPU marks that cannot be read (a CUDA error): the steps read so far stay; no more are timed."""
        self.error = self.error or f"step timing stopped after {self.measured} measured steps: {error}"
        self._use(self.clock, now=lambda: None, add=lambda kind, start: None)

    def _use(self, clock: Clock, *, now: Callable[[], Any] | None = None, add: Callable[[int, Any], None] | None = None) -> None:
        """Time the phases by `clock` from now on; marks taken on another clock are dropped.

        `now()` is a mark on that clock; `add(kind, start)` ends a data wait, copy or backward
        (clocks.DATA, COPY, BACKWARD) begun at `start`: the wrappers call these two."""
        self.clock = clock
        self.now = now or clock.now
        self.add = add or self._add_on_host
        self.spans: list[Any] = clock.fresh()
        self.marks.clear()

    def _digest(self, *, final: bool = False) -> None:
        """Per-step phases of the marks so far; a whole run writes them as one line of its timeline.
        On the GPU's clock the marks are read once the GPU has passed the last one (waiting for it
        only at the end, or when DIGEST_EVERY steps are pending)."""
        marks, clock = self.marks, self.clock
        self.next_digest = _clock() + self.bucket_s
        if clock.capturing():
            return  # no event may be queried while a CUDA graph is captured: the next digest reads them
        last = next((mark[0] for mark in reversed(marks) if mark[0] is not None), None)
        if last is not None and not clock.ready(last):
            if not (final or len(marks) >= DIGEST_EVERY):
                return
            clock.wait(last)
        bucket, steps = [0.0] * len(PHASES), 0
        for number, (previous, mark) in enumerate(zip(marks, marks[1:]), start=self.first_mark + 1):
            end, pre_at, spans = mark
            if previous[0] is None or end is None:
                continue  # a step captured into a CUDA graph, or the one after it: no clock reading to time it by
            step = clock.seconds(previous[0], end)
            optimizer_s = clock.seconds(pre_at, end) if pre_at is not None else 0.0
            data_s, copy_s, backward_s = clock.totals(spans)
            record = (step, data_s, copy_s, backward_s, optimizer_s, max(0.0, step - data_s - copy_s - backward_s - optimizer_s))
            if number > self.warmup:  # the step ending at this mark is past the warm-up
                self.measured += 1
                self.totals = [total + value for total, value in zip(self.totals, record, strict=True)]
                if len(self.records) < RECORDS_KEPT:
                    self.records.append(record)
            bucket = [total + value for total, value in zip(bucket, record, strict=True)]
            steps += 1
        if self.whole_run and steps:
            self._write_timeline(marks[0][0], marks[-1][0], steps, bucket)
        self.first_mark += max(0, len(marks) - 1)
        self.marks = marks[-1:]

    def _write_timeline(self, start: float, end: float, steps: int, sums: list[float]) -> None:
        line = json.dumps({"t0": round(start + self.wall_offset, 6), "t1": round(end + self.wall_offset, 6), "steps": steps,
                           **{phase: round(value, 6) for phase, value in zip(PHASES, sums, strict=True)}}) + "\n"
        if self.write_error is not None:
            return  # the disk filled (or the folder went): the script goes on, its timeline ends there
        try:  # opened per line (a kill loses one interval at most), never through a link, never half a line
            append_whole(self.out / f"steps-{self.rank}-{os.getpid()}.jsonl", line, field="--out")
        except InputError as error:
            self.write_error = error.one_line()

    def _count_flops_around(self) -> None:
        """Enter the FLOP counter after the first warm-up step; leave it after the next one."""
        if self._flop_mode is not None:
            self._census.__exit__(None, None, None)
            self._flop_mode.__exit__(None, None, None)
            self.flops = float(self._flop_mode.get_total_flops())
            self.ops, self.bytes = self._census.ops, self._census.bytes
            self._flop_mode = None
        elif self.flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._flop_mode = FlopCounterMode(display=False)
            self._flop_mode.__enter__()
            self._census = StepCensus(self.matmul_dtypes)
            self._census.__enter__()

    def note_sync(self, what: str, caller: Any) -> None:
        """A host read of a tensor's value made by the script itself (calls from inside torch, such as a
        sampler's tolist(), are the library's business: one frame checked, the answer cached per line)."""
        if not self.measuring:
            return
        key = (what, caller.f_code.co_filename, caller.f_lineno)
        site = self._sites.get(key, "")
        if site == "":
            site = self._sites[key] = None if in_library(key[1]) else f"{what} at {short_path(key[1])}:{key[2]}"
        if site is not None:
            self.syncs[site] += 1
            if self._site_step.get(site) != self.step_count:  # the steps it reads in: an evaluation loop reads many times in one
                self._site_step[site] = self.step_count
                self.sync_steps[site] += 1

    # -- the report -----------------------------------------------------------------------
    def write(self) -> None:
        """The report; written once, and again at the end when the script caught the stop and ran on (what ended it then)."""
        ran_on = self.ran_on()
        if self.written and not ran_on:
            return
        self.written = True
        if ran_on and not self.stop_reason.startswith("the script caught"):
            ended = "" if self.stop_reason.startswith("stopped after") else f"; {self.stop_reason}"
            self.stop_reason = (f"the script caught gpufill's stop (a bare `except:` or `except BaseException:` around its step) and ran on to "
                                f"{self.step_count} optimizer steps; measured: {self.warmup} warm-up and {self.steps} steps{ended}")
        import torch

        try:
            self._digest(final=True)
        except Exception as error:  # noqa: BLE001 - a CUDA error that ended the script also ends its events: keep what was read
            self._give_up_timing(error)
        if self.trial is not None and not self.stop_sent:
            self.trial.finish()  # the script ended (or failed) inside the trial: its own thread count back
        self._note_cpu_used()
        report = {
            "pid": os.getpid(),
            "rank": self.rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "launched_as_rank": "RANK" in os.environ,
            "argv": sys.argv,
            "steps_seen": self.step_count,
            "warmup": self.warmup,
            "steps_wanted": self.steps,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "write_error": self.write_error,
            "records": [dict(zip(PHASES, record, strict=True)) for record in self.records],
            "measured_steps": self.measured,
            "timeline": self.clock.timeline,
            "totals": {phase: round(value, 6) for phase, value in zip(PHASES, self.totals, strict=True)},
            "started_at": self.started_at,
            "ended_at": time.time(),
            "settings": list(self.settings),
            "syncs": dict(self.syncs),
            "sync_steps": dict(self.sync_steps),
            "loaders": self.loaders,
            "backward_at": self.backward_at,
            "optimizers": list(self.optimizers.values()),
            "stepped_by": "backward (parameters updated by hand)" if self.by_hand else "optimizer",
            "batch_size": self.batch_size,
            "flops_per_step": self.flops,
            "ops_per_step": self.ops,
            "bytes_per_step": self.bytes,
            "matmul_dtypes": dict(self.matmul_dtypes),
            "devices": sorted(self.devices),
            "flags": {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
                      "cudnn_benchmark": torch.backends.cudnn.benchmark, "float32_matmul_precision": torch.get_float32_matmul_precision(),
                      "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")},
            "compiled": compiled(),
            "torch": torch.__version__,
            "threads": {"torch": self.trial.threads if self.trial is not None else torch.get_num_threads(), "usable_cores": usable_cpus(),
                        "logical_cpus": os.cpu_count(), "cpu_used": None if self.cpu_used is None else [round(v, 4) for v in self.cpu_used],
                        "window": None if self.cpu_window is None else [round(v, 3) for v in self.cpu_window], "affinity": affinity(),
                        "trial": None if self.trial is None else self.trial.to_dict(), "set_by_script": self.threads_set,
                        "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        }
        try:  # a new temporary file, renamed: never through a link; a full disk costs the report, never the script
            write_atomically(self.out / f"report-{report['rank']}-{os.getpid()}.json", json.dumps(report), field="--out")
        except InputError as error:
            print(f"gpufill: the instrumentation's report was not written: {error.one_line()}", file=sys.stderr)
