"""Run a user's command with gpufill's instrumentation loaded in its Python processes, and the
campaign sampler (NVML + psutil) beside it.

`inject/` goes first on PYTHONPATH of the command's environment only (the caller's own
environment and files are not touched), so `instrument.py` is installed at interpreter start
in every Python process the command starts (each rank under torchrun). Each process writes a
JSON report (and, for a whole run, its step timeline) into the run's folder; this module
reads them back with the sampler's rows. The command's output and exit code pass through.
It runs in a process group of its own (supervise.py: its deadline, and how it is ended):
SIGTERM and SIGHUP sent to gpufill are passed on to the command, Ctrl-C (SIGINT) to its whole
group as the terminal would; its stdin is not the terminal (a read from it gets end-of-file
instead of stopping a process outside the terminal's foreground group).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

import gpufill
from gpufill.errors import InputError
from gpufill.files import make_folder
from gpufill.monitor.sampler import JsonlSink, Sampler
from gpufill.script.instrument import BUCKET_ENV, OUT_ENV, SETTINGS, SETTINGS_ENV, STEPS_ENV, WARMUP_ENV, WHOLE_RUN
from gpufill.script.supervise import AFTER_STOP_S, GRACE_S, Supervisor

INJECT_DIR = Path(__file__).resolve().parent / "inject"
SAMPLES_FILE = "samples.jsonl"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@dataclass(slots=True)
class ScriptRun:
    """What one instrumented run of a command left: its exit code, each training process's report,
    rank 0's step timeline (a whole run) and the sampler's rows."""

    command: list[str]
    exit_code: int
    """The command's own; 128 + N when a signal N ended it (as a shell reports it)."""
    started_at: float
    ended_at: float
    reports: list[dict[str, Any]] = field(default_factory=list)
    """One per process that trained (an optimizer, a DataLoader or an error seen), rank order."""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    write_errors: list[str] = field(default_factory=list)
    """What could not be written while it ran (a full disk): the recording stopped there, the command went on."""
    ending: str = ""
    """How gpufill ended the command, in one line (a deadline, an ignored SIGTERM); empty when it ended by itself."""
    left_running: list[dict[str, Any]] = field(default_factory=list)
    """{"pid", "command"} of each process the command started that still runs after it (a daemon)."""

    @property
    def report(self) -> dict[str, Any] | None:
        return self.reports[0] if self.reports else None

    @property
    def stopped_by_gpufill(self) -> bool:
        return self.report is not None and self.report["stop_reason"].startswith("stopped after")


def check_command(command: list[str], tool: str) -> None:
    """One line (exit 2) for a missing or unknown command, a directory or a file without the execute bit,
    before anything runs."""
    if not command:
        raise InputError("no command to run", field="COMMAND", fix=f"gpufill {tool} -- python train.py [its arguments]")
    name = command[0]
    if shutil.which(name) is not None:
        return
    path = Path(name)
    as_python = f"gpufill {tool} -- python {name}"
    if os.sep not in name or not path.exists():  # a bare name is looked up on PATH only, as a shell does
        fix = f"run it as ./{name}, or {as_python}" if path.is_file() else "give the command as you run it, e.g. python train.py"
        raise InputError(f"{name!r} is not a command here", where=name, field="COMMAND", fix=fix)
    if path.is_dir():
        raise InputError("is a directory, not a command", where=name, field="COMMAND", fix=f"name the script in it: gpufill {tool} -- python {name.rstrip(os.sep)}/train.py")
    raise InputError("not executable (no execute permission)", where=name, field="COMMAND", fix=f"chmod +x {name}, or {as_python}")


def instrumented_environment(folder: Path, steps: int, *, warmup: int = 3, settings: tuple[str, ...] = (), bucket_s: float = 1.0,
                             extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus what loads the instrumentation in the command's Python processes."""
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown settings {unknown} (known: {', '.join(SETTINGS)})")
    package_root = str(Path(gpufill.__file__).resolve().parent.parent)  # gpufill importable in the child, however it was installed
    path = [str(INJECT_DIR), package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, **(extra or {}), "PYTHONPATH": os.pathsep.join(path), OUT_ENV: str(folder), STEPS_ENV: str(steps),
            WARMUP_ENV: str(warmup), SETTINGS_ENV: ",".join(settings), BUCKET_ENV: str(bucket_s)}


def run_instrumented(command: list[str], folder: Path, *, steps: int = WHOLE_RUN, warmup: int = 3, settings: tuple[str, ...] = (),
                     extra_env: dict[str, str] | None = None, sample_every_s: float = 1.0, bucket_s: float = 1.0,
                     stdout: IO[str] | int | None = None, signals: SignalForwarder | None = None, timeout_s: float | None = None,
                     grace_s: float = GRACE_S, after_stop_s: float = AFTER_STOP_S) -> ScriptRun:
    """Run `command` to its end (steps=0) or for `warmup` + `steps` optimizer steps; files go to `folder`.
    `signals`: a caller's forwarder that stays installed after the command ends (watch, until its report is written).
    `timeout_s`: the command's deadline (None: none); `grace_s`, `after_stop_s`: see supervise.py."""
    make_folder(folder, field="--out")
    env = instrumented_environment(folder, steps, warmup=warmup, settings=settings, bucket_s=bucket_s, extra=extra_env)
    with contextlib.ExitStack() as stack:
        forwarder = signals if signals is not None else stack.enter_context(forwarding_signals())
        started = time.time()
        process = _start(command, env, stdout)
        forwarder.attach(process)  # a signal that came while it started is passed on now
        sink = JsonlSink(folder / SAMPLES_FILE)
        measured = None if steps == WHOLE_RUN else lambda: any(r["stop_reason"].startswith("stopped after") for r in _training_reports(folder, []))
        supervisor = Supervisor(process, marker=(OUT_ENV, env[OUT_ENV]), deadline_s=timeout_s, grace_s=grace_s, after_stop_s=after_stop_s,
                                measured=measured, passed_on=lambda: forwarder.passed_on)
        with Sampler(interval=sample_every_s, gpu_source="auto", pids=lambda: _tree(process.pid), sink=sink):
            code = supervisor.wait()
    run = ScriptRun(command=command, exit_code=128 - code if code < 0 else code, started_at=started, ended_at=time.time(),
                    ending=supervisor.ending.how, left_running=supervisor.ending.left_running)
    if sink.error is not None:
        run.write_errors.append(f"the GPU and host samples stopped: {sink.error}")
    run.reports = _training_reports(folder, run.write_errors)
    run.timeline = _timeline(folder, run.report, run.write_errors)
    run.samples = read_samples(folder / SAMPLES_FILE, run.write_errors)
    return run


def _start(command: list[str], env: dict[str, str], stdout: IO[str] | int | None) -> subprocess.Popen[Any]:
    """The command as the leader of a process group of its own (what lets gpufill end all of it)."""
    try:
        return subprocess.Popen(command, env=env, stdout=stdout, process_group=0, stdin=subprocess.DEVNULL if _is_terminal(sys.stdin) else None)
    except OSError as error:  # what check_command cannot see: a bad #! line, a binary for another machine
        raise InputError(f"could not be started: {error.strerror or error}", where=command[0], field="COMMAND",
                         fix=f"check that {command[0]} runs on its own, or run a script as: python SCRIPT") from None


def _is_terminal(stream: Any) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, AttributeError):  # closed, or replaced by an object without isatty
        return False


def read_samples(path: Path, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file. A line that is not a JSON object (torn by a full disk or a kill while it was
    written) is left out, and said in one line in `problems`: the rest of the record is kept."""
    if not path.exists():
        return []
    rows, torn = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            torn.append(number)
    if torn and problems is not None:
        shown = ", ".join(map(str, torn[:5])) + (", ..." if len(torn) > 5 else "")
        problems.append(f"{path.name}: {len(torn)} line(s) not whole JSON (torn by a full disk or a kill) left out: line {shown}")
    return rows


def _training_reports(folder: Path, problems: list[str]) -> list[dict[str, Any]]:
    reports = []
    for path in sorted(folder.glob("report-*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except ValueError:
            report = None
        if isinstance(report, dict) and "rank" in report and "stop_reason" in report:
            reports.append(report)
        else:
            problems.append(f"{path.name}: not a whole report (torn by a full disk or a kill): left out")
    # A launcher (torchrun) is a Python process too, and one whose rank failed raises an error of its own: where
    # a launcher set RANK for its children, only those count; else only processes that trained (or failed) do.
    ranks = [r for r in reports if r.get("launched_as_rank")] or reports
    trained = [r for r in ranks if r["optimizers"] or r["loaders"] or r["error"]] or ranks
    return sorted(trained, key=lambda r: (r["rank"], -r["steps_seen"]))


def _timeline(folder: Path, report: dict[str, Any] | None, problems: list[str]) -> list[dict[str, Any]]:
    if report is None:
        return []
    path = folder / f"steps-{report['rank']}-{report['pid']}.jsonl"
    return read_samples(path, problems)


def _tree(pid: int) -> list[int]:
    """The command's process and its children (DataLoader workers, torchrun's ranks): their RSS is sampled."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return []


class SignalForwarder:
    """SIGTERM/SIGHUP sent to gpufill go on to the command while it runs (its report is written; gpufill then
    writes its own), SIGINT to its whole process group (as Ctrl-C from the terminal would). One that comes
    before the command exists is held and passed on as soon as it does; one that comes after it ended is
    noted, not obeyed: gpufill is writing what the command left, which a second signal must not lose."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[Any] | None = None
        self.held: list[int] = []
        self.after_end: list[int] = []
        self.passed_on: tuple[str, float] | None = None
        """The first SIGTERM/SIGHUP passed on and when (time.monotonic): the command is killed if it ignores it."""

    def __call__(self, number: int, _frame: Any) -> None:
        if self.process is None:
            self.held.append(number)
        elif self.process.poll() is None:
            self._pass_on(number)
        else:
            self.after_end.append(number)

    def attach(self, process: subprocess.Popen[Any]) -> None:
        self.process = process
        for number in self.held:
            if process.poll() is None:
                self._pass_on(number)

    def _pass_on(self, number: int) -> None:
        assert self.process is not None
        if number == signal.SIGINT:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, number)
            return
        self.process.send_signal(number)
        if self.passed_on is None:
            self.passed_on = (signal.Signals(number).name, time.monotonic())


@contextmanager
def forwarding_signals() -> Iterator[SignalForwarder]:
    """Install a SignalForwarder for SIGTERM, SIGHUP and SIGINT while the block runs."""
    forwarder = SignalForwarder()
    previous = {number: signal.signal(number, forwarder) for number in FORWARDED_SIGNALS}
    try:
        yield forwarder
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
