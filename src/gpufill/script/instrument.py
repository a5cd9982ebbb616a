"""What gpufill runs inside a user's own process (`gpufill doctor|watch|bench -- COMMAND`), loaded
at interpreter start (`script/inject/sitecustomize.py`), with no edit to the script.

It watches the training through public hooks and a few wrapped entry points, and writes one
JSON report per process (per rank under torchrun) to GPUFILL_SCRIPT_OUT:

- optimizer steps: torch's global step hooks (every optimizer, whatever the script builds);
- data wait: `next()` on any DataLoader iterator, and the DataLoader's settings and the line
  that built it;
- host-device copies: `Tensor.to` / `.cuda` from the host to a GPU;
- backward: `Tensor.backward`;
- host reads of device values (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`): each is a
  host-device sync on a GPU, counted per line of the script;
- one step under torch's FlopCounterMode and a dispatch mode that records the matmuls' dtypes
  (the precision actually in effect), plus the TF32 / cudnn.benchmark flags and compile.

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
import json
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT_ENV = "GPUFILL_SCRIPT_OUT"
STEPS_ENV = "GPUFILL_SCRIPT_STEPS"
WARMUP_ENV = "GPUFILL_SCRIPT_WARMUP"
SETTINGS_ENV = "GPUFILL_SCRIPT_SETTINGS"
BUCKET_ENV = "GPUFILL_SCRIPT_BUCKET_S"
WHOLE_RUN = 0
"""GPUFILL_SCRIPT_STEPS for a watch: never stop the script."""
STOPPED_EXIT = 0
DIGEST_EVERY = 4096
"""Marks digested at the latest after this many steps (very fast steps within one timeline interval)."""
RECORDS_KEPT = 10_000
"""Per-step records kept for medians (a doctor's few dozen; a day-long watch keeps totals and its timeline)."""
PHASES = ("step_s", "data_s", "copy_s", "backward_s", "optimizer_s", "forward_s")

_clock = time.perf_counter
_HERE = str(Path(__file__).resolve().parent.parent)  # the gpufill package: its frames are not "the script's line"


class _Recorder:
    """The hooks' shared state. The hot path (every optimizer step) only appends one tuple of clock
    readings, (end, optimizer start, data wait, copy, backward); `_digest` turns them into per-step
    phases, (step, data, copy, backward, optimizer, forward) seconds in PHASES order, once per
    timeline interval (a whole run) or at the end (a doctor's N steps)."""

    def __init__(self, out: Path, steps: int, warmup: int, bucket_s: float = 1.0, settings: tuple[str, ...] = ()):
        self.out, self.steps, self.warmup, self.bucket_s, self.settings = out, steps, warmup, bucket_s, settings
        self.whole_run = steps == WHOLE_RUN
        self.stop_at = -1 if self.whole_run else warmup + steps
        self.flop_step = max(1, warmup - 1)  # FLOPs counted on the next step: the last warm-up step (compiled, autotuned)
        self.rank = int(os.environ.get("RANK", "0"))
        self.step_count = 0
        self.measuring = warmup == 0
        self.pre_at: float | None = None
        self.data_s = self.copy_s = self.backward_s = 0.0
        self.marks: list[tuple[float, float | None, float, float, float]] = []
        self.first_mark = 1
        """The step number (1-based) whose end is marks[0]: after a digest the last mark stays, the next step starts at it."""
        self.next_digest = time.perf_counter() + bucket_s
        self.wall_offset = time.time() - time.perf_counter()
        self.records: list[tuple[float, ...]] = []
        self.totals = [0.0] * len(PHASES)
        self.measured = 0
        self.syncs: Counter[str] = Counter()
        self._sites: dict[tuple[str, str, int], str | None] = {}
        self.loaders: list[dict[str, Any]] = []
        self.optimizers: dict[int, dict[str, Any]] = {}
        self.built_at: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        """The script's line that built each optimizer (for `fused=True` there)."""
        self.backward_at: str | None = None
        self.batch_size: int | None = None
        self.flops: float | None = None
        self.matmul_dtypes: Counter[str] = Counter()
        self.devices: set[str] = set()
        self.written = False
        self.started_at = time.time()
        self.stop_reason = "the script ended before the measured steps"
        self.error: str | None = None
        self._flop_mode: Any = None
        self._dtype_mode: Any = None

    # -- the hot path -----------------------------------------------------------------------
    def pre_step(self, optimizer: Any, *_: Any) -> None:
        self.pre_at = _clock()
        if id(optimizer) not in self.optimizers:
            self._first_seen(optimizer)

    def post_step(self, optimizer: Any, *_: Any) -> None:
        now = _clock()
        self.marks.append((now, self.pre_at, self.data_s, self.copy_s, self.backward_s))
        self.data_s = self.copy_s = self.backward_s = 0.0
        self.step_count += 1
        self.measuring = self.step_count >= self.warmup  # for the syncs: a doctor's run stops at stop_at
        if self._flop_mode is not None or self.step_count == self.flop_step:
            self._count_flops_around()
        if now >= self.next_digest or len(self.marks) >= DIGEST_EVERY:
            self._digest()
        if self.step_count == self.stop_at:
            self.stop_reason = f"stopped after {self.warmup} warm-up and {self.steps} measured steps"
            self.write()
            raise SystemExit(STOPPED_EXIT)

    # -- off the hot path -------------------------------------------------------------------
    def _first_seen(self, optimizer: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.optimizers[id(optimizer)] = {"class": type(optimizer).__name__, "parameters": int(sum(p.numel() for p in params)),
                                          "tensors": len(params), "lr": optimizer.param_groups[0].get("lr"),
                                          "foreach": optimizer.defaults.get("foreach"), "fused": optimizer.defaults.get("fused"),
                                          "at": self.built_at.get(optimizer)}
        self.devices.update(str(p.device) for p in params)

    def _digest(self) -> None:
        """Per-step phases of the marks so far; a whole run writes them as one line of its timeline."""
        marks = self.marks
        bucket, steps = [0.0] * len(PHASES), 0
        for number, (previous, mark) in enumerate(zip(marks, marks[1:]), start=self.first_mark + 1):
            end, pre_at, data_s, copy_s, backward_s = mark
            step = end - previous[0]
            optimizer_s = end - pre_at if pre_at is not None else 0.0
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
        self.next_digest = _clock() + self.bucket_s

    def _write_timeline(self, start: float, end: float, steps: int, sums: list[float]) -> None:
        line = json.dumps({"t0": round(start + self.wall_offset, 6), "t1": round(end + self.wall_offset, 6), "steps": steps,
                           **{phase: round(value, 6) for phase, value in zip(PHASES, sums, strict=True)}}) + "\n"
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / f"steps-{self.rank}-{os.getpid()}.jsonl", "a") as timeline:  # open per line: a kill loses one interval at most
            timeline.write(line)

    def _count_flops_around(self) -> None:
        """Enter the FLOP counter after the first warm-up step; leave it after the next one."""
        if self._flop_mode is not None:
            self._dtype_mode.__exit__(None, None, None)
            self._flop_mode.__exit__(None, None, None)
            self.flops = float(self._flop_mode.get_total_flops())
            self._flop_mode = None
        elif self.flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._flop_mode = FlopCounterMode(display=False)
            self._flop_mode.__enter__()
            self._dtype_mode = _MatmulDtypes(self.matmul_dtypes)
            self._dtype_mode.__enter__()

    def note_sync(self, what: str, caller: Any) -> None:
        """A host read of a tensor's value made by the script itself (calls from inside torch, such as a
        sampler's tolist(), are the library's business: one frame checked, the answer cached per line)."""
        if not self.measuring:
            return
        key = (what, caller.f_code.co_filename, caller.f_lineno)
        site = self._sites.get(key, "")
        if site == "":
            site = self._sites[key] = None if _in_library(key[1]) else f"{what} at {_short(key[1])}:{key[2]}"
        if site is not None:
            self.syncs[site] += 1

    # -- the report -----------------------------------------------------------------------
    def write(self) -> None:
        if self.written:
            return
        self.written = True
        import torch

        self._digest()
        report = {
            "pid": os.getpid(),
            "rank": self.rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "argv": sys.argv,
            "steps_seen": self.step_count,
            "warmup": self.warmup,
            "steps_wanted": self.steps,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "records": [dict(zip(PHASES, record, strict=True)) for record in self.records],
            "measured_steps": self.measured,
            "totals": {phase: round(value, 6) for phase, value in zip(PHASES, self.totals, strict=True)},
            "started_at": self.started_at,
            "ended_at": time.time(),
            "settings": list(self.settings),
            "syncs": dict(self.syncs),
            "loaders": self.loaders,
            "backward_at": self.backward_at,
            "optimizers": list(self.optimizers.values()),
            "batch_size": self.batch_size,
            "flops_per_step": self.flops,
            "matmul_dtypes": dict(self.matmul_dtypes),
            "devices": sorted(self.devices),
            "flags": {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
                      "cudnn_benchmark": torch.backends.cudnn.benchmark, "float32_matmul_precision": torch.get_float32_matmul_precision(),
                      "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")},
            "compiled": _compiled(),
            "torch": torch.__version__,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"report-{report['rank']}-{os.getpid()}.json"
        path.with_suffix(".tmp").write_text(json.dumps(report))
        os.replace(path.with_suffix(".tmp"), path)


class _MatmulDtypes:
    """Counts the dtypes of matmul-like operators (what autocast actually ran)."""

    _NAMES = ("mm", "addmm", "bmm", "baddbmm", "matmul", "convolution", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")

    def __init__(self, counts: Counter[str]):
        from torch.utils._python_dispatch import TorchDispatchMode

        names = self._NAMES

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                if func.overloadpacket.__name__ in names and args and hasattr(args[0], "dtype"):
                    counts[str(args[0].dtype).replace("torch.", "")] += 1
                return func(*args, **(kwargs or {}))

        self._mode = Mode()

    def __enter__(self) -> _MatmulDtypes:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


def _compiled() -> bool:
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.counters["stats"].get("unique_graphs", 0))
    except Exception:  # noqa: BLE001 - private counters moved: say "not seen"
        return False


def _in_library(filename: str) -> bool:
    return filename.startswith(_HERE) or "/torch/" in filename or filename.startswith("<")


_SHORT: dict[str, str] = {}


def _short(filename: str) -> str:
    """The file as the user would write it (relative to the working directory when inside it); cached."""
    if filename not in _SHORT:
        relative = os.path.relpath(filename)
        _SHORT[filename] = filename if relative.startswith("..") else relative
    return _SHORT[filename]


def _script_line() -> str:
    """file:line of the innermost frame outside torch and gpufill: the user's line."""
    frame = sys._getframe(2)
    while frame is not None:
        if not _in_library(frame.f_code.co_filename):
            return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown"


@dataclass(slots=True)
class Installed:
    """The instrumentation in this process; `remove()` puts back everything it changed."""

    recorder: _Recorder
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
    recorder = _Recorder(folder, steps=int(os.environ.get(STEPS_ENV, "20")) if steps is None else steps,
                         warmup=int(os.environ.get(WARMUP_ENV, "3")) if warmup is None else warmup,
                         bucket_s=float(os.environ.get(BUCKET_ENV, "1")) if bucket_s is None else bucket_s, settings=settings)
    installed = Installed(recorder)
    installed.undo += [register_optimizer_step_pre_hook(recorder.pre_step).remove, register_optimizer_step_post_hook(recorder.post_step).remove]
    installed.undo += _wrap_optimizer_init(recorder, torch.optim.Optimizer)
    installed.undo += _wrap_loader(recorder, torch.utils.data)
    installed.undo += _wrap_tensor(recorder, torch)
    installed.undo += _wrap_exit(recorder)
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


def _wrap_optimizer_init(recorder: _Recorder, optimizer_class: Any) -> list[Callable[[], None]]:
    undo = [_restore(optimizer_class, "__init__")]
    original = optimizer_class.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        recorder.built_at.setdefault(self, _script_line())  # a subclass's __init__ calls this one: its caller's line

    optimizer_class.__init__ = init
    return undo


def _wrap_loader(recorder: _Recorder, data: Any) -> list[Callable[[], None]]:
    iterator = data.dataloader._BaseDataLoaderIter
    undo = [_restore(data.DataLoader, "__init__"), _restore(iterator, "__next__")]
    loader_init = data.DataLoader.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        loader_init(self, *args, **kwargs)
        settings = {"at": _script_line(), "batch_size": self.batch_size, "num_workers": self.num_workers, "pin_memory": self.pin_memory,
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
        tick = time.perf_counter()
        try:
            return next_batch(self)
        finally:
            recorder.data_s += time.perf_counter() - tick

    iterator.__next__ = timed_next
    return undo


def _wrap_tensor(recorder: _Recorder, torch: Any) -> list[Callable[[], None]]:
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
            recorder.backward_at = _script_line()
        tick = time.perf_counter()
        try:
            return backward(self, *args, **kwargs)
        finally:
            recorder.backward_s += time.perf_counter() - tick

    tensor.backward = timed_backward
    for name in copies:
        original = getattr(tensor, name)

        def timed_copy(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            tick = time.perf_counter()
            result = _original(self, *args, **kwargs)
            if self.is_cpu and not result.is_cpu:
                recorder.copy_s += time.perf_counter() - tick
            return result

        setattr(tensor, name, timed_copy)
    for name in reads:
        original = getattr(tensor, name)

        def noted(self: Any, *args: Any, _original: Any = original, _name: str = f"{name}()", **kwargs: Any) -> Any:
            recorder.note_sync(_name, sys._getframe(1))
            return _original(self, *args, **kwargs)

        setattr(tensor, name, noted)
    return undo


def _wrap_exit(recorder: _Recorder) -> list[Callable[[], None]]:
    undo = [_restore(sys, "excepthook")]
    hook = sys.excepthook

    def excepthook(kind: Any, error: BaseException, trace: Any) -> None:
        frames = traceback.extract_tb(trace)
        where = next((f"{os.path.relpath(f.filename)}:{f.lineno}" for f in reversed(frames) if not f.filename.startswith(_HERE) and "/torch/" not in f.filename), "")
        recorder.error = f"{kind.__name__}: {error}" + (f" at {where}" if where else "")
        recorder.stop_reason = f"the script raised {kind.__name__} after {recorder.step_count} steps"
        recorder.write()
        hook(kind, error, trace)

    sys.excepthook = excepthook

    def at_exit() -> None:
        if not recorder.written:
            wanted = "" if recorder.whole_run else f" (wanted {recorder.warmup} warm-up + {recorder.steps})"
            recorder.stop_reason = f"the script ended after {recorder.step_count} optimizer steps{wanted}"
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
