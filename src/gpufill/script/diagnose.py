"""The diagnosis of a user's own script: what the training is, where a step's time goes, the
verdict and the fixes in the script's own terms (its file:line), ranked by expected gain.

`analyse` turns a ScriptRun (launch.py) into a ScriptDiagnosis: rank 0's step records become
the profiler's PhaseTimings, judged by the doctor's own verdict (`bottleneck.classify`) against
a speed test of the same device. `diagnose_script` is `gpufill doctor -- COMMAND`: a short
instrumented run, stopped after the warm-up and N steps.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpufill.doctor.bottleneck import PhaseTimings, Verdict, classify
from gpufill.monitor.summary import summarise
from gpufill.script.instrument import THREAD_TRIAL_ENV
from gpufill.script.launch import ScriptRun, check_command, run_instrumented
from gpufill.script.oversubscription import fix_text, measured_gain, thread_verdict, trial_unfinished
from gpufill.script.supervise import DEADLINE_S, GRACE_S, check_timeout

WARMUP_STEPS = 3
SYNCS_WORTH_A_FINDING = 0.25
"""A line that reads a device value in at least this share of the steps is a finding (rarer reads, such as an
evaluation loop's once an epoch however many they are, are the recommended practice)."""
SAMPLE_EVERY_S = 0.25
"""NVML and psutil while a diagnosis runs: a short one still gets several samples."""


@dataclass(slots=True)
class Finding:
    """One thing to change, in the script's terms, with the expected gain (None: not estimable here)."""

    what: str
    gain: float | None
    why: str
    where: str | None = None
    """file:line of the script to edit (None: a setting outside the script, or no line seen)."""
    spread: tuple[float, float] | None = None
    """The gain's measured range (per-step estimates' 10th-90th percentiles, or a trial's rounds); None: a model's figure."""
    within_noise: bool = False
    """The gain is smaller than the steps' own variation: not worth acting on before the rest."""

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "expected_gain": None if self.gain is None else round(self.gain, 2), "why": self.why, "where": self.where,
                "spread": None if self.spread is None else [round(v, 2) for v in self.spread], "within_noise": self.within_noise}


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
    ending: str = ""
    """How gpufill ended the command (ScriptRun.ending); empty when it ended by itself."""
    left_running: list[dict[str, Any]] = field(default_factory=list)

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
            "timed_on": report.get("timeline"),
            "syncs": report.get("syncs", {}),
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "machine": self.machine,
            "threads": report.get("threads"),
            "not_measured": self.not_measured,
            "stop_reason": report.get("stop_reason"),
            "error": report.get("error"),
            "ending": self.ending,
            "left_running": self.left_running,
        }


def diagnose_script(command: list[str], *, steps: int, quiet_output: bool = False, timeout_s: float | None = DEADLINE_S,
                    grace_s: float = GRACE_S) -> ScriptDiagnosis:
    """Run `command` instrumented for WARMUP_STEPS + `steps` optimizer steps and diagnose it; it is ended
    after `timeout_s` seconds (supervise.py, SIGKILL `grace_s` after SIGTERM) if it has not ended by then."""
    check_command(command, "doctor")
    check_timeout(timeout_s, grace_s)
    with tempfile.TemporaryDirectory(prefix="gpufill-doctor-") as folder:
        # The script's own output goes to stderr under --json, so stdout stays one JSON object.
        run = run_instrumented(command, Path(folder), steps=steps, warmup=WARMUP_STEPS, sample_every_s=SAMPLE_EVERY_S,
                               stdout=sys.stderr if quiet_output else None, extra_env={THREAD_TRIAL_ENV: "1"}, timeout_s=timeout_s, grace_s=grace_s)
    return analyse(run)


def analyse(run: ScriptRun, *, statistic: Literal["median", "mean"] = "median") -> ScriptDiagnosis:
    """The diagnosis of a finished run. `median`: per-step medians (a doctor's few steps); `mean`: the whole
    run's totals (a watch: where the run's time went, slow stretches included)."""
    report = run.report
    stopped = run.stopped_by_gpufill
    diagnosis = ScriptDiagnosis(command=run.command, exit_code=0 if stopped else run.exit_code, stopped_by_doctor=stopped, report=report,
                                ranks=len(run.reports), timings=None, verdict=None, machine=summarise(run.samples), ending=run.ending,
                                left_running=run.left_running)
    if report is None and run.ending:  # killed before any process of it wrote a report
        diagnosis.not_measured.append("everything: gpufill ended the command before it wrote a report (see how, below)")
    elif report is None:
        diagnosis.not_measured.append("everything: no Python process of the command loaded gpufill's instrumentation (not a Python command, "
                                      "or one that resets PYTHONPATH)")
    if report is None:
        return diagnosis
    _analyse(diagnosis, report, statistic, run.samples)
    return diagnosis


def _analyse(diagnosis: ScriptDiagnosis, report: dict[str, Any], statistic: Literal["median", "mean"], samples: list[dict[str, Any]]) -> None:
    records = report["records"]
    missing = diagnosis.not_measured
    if not report["optimizers"]:
        missing.append("step times: the script never called an optimizer's step()")
    elif not records:
        missing.append(f"step times: {report['stop_reason']} (the first {report['warmup']} steps are warm-up)")
    if report.get("error"):
        missing.append(f"the rest: {report['error']}")
    if report.get("stepped_by", "optimizer") != "optimizer":
        missing.append("the update's own time: the script updates its parameters by hand, so a step runs from one backward's end to the "
                       "next and the update is timed with the forward")
    if not any(d.startswith("cuda") for d in report["devices"]):
        missing.append("GPU utilisation, memory and syncs: the training ran on " + (", ".join(report["devices"]) or "no device seen"))
    if report["flops_per_step"] is None:
        missing.append("FLOPs per step: fewer than two optimizer steps were seen")
    threads = thread_verdict(report, samples) if records else None
    unfinished = trial_unfinished(report)
    if unfinished and (threads is None or unfinished not in threads.expected_gain_reason):
        missing.append(f"fewer threads: {unfinished}")
    if records:
        diagnosis.timings = _timings(report, statistic)
        diagnosis.verdict = classify(diagnosis.timings, _yardstick(report)) if threads is None else threads
    diagnosis.findings = _findings(report, diagnosis.timings, diagnosis.verdict)


def _timings(report: dict[str, Any], statistic: Literal["median", "mean"]) -> PhaseTimings:
    records, measured = report["records"], report["measured_steps"]

    def typical(key: str) -> float:
        return report["totals"][key] / measured if statistic == "mean" else statistics.median(r[key] for r in records)

    compute = typical("forward_s") + typical("backward_s") + typical("optimizer_s")
    syncs = sum(report["syncs"].values()) / measured
    return PhaseTimings(data_s=typical("data_s"), copy_s=typical("copy_s"), forward_s=typical("forward_s"), backward_s=typical("backward_s"),
                        optimizer_s=typical("optimizer_s"), batch_size=report["batch_size"] or 0, steps=measured, compute_b_s=compute,
                        compute_2b_s=None, flops_per_step=report["flops_per_step"], syncs_per_step=syncs,
                        # A compiled step's fused kernels pass the dispatch mode by: its counts would leave them out.
                        ops_per_step=None if report["compiled"] else report.get("ops_per_step"),
                        bytes_per_step=None if report["compiled"] else report.get("bytes_per_step"),
                        fast_matmuls=_mostly_low_precision(report["matmul_dtypes"]))


def _mostly_low_precision(dtypes: dict[str, int]) -> bool:
    low = sum(n for dtype, n in dtypes.items() if dtype in ("bfloat16", "float16"))
    return low > sum(dtypes.values()) / 2


def _yardstick(report: dict[str, Any]) -> Any:
    from gpufill.doctor.report import yardstick
    from gpufill.doctor.speedtest import run_speed_test
    from gpufill.engine.hardware import detect, free_memory_bytes

    device = next((d for d in report["devices"] if d.startswith("cuda")), "cpu")
    hardware = detect(device)
    return yardstick(hardware, run_speed_test(hardware), data_bytes=None, free_bytes=free_memory_bytes(hardware))


FUSED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD"})
"""Optimizers with a fused implementation on both CPU and CUDA in torch >= 2.4."""


def _findings(report: dict[str, Any], timings: PhaseTimings | None, verdict: Verdict | None) -> list[Finding]:
    on_gpu = any(d.startswith("cuda") for d in report["devices"])
    # The verdict's fixes come first (nothing else pays until its limit is gone); the others by expected gain,
    # those within the noise of the step times last.
    # A host read of a value is a sync only where the value lives on a GPU: on a CPU training it costs nothing.
    others = ((_sync_findings(report) if on_gpu else []) + _precision_findings(report, on_gpu) + _optimizer_findings(report, timings)
              + _hand_update_findings(report) + _worker_findings(report, verdict) + _thread_findings(report, verdict))
    if verdict is not None and verdict.kind == "thread-oversubscribed":
        for finding in others:
            finding.why += "; timed while threads stalled each other: measure again after the thread fix"
    return _verdict_findings(report, timings, verdict, on_gpu) + sorted(others, key=lambda f: (f.within_noise, -(f.gain or 0.0)))


def step_noise(report: dict[str, Any]) -> float | None:
    """The steps' own variation: the interquartile range of their times over the median (None: under 4 steps)."""
    times = [r["step_s"] for r in report["records"]]
    if len(times) < 4:
        return None
    q1, median, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / median if median > 0 else None


def share_gain(report: dict[str, Any], phases: tuple[str, ...], gain: float) -> dict[str, Any]:
    """The spread of a "remove this share of the step" gain over the steps (10th-90th percentile of per-step
    estimates), and whether the gain is inside the steps' own noise."""
    per_step = sorted(1.0 / max(1.0 - sum(r[p] for p in phases) / r["step_s"], 1e-9) for r in report["records"] if r["step_s"] > 0)
    noise = step_noise(report)
    spread = None
    if len(per_step) >= 4:
        deciles = statistics.quantiles(per_step, n=10)
        spread = (deciles[0], deciles[-1])
    return {"spread": spread, "within_noise": noise is not None and gain - 1.0 < noise}


def _verdict_findings(report: dict[str, Any], timings: PhaseTimings | None, verdict: Verdict | None, on_gpu: bool) -> list[Finding]:
    """The verdict's fix, named at the DataLoader line where the script sets what it depends on."""
    if verdict is None or timings is None:
        return []
    loaders = report["loaders"]
    if verdict.kind == "input-bound" and loaders:
        share = timings.input_share
        gain = 1.0 / max(1.0 - share, 1e-9)
        workers = max(1, (os.cpu_count() or 2) - 1)
        return [Finding(f"DataLoader(num_workers={loader['num_workers']}, pin_memory={loader['pin_memory']}) at {loader['at']}: {share:.0%} of each "
                        f"step waits for data; try num_workers={workers}, persistent_workers=True" + (", pin_memory=True" if on_gpu else ""),
                        gain, f"up to 1 / (1 - {share:.2f}) = {gain:.2f}x", where=loader["at"], **share_gain(report, ("data_s", "copy_s"), gain))
                for loader in loaders]
    sized = [loader for loader in loaders if loader["batch_size"] and loader["batch_size"] == report["batch_size"]]  # the training's, not a validation loader
    if verdict.kind == "thread-oversubscribed":
        low, high = verdict.evidence.get("low"), verdict.evidence.get("high")
        return [Finding(verdict.fix, verdict.expected_gain, verdict.expected_gain_reason, spread=None if low is None or high is None else (low, high))]
    if verdict.kind == "launch/overhead-bound" and not loaders and report.get("backward_at"):
        # No DataLoader: the batch is built in the script's own code, before its backward.
        at = report["backward_at"]
        return [Finding(f"the batch is built by the script itself (no DataLoader seen; its backward is at {at}): each step's fixed cost "
                        "does not grow with the batch, so raise the batch where it is built (2x, 4x, 8x) and scale the lr with it "
                        "(linearly for SGD, by the square root for Adam)", verdict.expected_gain, verdict.expected_gain_reason, where=at)]
    if verdict.kind != "launch/overhead-bound" or not sized:
        return [Finding(verdict.fix, verdict.expected_gain, verdict.expected_gain_reason)]
    findings = [Finding(f"DataLoader(batch_size={loader['batch_size']}) at {loader['at']}: each step's fixed cost does not grow with the batch; "
                        f"try batch_size={2 * loader['batch_size']}, {4 * loader['batch_size']}, {8 * loader['batch_size']} and scale the lr "
                        "with it (linearly for SGD, by the square root for Adam)", verdict.expected_gain, verdict.expected_gain_reason,
                        where=loader["at"]) for loader in sized]
    compile_how = "torch.compile(model, mode='reduce-overhead') (CUDA graphs)" if on_gpu else "torch.compile(model)"
    if not report["compiled"]:
        findings.append(Finding(f"{compile_how}: fewer, fused operators per step cut the fixed cost itself", None,
                                "not estimable before trying: it depends on how much of the model compiles into one graph"))
    return findings


def _sync_findings(report: dict[str, Any]) -> list[Finding]:
    findings = []
    steps = max(1, report["measured_steps"])
    in_steps = report.get("sync_steps") or report["syncs"]  # reports written before sync_steps: the counts
    for site, count in sorted(report["syncs"].items(), key=lambda item: -item[1]):
        per_step = count / steps
        if in_steps.get(site, 0) / steps < SYNCS_WORTH_A_FINDING:
            continue  # once per epoch or every N steps (an evaluation loop, however many reads it makes): what the fix recommends
        findings.append(Finding(f"{site}, {per_step:.3g} per step: on a GPU each read of a device value waits for every queued kernel (a host-device "
                                "sync); keep the value on the device (accumulate losses in a tensor) and read it once per epoch or every N steps",
                                None, "not estimable from here: the gain is the time the GPU's queue drains, largest for small models",
                                where=site.split(" at ", 1)[1]))
    return findings


def _precision_findings(report: dict[str, Any], on_gpu: bool) -> list[Finding]:
    dtypes = report["matmul_dtypes"]
    if not (on_gpu and dtypes and set(dtypes) <= {"float32"}):
        return []
    backward_at = report.get("backward_at")
    before = f" (the forward and loss before the backward at {backward_at})" if backward_at else ""
    findings = [Finding(f"every matmul runs in float32: wrap the forward and loss in torch.autocast('cuda', dtype=torch.bfloat16){before}",
                        None, "the compute-bound verdict's gain applies when that is the verdict", where=backward_at)]
    if not report["flags"]["tf32_matmul"] and report["flags"]["float32_matmul_precision"] == "highest":
        findings.append(Finding("TF32 is off: torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high'))",
                                None, "float32 matmuls on tensor cores, ~8x the fp32 rate on A100/H100"))
    return findings


def _optimizer_findings(report: dict[str, Any], timings: PhaseTimings | None) -> list[Finding]:
    """A fused optimizer (one kernel for all parameters instead of several per tensor), on CPU and GPU alike."""
    findings = []
    share = None if timings is None else timings.shares["optimizer"]
    for optimizer in report["optimizers"]:
        if optimizer.get("fused") or optimizer["class"] not in FUSED_OPTIMIZERS:
            continue
        built = f" at {optimizer['at']}" if optimizer.get("at") else ""
        gain = None if share is None else 1.0 / max(1.0 - share, 1e-9)
        why = ("not estimable: no step times" if gain is None else
               f"up to 1 / (1 - {share:.2f}) = {gain:.2f}x if the optimizer's {share:.0%} of the step went to nothing; fused cuts it several-fold")
        measured = {} if gain is None else share_gain(report, ("optimizer_s",), gain)
        findings.append(Finding(f"{optimizer['class']}(..., fused=True){built}: one kernel for all {optimizer['tensors']} parameter tensors "
                                f"instead of a loop over them", gain, why, where=optimizer.get("at"), **measured))
    return findings


def _thread_findings(report: dict[str, Any], verdict: Verdict | None) -> list[Finding]:
    """A thread trial that found fewer threads faster, but not clearly enough for the verdict: said, marked as noise."""
    gain = measured_gain((report.get("threads") or {}).get("trial"))
    if gain is None or gain.gain <= 1.0 or (verdict is not None and verdict.kind == "thread-oversubscribed"):
        return []
    return [Finding(fix_text(gain.fewer), gain.gain, f"measured over {gain.rounds} interleaved rounds ({gain.low:.2f}-{gain.high:.2f}x): "
                    "under 1.10x, or not faster in enough rounds, to act on before the rest", spread=(gain.low, gain.high), within_noise=True)]


def _worker_findings(report: dict[str, Any], verdict: Verdict | None) -> list[Finding]:
    """DataLoader workers beyond the cores left by the training's own process: they time-share those cores with it."""
    if verdict is not None and verdict.kind == "input-bound":
        return []  # the verdict's own fix sets the workers
    cores = (report.get("threads") or {}).get("usable_cores") or os.cpu_count() or 1
    return [Finding(f"DataLoader(num_workers={loader['num_workers']}) at {loader['at']}: more workers than the {cores - 1} core(s) the training's "
                    f"own process leaves of {cores}; they time-share the cores with the training: try num_workers={max(cores - 1, 0)}",
                    None, "not estimable from here: the data wait is not what limits this training", where=loader["at"])
            for loader in report["loaders"] if loader["num_workers"] >= cores and loader["num_workers"] > 1]


def _hand_update_findings(report: dict[str, Any]) -> list[Finding]:
    """Parameters updated in a Python loop (`p.data.add_(-lr * p.grad)`): torch's SGD does the same update, fused."""
    if report.get("stepped_by", "optimizer") == "optimizer":
        return []
    tensors = report["optimizers"][0]["tensors"]
    return [Finding(f"the hand-written update of {tensors} parameter tensors: torch.optim.SGD(model.parameters(), lr=lr, fused=True) and "
                    "optimizer.step() do the same update (plain SGD, no momentum) in one kernel instead of a Python loop over the tensors",
                    None, "not estimable from here: the hand-written update is timed with the forward")]


def describe(report: dict[str, Any]) -> dict[str, Any]:
    """What the training is, as seen from inside it."""
    if not report:
        return {}
    optimizers = report["optimizers"]
    dtypes = report["matmul_dtypes"]
    return {
        "parameters": sum(o["parameters"] for o in optimizers),
        "optimizer": ", ".join(o["class"] for o in optimizers) or None,
        "steps": report.get("stepped_by", "optimizer"),
        "flops_per_step": report["flops_per_step"],
        "ops_per_step": report.get("ops_per_step"),
        "batch_size": report["batch_size"],
        "precision": ", ".join(f"{d} ({n} matmuls)" for d, n in sorted(dtypes.items())) or None,
        "tf32": report["flags"]["tf32_matmul"] or report["flags"]["float32_matmul_precision"] != "highest",
        "cudnn_benchmark": report["flags"]["cudnn_benchmark"],
        "compiled": report["compiled"],
        "loaders": report["loaders"],
        "device": ", ".join(report["devices"]) or None,
        "world_size": report["world_size"],
    }


def loader_text(loader: dict[str, Any]) -> str:
    """A DataLoader as the script built it, in one line."""
    built = f" (built {loader['created']} times)" if loader.get("created", 1) > 1 else ""
    return (f"{loader['at']}{built}: batch {loader['batch_size']}, num_workers {loader['num_workers']}, pin_memory {loader['pin_memory']}, "
            f"persistent {loader['persistent_workers']}")


def gain_text(finding: dict[str, Any]) -> str:
    """1.47x, its measured range where there is one, and whether it lies inside the steps' own noise."""
    spread = finding.get("spread")
    text = f"{finding['expected_gain']:.2f}x" + (f" ({spread[0]:.2f}-{spread[1]:.2f}x)" if spread else "")
    return text + (", within the noise" if finding.get("within_noise") else "")
