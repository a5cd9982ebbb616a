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
from collections import Counter
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
RECORDS_KEPT = 10_000
"""Per-step records kept for medians (a doctor's few dozen; a day-long watch keeps totals and its timeline)."""
PHASES = ("step_s", "data_s", "copy_s", "backward_s", "optimizer_s", "forward_s")

_HERE = str(Path(__file__).resolve().parent.parent)  # the gpufill package: its frames are not "the script's line"


class _Recorder:
    def __init__(self, out: Path, steps: int, warmup: int, bucket_s: float = 1.0, settings: tuple[str, ...] = ()):
        self.out, self.steps, self.warmup, self.bucket_s, self.settings = out, steps, warmup, bucket_s, settings
        self.rank = int(os.environ.get("RANK", "0"))
        self.step_count = 0
        self.last_post: float | None = None
        self.pre_at: float | None = None
        self.data_s = self.copy_s = self.backward_s = 0.0
        self.records: list[dict[str, float]] = []
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.measured = 0
        self.bucket: dict[str, float] = {}
        self.syncs: Counter[str] = Counter()
        self.loaders: list[dict[str, Any]] = []
        self.optimizers: dict[int, dict[str, Any]] = {}
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

    # -- measuring ------------------------------------------------------------------------
    @property
    def whole_run(self) -> bool:
        return self.steps == WHOLE_RUN

    @property
    def measuring(self) -> bool:
        return self.step_count >= self.warmup and (self.whole_run or self.step_count < self.warmup + self.steps)

    def pre_step(self, optimizer: Any, *_: Any) -> None:
        self.pre_at = time.perf_counter()
        if id(optimizer) not in self.optimizers:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self.optimizers[id(optimizer)] = {"class": type(optimizer).__name__, "parameters": int(sum(p.numel() for p in params)),
                                              "tensors": len(params), "lr": optimizer.param_groups[0].get("lr"),
                                              "foreach": optimizer.defaults.get("foreach"), "fused": optimizer.defaults.get("fused")}
            self.devices.update(str(p.device) for p in params)

    def post_step(self, optimizer: Any, *_: Any) -> None:
        now = time.perf_counter()
        if self.last_post is not None and self.pre_at is not None:
            step = now - self.last_post
            optimizer_s = now - self.pre_at
            record = {"step_s": step, "data_s": self.data_s, "copy_s": self.copy_s, "backward_s": self.backward_s, "optimizer_s": optimizer_s,
                      "forward_s": max(0.0, step - self.data_s - self.copy_s - self.backward_s - optimizer_s)}
            if self.measuring:
                self.measured += 1
                for phase in PHASES:
                    self.totals[phase] += record[phase]
                if len(self.records) < RECORDS_KEPT:
                    self.records.append(record)
            if self.whole_run:
                self._add_to_bucket(record)
        self._count_flops_around(self.step_count)
        self.step_count += 1
        self.data_s = self.copy_s = self.backward_s = 0.0
        self.last_post = time.perf_counter()
        if not self.whole_run and self.step_count >= self.warmup + self.steps:
            self.stop_reason = f"stopped after {self.warmup} warm-up and {self.steps} measured steps"
            self.write()
            raise SystemExit(STOPPED_EXIT)

    def _add_to_bucket(self, record: dict[str, float]) -> None:
        """Sum the step into the current time bucket; a full bucket is one line of the timeline file."""
        wall = time.time()
        if not self.bucket:
            self.bucket = {"t0": wall - record["step_s"], "steps": 0, **dict.fromkeys(PHASES, 0.0)}
        self.bucket["steps"] += 1
        for phase in PHASES:
            self.bucket[phase] += record[phase]
        self.bucket["t1"] = wall
        if wall - self.bucket["t0"] >= self.bucket_s:
            self._flush_bucket()

    def _flush_bucket(self) -> None:
        if not self.bucket:
            return
        line = json.dumps({k: round(v, 6) for k, v in self.bucket.items()}) + "\n"
        self.bucket = {}
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / f"steps-{self.rank}-{os.getpid()}.jsonl", "a") as timeline:  # open per line: a kill loses one bucket at most
            timeline.write(line)

    def _count_flops_around(self, finished_step: int) -> None:
        """Enter the FLOP counter after the first warm-up step; leave it after the next one."""
        if self._flop_mode is not None:
            self._dtype_mode.__exit__(None, None, None)
            self._flop_mode.__exit__(None, None, None)
            self.flops = float(self._flop_mode.get_total_flops())
            self._flop_mode = None
        elif finished_step == max(0, self.warmup - 2) and self.flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._flop_mode = FlopCounterMode(display=False)
            self._flop_mode.__enter__()
            self._dtype_mode = _MatmulDtypes(self.matmul_dtypes)
            self._dtype_mode.__enter__()

    def note_sync(self, what: str, caller: Any) -> None:
        """A host read of a tensor's value made by the script itself (calls from inside torch, such as a
        sampler's tolist(), are the library's business and cost nothing to look up: one frame checked)."""
        if self.measuring and not _in_library(caller.f_code.co_filename):
            self.syncs[f"{what} at {_short(caller.f_code.co_filename)}:{caller.f_lineno}"] += 1

    # -- the report -----------------------------------------------------------------------
    def write(self) -> None:
        if self.written:
            return
        self.written = True
        import torch

        self._flush_bucket()
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
            "records": self.records,
            "measured_steps": self.measured,
            "totals": {k: round(v, 6) for k, v in self.totals.items()},
            "started_at": self.started_at,
            "ended_at": time.time(),
            "settings": list(self.settings),
            "syncs": dict(self.syncs),
            "loaders": self.loaders,
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


def install() -> None:
    """Hook the training (called by sitecustomize when GPUFILL_SCRIPT_OUT is set)."""
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    import torch
    import torch.utils.data
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    settings = tuple(filter(None, os.environ.get(SETTINGS_ENV, "").split(",")))
    _apply(settings, torch)
    recorder = _Recorder(Path(out), steps=int(os.environ.get(STEPS_ENV, "20")), warmup=int(os.environ.get(WARMUP_ENV, "3")),
                         bucket_s=float(os.environ.get(BUCKET_ENV, "1")), settings=settings)
    register_optimizer_step_pre_hook(recorder.pre_step)
    register_optimizer_step_post_hook(recorder.post_step)
    _wrap_loader(recorder, torch.utils.data)
    _wrap_tensor(recorder, torch)
    _wrap_exit(recorder)


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


def _wrap_loader(recorder: _Recorder, data: Any) -> None:
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
    iterator = data.dataloader._BaseDataLoaderIter
    next_batch = iterator.__next__

    def timed_next(self: Any) -> Any:
        tick = time.perf_counter()
        try:
            return next_batch(self)
        finally:
            recorder.data_s += time.perf_counter() - tick

    iterator.__next__ = timed_next


def _wrap_tensor(recorder: _Recorder, torch: Any) -> None:
    tensor = torch.Tensor
    backward = tensor.backward

    def timed_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        tick = time.perf_counter()
        try:
            return backward(self, *args, **kwargs)
        finally:
            recorder.backward_s += time.perf_counter() - tick

    tensor.backward = timed_backward
    for name in ("to", "cuda"):
        original = getattr(tensor, name)

        def timed_copy(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            tick = time.perf_counter()
            result = _original(self, *args, **kwargs)
            if self.device.type == "cpu" and getattr(result, "device", self.device).type != "cpu":
                recorder.copy_s += time.perf_counter() - tick
            return result

        setattr(tensor, name, timed_copy)
    for name in ("item", "tolist", "cpu", "numpy"):
        original = getattr(tensor, name)

        def noted(self: Any, *args: Any, _original: Any = original, _name: str = f"{name}()", **kwargs: Any) -> Any:
            recorder.note_sync(_name, sys._getframe(1))
            return _original(self, *args, **kwargs)

        setattr(tensor, name, noted)


def _wrap_exit(recorder: _Recorder) -> None:
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
