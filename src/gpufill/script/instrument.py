"""What gpufill runs inside a user's own process (`gpufill doctor|watch|bench -- COMMAND`), loaded
at interpreter start (`script/inject/sitecustomize.py`), with no edit to the script.

It watches the training through public hooks and a few wrapped entry points, feeding a
Recorder (recorder.py) that writes one JSON report per process (per rank under torchrun) to
GPUFILL_SCRIPT_OUT (a doctor's run on a GPU is timed on the GPU's own timeline: clocks.py).
What it watches:

- optimizer steps: torch's global step hooks (every optimizer, whatever the script builds);
- data wait: `next()` on any DataLoader iterator, and the DataLoader's settings and the line
  that built it;
- host-device copies: `Tensor.to` / `.cuda` from the host to a GPU;
- backward: `Tensor.backward`;
- host reads of device values (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`): each is a
  host-device sync on a GPU, counted per line of the script;
- one step under torch's FlopCounterMode and a dispatch mode that counts its operators, the
  bytes they move and the matmuls' dtypes (the precision actually in effect), plus the TF32 /
  cudnn.benchmark flags and compile.

Two ways to run, set by GPUFILL_SCRIPT_STEPS:
- N > 0 (doctor, bench): after the warm-up and N measured steps it writes the report and stops
  the process with SystemExit(0) (the script's own `finally` blocks run);
- 0 (watch): the whole run; every GPUFILL_SCRIPT_BUCKET_S seconds one line of summed step
  times is appended to `steps-RANK-PID.jsonl`, so a killed run keeps its timeline.
A script that crashes, ends first or is stopped by SIGTERM gets a partial report from an
atexit / excepthook / signal handler, with what stopped it.

GPUFILL_SCRIPT_SETTINGS (comma-separated: tf32, cudnn_benchmark) switches speed-ups on before
the script runs (`gpufill bench -- COMMAND` measures them); the flags in the report are the
ones in effect at the end, so a script that switches one off again is seen.
"""


from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufill.script.clocks import BACKWARD, COPY, DATA
from gpufill.script.lines import in_library, script_line, short_path
from gpufill.script.recorder import WHOLE_RUN, Recorder

__all__ = ["BUCKET_ENV", "OUT_ENV", "SETTINGS", "SETTINGS_ENV", "STEPS_ENV", "THREAD_TRIAL_ENV", "WARMUP_ENV", "WHOLE_RUN", "Installed", "install"]

OUT_ENV = "GPUFILL_SCRIPT_OUT"
STEPS_ENV = "GPUFILL_SCRIPT_STEPS"
WARMUP_ENV = "GPUFILL_SCRIPT_WARMUP"
SETTINGS_ENV = "GPUFILL_SCRIPT_SETTINGS"
BUCKET_ENV = "GPUFILL_SCRIPT_BUCKET_S"
THREAD_TRIAL_ENV = "GPUFILL_SCRIPT_THREAD_TRIAL"
"""1: after the measured steps of a CPU training, time it at fewer torch threads (thread_trial.py; a doctor's run)."""


@dataclass(slots=True)
class Installed:
    """The instrumentation in this process; `remove()` puts back everything it changed."""

    recorder: Recorder
    undo: list[Callable[[], None]] = field(default_factory=list)

    def remove(self) -> None:
        for step in reversed(self.undo):
            step()
        self.undo.clear()


def install(out: Path | None = None, *, steps: int | None = None, warmup: int | None = None, bucket_s: float | None = None) -> Installed | None:
    """Hook the training. At interpreter start (sitecustomize) everything comes from the environment and
    nothing happens without GPUFILL_SCRIPT_OUT; in-process callers (bench/doctor_overhead.py) pass it."""
    folder = out or (Path(os.environ[OUT_ENV]) if os.environ.get(OUT_ENV) else None)
    if folder is None:
        return None
    import torch
    import torch.utils.data
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    settings = tuple(filter(None, os.environ.get(SETTINGS_ENV, "").split(",")))
    _apply(settings, torch)
    recorder = Recorder(folder, steps=int(os.environ.get(STEPS_ENV, "20")) if steps is None else steps,
                         warmup=int(os.environ.get(WARMUP_ENV, "3")) if warmup is None else warmup,
                         bucket_s=float(os.environ.get(BUCKET_ENV, "1")) if bucket_s is None else bucket_s, settings=settings,
                         thread_trial=os.environ.get(THREAD_TRIAL_ENV) == "1")
    installed = Installed(recorder)
    installed.undo += [register_optimizer_step_pre_hook(recorder.pre_step).remove, register_optimizer_step_post_hook(recorder.post_step).remove]
    installed.undo += _wrap_optimizer_init(recorder, torch.optim.Optimizer)
    installed.undo += _wrap_loader(recorder, torch.utils.data)
    installed.undo += _wrap_tensor(recorder, torch)
    installed.undo += _wrap_exit(recorder)
    installed.undo += _wrap_set_num_threads(recorder, torch)
    return installed


def _restore(owner: Any, name: str) -> Callable[[], None]:
    """An undo step: put `owner.name` back as it is now."""
    original = getattr(owner, name)
    return lambda: setattr(owner, name, original)


SETTINGS = {
    "tf32": "TF32 for float32 matmuls and convolutions (torch.backends.cuda.matmul.allow_tf32 = True; cudnn.allow_tf32 = True)",
    "cudnn_benchmark": "cuDNN picks the fastest convolution/RNN algorithm per shape (torch.backends.cudnn.benchmark = True)",
}
"""What GPUFILL_SCRIPT_SETTINGS can switch on from outside the script (the allocator is an environment variable)."""


def _apply(settings: tuple[str, ...], torch: Any) -> None:
    for name in settings:
        if name == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        elif name == "cudnn_benchmark":
            torch.backends.cudnn.benchmark = True
        else:
            raise ValueError(f"unknown setting {name!r} (known: {', '.join(SETTINGS)})")


def _wrap_optimizer_init(recorder: Recorder, optimizer_class: Any) -> list[Callable[[], None]]:
    undo = [_restore(optimizer_class, "__init__")]
    original = optimizer_class.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        recorder.built_at.setdefault(self, script_line())  # a subclass's __init__ calls this one: its caller's line

    optimizer_class.__init__ = init
    return undo


def _wrap_set_num_threads(recorder: Recorder, torch: Any) -> list[Callable[[], None]]:
    """The script's own torch.set_num_threads(N) call: its line, so that a thread fix names where to make it. Only a call
    made by the script itself (its direct caller is not torch or gpufill: a thread trial's and fit's own calls are not)."""
    undo = [_restore(torch, "set_num_threads")]
    original = torch.set_num_threads

    def set_num_threads(threads: int) -> None:
        caller = sys._getframe(1).f_code.co_filename
        if recorder.threads_set is None and not in_library(caller):
            recorder.threads_set = {"at": f"{short_path(caller)}:{sys._getframe(1).f_lineno}", "to": int(threads)}
        original(threads)

    torch.set_num_threads = set_num_threads
    return undo


def _wrap_loader(recorder: Recorder, data: Any) -> list[Callable[[], None]]:
    iterator = data.dataloader._BaseDataLoaderIter
    undo = [_restore(data.DataLoader, "__init__"), _restore(iterator, "__next__")]
    loader_init = data.DataLoader.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        loader_init(self, *args, **kwargs)
        settings = {"at": script_line(), "batch_size": self.batch_size, "num_workers": self.num_workers, "pin_memory": self.pin_memory,
                    "prefetch_factor": self.prefetch_factor, "persistent_workers": self.persistent_workers}
        same = next((seen for seen in recorder.loaders if all(seen[k] == v for k, v in settings.items())), None)
        if same is None:
            recorder.loaders.append({**settings, "created": 1})
        else:  # one built per epoch at the same line
            same["created"] += 1
        if recorder.batch_size is None and self.batch_size is not None:
            recorder.batch_size = int(self.batch_size)

    data.DataLoader.__init__ = init
    next_batch = iterator.__next__

    def timed_next(self: Any) -> Any:
        start = recorder.now()
        try:
            return next_batch(self)
        finally:
            recorder.add(DATA, start)

    iterator.__next__ = timed_next
    return undo


def _wrap_tensor(recorder: Recorder, torch: Any) -> list[Callable[[], None]]:
    tensor = torch.Tensor
    # A build of torch without an accelerator makes no host-to-device copies: `.to` stays untouched (the
    # most called of these methods: dtype casts inside models go through it too).
    accelerated = bool(torch.version.cuda or torch.version.hip or torch.backends.mps.is_built())
    copies = ("to", "cuda") if accelerated else ()
    reads = ("item", "tolist", "cpu", "numpy")
    undo = [_restore(tensor, name) for name in ("backward", *copies, *reads)]
    backward = tensor.backward

    def timed_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if recorder.backward_at is None:
            recorder.backward_at = script_line()
        recorder.before_backward(self)
        start = recorder.now()
        try:
            done = backward(self, *args, **kwargs)
        finally:
            recorder.add(BACKWARD, start)
        recorder.after_backward()  # a backward that failed ends no step
        return done

    tensor.backward = timed_backward
    for name in copies:
        original = getattr(tensor, name)

        def timed_copy(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if not self.is_cpu:  # a cast of a device tensor (models call .to too): not a copy from the host
                return _original(self, *args, **kwargs)
            start = recorder.now()
            result = _original(self, *args, **kwargs)
            if not result.is_cpu:
                recorder.add(COPY, start)
            return result

        setattr(tensor, name, timed_copy)
    for name in reads:
        original = getattr(tensor, name)

        def noted(self: Any, *args: Any, _original: Any = original, _name: str = f"{name}()", **kwargs: Any) -> Any:
            recorder.note_sync(_name, sys._getframe(1))
            return _original(self, *args, **kwargs)

        setattr(tensor, name, noted)
    return undo


def _wrap_exit(recorder: Recorder) -> list[Callable[[], None]]:
    undo = [_restore(sys, "excepthook")]
    hook = sys.excepthook

    def excepthook(kind: Any, error: BaseException, trace: Any) -> None:
        frames = traceback.extract_tb(trace)
        where = next((f"{short_path(f.filename)}:{f.lineno}" for f in reversed(frames) if not in_library(f.filename)), "")
        recorder.error = f"{kind.__name__}: {error}" + (f" at {where}" if where else "")
        recorder.stop_reason = f"the script raised {kind.__name__} after {recorder.step_count} steps"
        recorder.write()
        hook(kind, error, trace)

    sys.excepthook = excepthook

    def at_exit() -> None:
        if not recorder.written or (recorder.ran_on() and not recorder.stop_reason.startswith("the script caught")):  # it caught the stop: its end ended it
            wanted = "" if recorder.whole_run else f" (wanted {recorder.warmup} warm-up + {recorder.steps})"
            recorder.stop_reason = "it ran to its end" if recorder.ran_on() else f"the script ended after {recorder.step_count} optimizer steps{wanted}"
            if recorder.trial is not None and not recorder.ran_on():
                recorder.stop_reason = (f"the script ended during the thread trial, at step {recorder.step_count} (after {recorder.warmup} "
                                        f"warm-up and {recorder.steps} measured steps)")
            recorder.write()

    atexit.register(at_exit)
    undo.append(lambda: atexit.unregister(at_exit))
    # SIGTERM (Slurm's time limit, a scheduler, `gpufill watch` passing one on) ends Python without
    # atexit: write the report, then die of the signal as the script would have. A script that
    # installs its own handler later replaces this one.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and threading.current_thread() is threading.main_thread():
        def on_term(number: int, frame: Any) -> None:
            recorder.stop_reason = f"the script was stopped by SIGTERM after {recorder.step_count} optimizer steps"
            recorder.write()
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)

        signal.signal(signal.SIGTERM, on_term)
        undo.append(lambda: signal.getsignal(signal.SIGTERM) is on_term and signal.signal(signal.SIGTERM, signal.SIG_DFL))
    return undo
