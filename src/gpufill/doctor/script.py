"""`gpufill doctor -- COMMAND`: diagnose a user's own training script, unchanged.

The command runs with `doctor/inject` first on PYTHONPATH, so `instrument.py` is installed at
interpreter start in every Python process it starts (each rank under torchrun). Each process
writes a JSON report; this module reads rank 0's, turns its step records into the profiler's
PhaseTimings, and reuses the doctor's verdict (`bottleneck.classify`) against a speed test of
the same device. Findings name the script's own lines, ranked by expected gain.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpufill
from gpufill.doctor.bottleneck import PhaseTimings, Verdict, classify
from gpufill.doctor.instrument import OUT_ENV, STEPS_ENV, WARMUP_ENV
from gpufill.errors import InputError
from gpufill.monitor.sampler import QueueSink, Sampler

INJECT_DIR = Path(__file__).resolve().parent / "inject"
WARMUP_STEPS = 3
SAMPLE_EVERY_S = 0.25
"""NVML and psutil while the command runs: a short diagnosis still gets several samples."""


@dataclass(slots=True)
class Finding:
    """One thing to change, in the script's terms, with the expected gain (None: not estimable here)."""

    what: str
    gain: float | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "expected_gain": None if self.gain is None else round(self.gain, 2), "why": self.why}


@dataclass(slots=True)
class ScriptDiagnosis:
    command: list[str]
    exit_code: int
    stopped_by_doctor: bool
    report: dict[str, Any] | None
    ranks: int
    timings: PhaseTimings | None
    verdict: Verdict | None
    findings: list[Finding] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    """The run as the campaign sampler saw it (host CPU and memory; GPU utilisation, memory, power, clocks)."""

    def to_dict(self) -> dict[str, Any]:
        report = self.report or {}
        return {
            "command": self.command,
            "exit_code": self.exit_code,
            "stopped_by_doctor": self.stopped_by_doctor,
            "ranks": self.ranks,
            "training": describe(report),
            "shares": None if self.timings is None else {k: round(v, 4) for k, v in self.timings.shares.items()},
            "step_ms": None if self.timings is None else round(self.timings.step_s * 1e3, 4),
            "syncs": report.get("syncs", {}),
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "machine": self.machine,
            "not_measured": self.not_measured,
            "stop_reason": report.get("stop_reason"),
            "error": report.get("error"),
        }


def diagnose_script(command: list[str], *, steps: int, quiet_output: bool = False) -> ScriptDiagnosis:
    """Run `command` instrumented for WARMUP_STEPS + `steps` optimizer steps and diagnose it."""
    if not command:
        raise InputError("no command to diagnose", field="COMMAND", fix="gpufill doctor -- python train.py [its arguments]")
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        raise InputError(f"{command[0]!r} is not a command here", where=command[0], field="COMMAND", fix="give the command as you run it, e.g. python train.py")
    with tempfile.TemporaryDirectory(prefix="gpufill-doctor-") as folder:
        env = instrumented_environment(Path(folder), steps)
        # The script's own output goes to stderr under --json, so stdout stays one JSON object.
        samples = QueueSink()
        with Sampler(interval=SAMPLE_EVERY_S, gpu_source="auto", sink=samples):
            completed = subprocess.run(command, env=env, stdout=sys.stderr if quiet_output else None)
        reports = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("report-*.json"))]
    # A launcher (torchrun) is a Python process too: only processes that trained count as ranks.
    trained = [r for r in reports if r["optimizers"] or r["loaders"] or r["error"]] or reports
    trained.sort(key=lambda r: (r["rank"], -r["steps_seen"]))
    reports = trained
    report = reports[0] if reports else None
    stopped = report is not None and report["stop_reason"].startswith("stopped after")
    diagnosis = ScriptDiagnosis(command=command, exit_code=0 if stopped else completed.returncode, stopped_by_doctor=stopped, report=report,
                                ranks=len(reports), timings=None, verdict=None, machine=summarise(samples.drain()))
    if report is None:
        diagnosis.not_measured.append("everything: no Python process of the command loaded gpufill's instrumentation (not a Python command, "
                                      "or one that resets PYTHONPATH)")
        return diagnosis
    _analyse(diagnosis, report)
    return diagnosis


def instrumented_environment(folder: Path, steps: int) -> dict[str, str]:
    """This process's environment plus what loads the instrumentation in the command's Python processes."""
    package_root = str(Path(gpufill.__file__).resolve().parent.parent)  # gpufill importable in the child, however it was installed
    path = [str(INJECT_DIR), package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), OUT_ENV: str(folder), STEPS_ENV: str(steps), WARMUP_ENV: str(WARMUP_STEPS)}


def _analyse(diagnosis: ScriptDiagnosis, report: dict[str, Any]) -> None:
    records = report["records"]
    missing = diagnosis.not_measured
    if not report["optimizers"]:
        missing.append("step times: the script never called an optimizer's step()")
    elif not records:
        missing.append(f"step times: {report['stop_reason']} (the first {report['warmup']} steps are warm-up)")
    if report.get("error"):
        missing.append(f"the rest: {report['error']}")
    if not any(d.startswith("cuda") for d in report["devices"]):
        missing.append("GPU utilisation, memory and syncs: the training ran on " + (", ".join(report["devices"]) or "no device seen"))
    if report["flops_per_step"] is None:
        missing.append("FLOPs per step: fewer than two optimizer steps were seen")
    if records:
        diagnosis.timings = _timings(report)
        diagnosis.verdict = classify(diagnosis.timings, _yardstick(report))
    diagnosis.findings = _findings(report, diagnosis.timings, diagnosis.verdict)


def _timings(report: dict[str, Any]) -> PhaseTimings:
    records = report["records"]

    def median(key: str) -> float:
        return statistics.median(r[key] for r in records)

    compute = median("forward_s") + median("backward_s") + median("optimizer_s")
    syncs = sum(report["syncs"].values()) / len(records)
    return PhaseTimings(data_s=median("data_s"), copy_s=median("copy_s"), forward_s=median("forward_s"), backward_s=median("backward_s"),
                        optimizer_s=median("optimizer_s"), batch_size=report["batch_size"] or 0, steps=len(records), compute_b_s=compute,
                        compute_2b_s=None, flops_per_step=report["flops_per_step"], syncs_per_step=syncs)


def _yardstick(report: dict[str, Any]) -> Any:
    from gpufill.doctor.report import yardstick
    from gpufill.doctor.speedtest import run_speed_test
    from gpufill.engine.hardware import detect, free_memory_bytes

    device = next((d for d in report["devices"] if d.startswith("cuda")), "cpu")
    hardware = detect(device)
    return yardstick(hardware, run_speed_test(hardware), data_bytes=None, free_bytes=free_memory_bytes(hardware))


def _findings(report: dict[str, Any], timings: PhaseTimings | None, verdict: Verdict | None) -> list[Finding]:
    findings: list[Finding] = []
    on_gpu = any(d.startswith("cuda") for d in report["devices"])
    if verdict is not None and verdict.kind == "input-bound" and timings is not None:
        share = timings.input_share
        gain = 1.0 / max(1.0 - share, 1e-9)
        for loader in report["loaders"]:
            workers = max(1, (os.cpu_count() or 2) - 1)
            settings = f"num_workers={loader['num_workers']}, pin_memory={loader['pin_memory']}"
            findings.append(Finding(f"DataLoader({settings}) at {loader['at']}: {share:.0%} of each step waits for data; try num_workers={workers}, "
                                    f"persistent_workers=True" + (", pin_memory=True" if on_gpu else ""),
                                    gain, f"up to 1 / (1 - {share:.2f}) = {gain:.2f}x"))
        if not report["loaders"]:
            findings.append(Finding(verdict.fix, verdict.expected_gain, verdict.expected_gain_reason))
    elif verdict is not None:
        findings.append(Finding(verdict.fix, verdict.expected_gain, verdict.expected_gain_reason))
    steps = max(1, len(report["records"]))
    for site, count in sorted(report["syncs"].items(), key=lambda item: -item[1]):
        per_step = count / steps
        findings.append(Finding(f"{site}, {per_step:.3g} per step: on a GPU each read of a device value waits for every queued kernel (a host-device "
                                "sync); keep the value on the device (accumulate losses in a tensor) and read it once per epoch or every N steps",
                                None, "not estimable from here: the gain is the time the GPU's queue drains, largest for small models"))
    dtypes = report["matmul_dtypes"]
    if on_gpu and dtypes and set(dtypes) <= {"float32"}:
        findings.append(Finding("every matmul runs in float32: wrap the forward and loss in torch.autocast('cuda', dtype=torch.bfloat16)",
                                None, "the compute-bound verdict's gain applies when that is the verdict"))
        if not report["flags"]["tf32_matmul"] and report["flags"]["float32_matmul_precision"] == "highest":
            findings.append(Finding("TF32 is off: torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high'))",
                                    None, "float32 matmuls on tensor cores, ~8x the fp32 rate on A100/H100"))
    for optimizer in report["optimizers"]:
        if on_gpu and not optimizer.get("fused"):
            findings.append(Finding(f"{optimizer['class']}(..., fused=True): one kernel for all {optimizer['tensors']} parameter tensors",
                                    None, "the optimizer step's launches shrink from several per tensor to a few"))
    findings.sort(key=lambda f: -(f.gain or 0.0))
    return findings


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means and peaks of the sampled timeline, per source (host; gpu0, gpu1, ...)."""

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 2) if values else None

    out: dict[str, Any] = {}
    for source in sorted({row["source"] for row in rows}):
        mine = [row for row in rows if row["source"] == source]

        def values(key: str, mine: list[dict[str, Any]] = mine) -> list[float]:
            return [float(row[key]) for row in mine if row.get(key) is not None]

        if source == "host":
            out[source] = {"samples": len(mine), "cpu_percent_mean": mean(values("cpu_percent")),
                           "ram_used_gib_peak": round(max(values("ram_used"), default=0.0) / 2**30, 2)}
        else:
            out[source] = {"samples": len(mine), "util_percent_mean": mean(values("gpu_util")),
                           "memory_used_gib_peak": round(max(values("mem_used"), default=0.0) / 2**30, 2),
                           "power_w_mean": mean(values("power_w")), "sm_clock_mhz_mean": mean(values("sm_clock_mhz")),
                           "throttled_samples": sum(1 for row in mine if row.get("throttle"))}
    return out


def describe(report: dict[str, Any]) -> dict[str, Any]:
    """What the training is, as seen from inside it."""
    if not report:
        return {}
    optimizers = report["optimizers"]
    dtypes = report["matmul_dtypes"]
    return {
        "parameters": sum(o["parameters"] for o in optimizers),
        "optimizer": ", ".join(o["class"] for o in optimizers) or None,
        "flops_per_step": report["flops_per_step"],
        "batch_size": report["batch_size"],
        "precision": ", ".join(f"{d} ({n} matmuls)" for d, n in sorted(dtypes.items())) or None,
        "tf32": report["flags"]["tf32_matmul"] or report["flags"]["float32_matmul_precision"] != "highest",
        "cudnn_benchmark": report["flags"]["cudnn_benchmark"],
        "compiled": report["compiled"],
        "loaders": report["loaders"],
        "device": ", ".join(report["devices"]) or None,
        "world_size": report["world_size"],
    }
