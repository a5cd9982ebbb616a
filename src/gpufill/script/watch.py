"""`gpufill watch [--out DIR] -- COMMAND`: record a user's whole run, unchanged.

The command runs to its end with the instrumentation (launch.py) and the campaign sampler
beside it. DIR then holds, as the run goes (a killed watch keeps what was written):

- `samples.jsonl`: the sampler's rows (per GPU: utilisation, memory, power, temperature,
  SM clock, throttle reasons; the host's CPU and RAM; the command's processes' RSS);
- `steps-RANK-PID.jsonl`: each training process's step timeline (summed step, data-wait,
  copy, backward and optimizer seconds per interval);
- `report-RANK-PID.json`: what each process saw (optimizers, loaders, syncs, FLOPs, flags);

and afterwards `watch.json` (the summary, verdict and alerts) and `report.html`. The
command's output and exit code pass through. A folder that already holds a watch's files (a
finished watch, or one that was killed) is refused: two runs' samples never mix. A whole run has
no deadline unless one is given (`--timeout`); SIGTERM passed on and ignored ends it by SIGKILL
(supervise.py).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufill.doctor.bottleneck import INPUT_SHARE
from gpufill.errors import InputError
from gpufill.files import check_target, make_folder, write_atomically
from gpufill.monitor.alerts import Alert, all_alerts, input_wait
from gpufill.script.diagnose import WARMUP_STEPS, ScriptDiagnosis, analyse
from gpufill.script.instrument import WHOLE_RUN
from gpufill.script.launch import SAMPLES_FILE, ScriptRun, check_command, forwarding_signals, run_instrumented
from gpufill.script.supervise import GRACE_S, check_timeout

SAMPLE_EVERY_S = 1.0
"""The sampler's interval: a day-long run is ~86,000 rows per source, a minute-long one still 60."""
BUCKET_S = 1.0
"""The step timeline's interval: steps are summed per second, not written one by one."""
SUMMARY_FILE = "watch.json"
REPORT_FILE = "report.html"
SLURM_FIELDS = {"job_id": "SLURM_JOB_ID", "array_job_id": "SLURM_ARRAY_JOB_ID", "array_task_id": "SLURM_ARRAY_TASK_ID",
                "job_name": "SLURM_JOB_NAME", "task": "SLURM_PROCID", "tasks": "SLURM_NTASKS", "node": "SLURMD_NODENAME"}


@dataclass(slots=True)
class WatchOutcome:
    folder: Path
    run: ScriptRun
    diagnosis: ScriptDiagnosis
    alerts: list[Alert] = field(default_factory=list)
    slurm: dict[str, str] = field(default_factory=dict)
    host: str = ""

    def to_dict(self) -> dict[str, Any]:
        record = self.diagnosis.to_dict()
        report = self.run.report or {}
        timings = self.diagnosis.timings
        batch = report.get("batch_size")
        record.update({
            "folder": str(self.folder),
            "host": self.host,
            "slurm": self.slurm,
            "exit_code": self.run.exit_code,
            "started_at": self.run.started_at,
            "ended_at": self.run.ended_at,
            "duration_s": round(self.run.ended_at - self.run.started_at, 3),
            "optimizer_steps": report.get("steps_seen", 0),
            "measured_steps": report.get("measured_steps", 0),
            "samples_per_s": round(batch / timings.step_s, 2) if timings is not None and batch and timings.step_s > 0 else None,
            "alerts": [{"kind": a.kind, "source": a.source, "at_s": round(a.ts - self.run.started_at, 1), "duration_s": round(a.duration_s, 1),
                        "message": a.message} for a in self.alerts],
        })
        return record


def slurm_job(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The Slurm job this runs in (empty outside Slurm)."""
    return {name: environ[variable] for name, variable in SLURM_FIELDS.items() if environ.get(variable)}


def default_folder(slurm: dict[str, str], now: float | None = None) -> Path:
    """gpufill-watch-JOBID[-taskN] inside a Slurm job (one per srun task), else gpufill-watch-DATE-TIME."""
    if "job_id" in slurm:
        job = f"{slurm['array_job_id']}_{slurm['array_task_id']}" if "array_task_id" in slurm else slurm["job_id"]
        task = f"-task{slurm['task']}" if int(slurm.get("tasks", "1")) > 1 else ""
        return Path(f"gpufill-watch-{job}{task}")
    return Path(time.strftime("gpufill-watch-%Y%m%d-%H%M%S", time.localtime(now)))


WATCH_FILES = (SUMMARY_FILE, REPORT_FILE, SAMPLES_FILE, "steps-*.jsonl", "report-*.json")
"""What a watch writes into its folder (launch.py, script/recorder.py and here)."""


def refuse_earlier_watch(folder: Path) -> None:
    """One line when `folder` holds a watch's files: a finished watch's, or a killed one's (no watch.json), whose
    samples and step timelines this run would append to."""
    if not folder.is_dir():
        return
    found = sorted({path.name for pattern in WATCH_FILES for path in folder.glob(pattern)})
    if not found:
        return
    shown = ", ".join(found[:4]) + (f", ... ({len(found)} files)" if len(found) > 4 else "")
    what = f"a watched run ({SUMMARY_FILE})" if SUMMARY_FILE in found else f"the files of a watch that did not finish ({shown})"
    raise InputError(f"{folder} already holds {what}: this run's samples would mix with them", where=str(folder), field="--out",
                     fix="give --out a new folder (or delete that one)")


def watch(command: list[str], out: Path | None = None, *, sample_every_s: float = SAMPLE_EVERY_S, timeout_s: float | None = None,
          grace_s: float = GRACE_S) -> WatchOutcome:
    """Run `command` to its end (or its deadline, `timeout_s`; SIGKILL `grace_s` after SIGTERM), recorded; write watch.json
    and report.html into the folder."""
    check_command(command, "watch")
    check_timeout(timeout_s, grace_s)
    if not sample_every_s > 0:
        raise InputError(f"--interval {sample_every_s} is not a positive number of seconds", where="command line", field="--interval", fix="e.g. --interval 1")
    slurm = slurm_job()
    folder = out if out is not None else default_folder(slurm)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder} is a file", where=str(folder), field="--out", fix="give --out a folder")
    refuse_earlier_watch(folder)
    make_folder(folder, field="--out")  # a read-only or full disk, or a link where a file goes: one line before the command runs
    for name in (SAMPLES_FILE, SUMMARY_FILE, REPORT_FILE):
        check_target(folder / name, field="--out")
    # From before the command starts until the report is written, SIGTERM/SIGHUP go to the command (held while it
    # starts) or, once it has ended, wait: a second signal cannot lose what the first one's run left.
    with forwarding_signals() as signals:
        run = run_instrumented(command, folder, steps=WHOLE_RUN, warmup=WARMUP_STEPS, sample_every_s=sample_every_s, bucket_s=BUCKET_S,
                               signals=signals, timeout_s=timeout_s, grace_s=grace_s)
        alerts = sorted([*all_alerts(run.samples, work="the command ran"), *input_wait(run.timeline, share=INPUT_SHARE)], key=lambda a: a.ts)
        outcome = WatchOutcome(folder=folder, run=run, diagnosis=analyse(run, statistic="mean"), alerts=alerts, slurm=slurm, host=socket.gethostname())
        record = outcome.to_dict()
        try:  # a full disk costs the record, never the command's exit code: the caller passes it through
            write_atomically(folder / SUMMARY_FILE, json.dumps(record, indent=1), field="--out")
            from gpufill.script.watch_report import (
                write_watch_report,  # pandas and matplotlib: only once the run is over
            )

            write_watch_report(folder / REPORT_FILE, record, run.samples, run.timeline)
        except InputError as error:
            run.write_errors.append(f"the record was not written: {error.one_line()}")
    return outcome
