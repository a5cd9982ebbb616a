"""`gpufill bench [--steps N] [--try NAME] [--repeats R] -- COMMAND`: a user's script as it is and with
each speed-up gpufill can switch on from outside it, so the fix list's gains are measured.

Each variant is one instrumented run of the unchanged command, stopped after the warm-up and N
optimizer steps (launch.py); its rate is the batch size over the median step time (samples/s;
optimizer steps/s when no DataLoader tells the batch). Rounds are interleaved (every variant
once per round, the as-is run first) and one more as-is run closes the last round: the two
as-is rates bound the machine's run-to-run noise, and a gain inside it is called so. What needs
a change to the script (a DataLoader's settings, a per-step sync, autocast, a fused optimizer)
comes from the doctor's diagnosis of the as-is run, with its line, and is not applied.

The command therefore runs `len(run_order(...))` times (3 on a CPU at one round, 7 at three): said
before the first run, since a script with side effects (a log, an upload) has them that many times.
Each run has its own deadline (supervise.py).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufill.errors import InputError
from gpufill.script.diagnose import WARMUP_STEPS, analyse
from gpufill.script.instrument import SETTINGS
from gpufill.script.launch import ScriptRun, check_command, run_instrumented
from gpufill.script.supervise import DEADLINE_S, GRACE_S, check_timeout, left_running_text

ALLOCATOR = "expandable_segments:True"
"""PyTorch's caching allocator maps memory in growing segments: less fragmentation and fewer cudaMalloc
retries when shapes vary (sequence lengths, last batches)."""


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    what: str
    settings: tuple[str, ...] = ()
    allocator: bool = False
    cuda_only: bool = True
    cpu_only: bool = False
    variables: tuple[tuple[str, str], ...] = ()
    """Environment variables the variant sets in the command's environment."""

    def env(self) -> dict[str, str]:
        env = dict(self.variables)
        if self.allocator:
            current = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
            env["PYTORCH_CUDA_ALLOC_CONF"] = current if "expandable_segments" in current else ",".join(filter(None, [current, ALLOCATOR]))
        return env

    def applies_to(self, on_gpu: bool) -> bool:
        return not self.cpu_only if on_gpu else not self.cuda_only

    @property
    def only_for(self) -> str:
        """Where it can change anything, in words (for the variants that do not apply to this training)."""
        return "CUDA only" if self.cuda_only else "CPU trainings only"


AS_IS = Variant("as is", "the command unchanged", cuda_only=False)
VARIANTS = (
    Variant("tf32", SETTINGS["tf32"], ("tf32",)),
    Variant("cudnn_benchmark", SETTINGS["cudnn_benchmark"], ("cudnn_benchmark",)),
    Variant("allocator", f"PYTORCH_CUDA_ALLOC_CONF={ALLOCATOR}: the caching allocator grows segments instead of fragmenting", allocator=True),
    Variant("all", "tf32 + cudnn_benchmark + allocator together", ("tf32", "cudnn_benchmark"), allocator=True),
    Variant("one_thread", "OMP_NUM_THREADS=1 (and MKL's): one intra-op thread; on a busy CPU torch's default of one per core stalls "
                          "at every operator's barrier", cuda_only=False, cpu_only=True, variables=(("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"))),
)
"""What can be switched on from outside the script: the CUDA ones change nothing on a CPU, the thread count matters to CPU trainings."""


@dataclass(slots=True)
class VariantResult:
    variant: Variant
    rates: list[float] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def rate(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None


@dataclass(slots=True)
class ScriptBench:
    command: list[str]
    steps: int
    repeats: int
    unit: str
    device: str
    results: list[VariantResult]
    closing_as_is: float | None
    code_changes: list[dict[str, Any]]
    skipped: list[str]
    environment: dict[str, Any]
    endings: list[str] = field(default_factory=list)
    """How gpufill ended a run of the command (a deadline, an ignored SIGTERM), and what a run left running."""

    @property
    def as_is(self) -> float:
        """The baseline: the median of every as-is run (the closing one included)."""
        rate = self.results[0].rate
        assert rate is not None
        return rate

    @property
    def noise(self) -> float | None:
        """The spread of the as-is runs (max / min - 1): what the machine's run-to-run noise alone gives."""
        rates = self.results[0].rates
        return max(rates) / min(rates) - 1 if len(rates) >= 2 else None

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for result in self.results:
            gain = result.rate / self.as_is if result.rate else None
            noisy = gain is not None and self.noise is not None and abs(gain - 1) <= self.noise
            rows.append({"variant": result.variant.name, "what": result.variant.what, "settings": list(result.variant.settings),
                         "env": result.variant.env(), "rate": _round(result.rate), "runs": [_round(r) for r in result.rates],
                         "vs_as_is": _round(gain), "within_noise": noisy if result.variant is not AS_IS else None,
                         "flags_in_effect": result.flags, "note": result.note})
        return {"command": self.command, "steps": self.steps, "warmup": WARMUP_STEPS, "repeats": self.repeats, "unit": self.unit,
                "training_device": self.device, "variants": rows, "closing_as_is": _round(self.closing_as_is), "noise": _round(self.noise),
                "skipped": self.skipped, "code_changes": self.code_changes, "endings": self.endings, **self.environment}


def run_order(variants: list[Variant], repeats: int) -> list[tuple[int, Variant]]:
    """(round, variant) of every run of the command, in order: the as-is run, the variants of the first round, then per
    further round the as-is run and the variants again, and one closing as-is run (round `repeats`)."""
    rounds = [(r, v) for r in range(repeats) for v in ([AS_IS] if r else []) + variants]
    return [(0, AS_IS), *rounds, (repeats, AS_IS)]


def runs_text(variants: list[Variant], repeats: int, steps: int) -> str:
    """What the user is told before the first run: how many times the command runs."""
    n = len(run_order(variants, repeats))
    each = f" and {repeats} with each of {', '.join(v.name for v in variants)}" if variants else ""
    return f"your command runs {n} times: {repeats + 1} as it is{each}; each run stopped after {WARMUP_STEPS} warm-up + {steps} steps"


def bench_script(command: list[str], *, steps: int, repeats: int = 1, tries: tuple[str, ...] = (), progress: Any = None,
                 say: Any = None, timeout_s: float | None = DEADLINE_S, grace_s: float = GRACE_S) -> ScriptBench:
    """Measure the command as it is, then with each variant (all that apply to its device, or those in `tries`).
    `say(text)`: lines the user must see (how many times the command runs); `progress(text)`: transient ones."""
    check_command(command, "bench")
    check_timeout(timeout_s, grace_s)
    known = {v.name: v for v in VARIANTS}
    unknown = [name for name in tries if name not in known]
    if unknown:
        raise InputError(f"--try {unknown[0]} is not a speed-up gpufill can switch on from outside", where="command line", field="--try",
                         fix=f"one of {', '.join(known)} (the rest need a change to the script: see the list after the table)")
    if steps < 1 or repeats < 1:
        raise InputError(f"--steps {steps} / --repeats {repeats}: both must be at least 1", where="command line", field="--steps", fix="e.g. --steps 30")
    report = lambda text: progress(text) if progress else None  # noqa: E731
    tell = lambda text: say(text) if say else None  # noqa: E731
    # Which variants apply depends on the training's device, known after the first run: until then, this machine's.
    expected = _choose(known, tries, on_gpu=_cuda_here())
    tell(runs_text(expected, repeats, steps))
    as_is = VariantResult(AS_IS)
    endings: list[str] = []
    report("the command as it is")
    first = _measure(command, AS_IS, steps, timeout_s, endings, grace_s)
    if first.report is None or not first.stopped_by_gpufill:
        raise ScriptNotMeasured(first)
    device = next((d for d in first.report["devices"] if d.startswith("cuda")), first.report["devices"][0] if first.report["devices"] else "cpu")
    unit = "samples/s" if first.report["batch_size"] else "steps/s"
    as_is.rates.append(_rate(first))
    as_is.flags = {**first.report["flags"], "torch_threads": _threads(first.report)}
    on_gpu = device.startswith("cuda")
    chosen = _choose(known, tries, on_gpu=on_gpu)
    if chosen != expected:
        tell(f"the training runs on {device}: your command runs {len(run_order(chosen, repeats))} times in all, not {len(run_order(expected, repeats))} "
             f"({', '.join(v.name for v in chosen) or 'no'} variants)")
    skipped = [] if tries else [f"{v.name}: {v.only_for}, and the training runs on {device}" for v in VARIANTS if not v.applies_to(on_gpu)]
    results = {v.name: VariantResult(v, note="" if v.applies_to(on_gpu) else f"{v.only_for}: no effect expected on {device}") for v in chosen}
    closing: float | None = None
    for round_index, variant in run_order(chosen, repeats)[1:]:
        if round_index == repeats:
            report("the command as it is, again (the noise)")
            again = _measure(command, AS_IS, steps, timeout_s, endings, grace_s)
            if again.report is not None and again.stopped_by_gpufill:
                closing = _rate(again)
                as_is.rates.append(closing)
            continue
        result = as_is if variant is AS_IS else results[variant.name]
        report(f"round {round_index + 1}/{repeats}: {variant.name}")
        run = _measure(command, variant, steps, timeout_s, endings, grace_s)
        if run.report is None or not run.stopped_by_gpufill:
            result.note = f"did not finish {steps} steps: {run.report['stop_reason'] if run.report else 'no report'} (exit code {run.exit_code})"
            continue
        result.rates.append(_rate(run))
        result.flags = {**run.report["flags"], "torch_threads": _threads(run.report)}
        result.note = result.note or _did_not_stick(variant, result.flags)
    from gpufill.bench.report import environment

    diagnosis = analyse(first)
    changes = [f.to_dict() for f in diagnosis.findings if f.where]  # the ones that name a line of the script
    return ScriptBench(command=command, steps=steps, repeats=repeats, unit=unit, device=device, results=[as_is, *results.values()], closing_as_is=closing,
                       code_changes=changes, skipped=skipped, environment=environment(device), endings=endings)


def _choose(known: dict[str, Variant], tries: tuple[str, ...], *, on_gpu: bool) -> list[Variant]:
    return [known[name] for name in tries] if tries else [v for v in VARIANTS if v.applies_to(on_gpu)]


def _cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


class ScriptNotMeasured(Exception):
    """The as-is run did not reach its measured steps: nothing to compare against."""

    def __init__(self, run: ScriptRun):
        self.run = run
        reason = run.report["stop_reason"] if run.report else "no Python process of the command was instrumented"
        ended = f"; gpufill ended it: {run.ending}" if run.ending else ""
        super().__init__(f"gpufill bench: the command was not measured: {reason} (exit code {run.exit_code}){ended}")


def _measure(command: list[str], variant: Variant, steps: int, timeout_s: float | None, endings: list[str], grace_s: float = GRACE_S) -> ScriptRun:
    # The script's standard output goes to /dev/null (a table of rates is the product here); its errors still show.
    with tempfile.TemporaryDirectory(prefix="gpufill-bench-") as folder, open(os.devnull, "w") as quiet:
        run = run_instrumented(command, Path(folder), steps=steps, warmup=WARMUP_STEPS, settings=variant.settings, extra_env=variant.env(),
                               sample_every_s=5.0, stdout=quiet, timeout_s=timeout_s, grace_s=grace_s)
    ended = [f"gpufill ended it: {run.ending}"] if run.ending else []
    endings.extend(f"the {variant.name} run: {line}" for line in ended + left_running_text(run.left_running))
    return run


def _rate(run: ScriptRun) -> float:
    report = run.report
    assert report is not None
    step_s = statistics.median(r["step_s"] for r in report["records"])
    return (report["batch_size"] or 1) / step_s


def _threads(report: dict[str, Any]) -> int | None:
    return (report.get("threads") or {}).get("torch")


def _did_not_stick(variant: Variant, flags: dict[str, Any]) -> str:
    if "tf32" in variant.settings and not flags["tf32_matmul"]:
        return "the script switched TF32 off again"
    if "cudnn_benchmark" in variant.settings and not flags["cudnn_benchmark"]:
        return "the script switched cudnn.benchmark off again"
    wanted = dict(variant.variables).get("OMP_NUM_THREADS")
    if wanted is not None and flags.get("torch_threads") not in (None, int(wanted)):
        return f"the script sets its own thread count (torch.set_num_threads({flags['torch_threads']})): the variable changed nothing"
    return ""


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
