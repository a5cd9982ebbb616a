"""The bottleneck verdict: which one of four limits a training hits, the fix, and what it may gain.

:func:`classify` is a pure function of measured numbers (:class:`PhaseTimings` from the
profiler, :class:`Yardstick` from the speed test and the device), so each verdict is
tested with constructed numbers. The rules, checked in this order, first match wins:

1. ``input-bound``: waiting for the next batch plus copying it to the device takes
   >= 40 % of a step. Nothing else matters until that is fixed, so it is checked first.
2. ``launch/overhead-bound``: doubling the micro-batch raises the compute time by less
   than 1.3x: a fixed cost per step (kernel launches, Python, the optimizer's per-tensor
   loop) dominates, not the work on the samples. Where the batch cannot be doubled (a
   user's own script runs at its own batch), the roofline stands in for the probe: when the
   step's FLOPs at the measured matmul rate (of the precision its matmuls ran in) and its
   bytes at the measured copy rate together explain under 30 % of the compute time, the rest
   is a fixed cost, and doubling the batch would add at most the explained share: the same
   1.3x threshold.
3. ``compute-bound``: the time scales with the batch and the achieved FLOP/s is >= 30 %
   of the matmul rate the speed test measured on this device, in the same precision. On a CPU the speed test's
   matmul is timed again in the compute probe's rounds and the share is taken between those two: measured at the
   same moments, so a load that changes between the speed test and the probe does not move the verdict.
4. ``memory-bound``: the time scales with the batch but the FLOP/s is far below the
   matmul rate: elementwise kernels moving bytes take the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpufill.engine.hardware import peak_for
from gpufill.engine.plan import RESIDENT_SHARE

__all__ = ["INPUT_SHARE", "MATMUL_SHARE", "SCALING_OVERHEAD", "PhaseTimings", "Verdict", "VerdictKind", "Yardstick", "classify"]

VerdictKind = Literal["input-bound", "launch/overhead-bound", "compute-bound", "memory-bound", "thread-oversubscribed"]
"""The last is a script's (script/oversubscription.py): torch threads stalling each other on a busy CPU."""

INPUT_SHARE = 0.40
"""Data wait + copy at or above this share of the step: input-bound."""
SCALING_OVERHEAD = 1.3
"""t(2b) / t(b) below this: the per-step fixed cost dominates (perfect scaling would be 2.0)."""
MATMUL_SHARE = 0.30
"""Achieved FLOP/s at or above this share of the measured matmul rate: compute-bound."""
DEVICE_GAIN_CAP = 10.0
"""A CPU training moved to a GPU: small models hit launch overhead long before the GPU's peaks."""
REFERENCE_GPU = "T4"
"""The smallest GPU in the peak table: what "a GPU" means in a CPU verdict's expected gain."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseTimings:
    """Seconds per training step, by phase (medians over the profiled steps), and the scaling probe."""

    data_s: float
    """Waiting for ``next(iterator)``: the loader (or host-side batching) producing the batch."""
    copy_s: float
    """Host-to-device copy of the batch (zero when it is already on the device)."""
    forward_s: float
    """Forward pass and loss."""
    backward_s: float
    """zero_grad and backward."""
    optimizer_s: float
    batch_size: int
    steps: int
    compute_b_s: float
    """forward + backward + optimizer step on a device-resident batch of `batch_size`, one sync."""
    compute_2b_s: float | None
    """The same at twice the batch (None: it did not fit in memory)."""
    flops_per_step: float | None
    """Forward + backward FLOPs at `batch_size` (torch's FlopCounterMode); None: not countable."""
    syncs_per_step: float | None = None
    """Implicit host-device syncs per step (CUDA sync debug mode); None where not measurable."""
    bytes_per_step: float | None = None
    """Bytes the step's operators read and write (inputs + outputs, counted once per operator); None: not counted."""
    ops_per_step: int | None = None
    """Computing operators (kernel launches on a GPU) per step; None: not counted."""
    fast_matmuls: bool = False
    """The matmuls ran in bf16/fp16 (autocast): the roofline takes the fast precision's rate."""
    matmul_beside_tflops: float | None = None
    """The yardstick's fp32 matmul rate timed in the same rounds as `compute_b_s` (a CPU's probe; None elsewhere)."""

    @property
    def step_s(self) -> float:
        return self.data_s + self.copy_s + self.forward_s + self.backward_s + self.optimizer_s

    @property
    def shares(self) -> dict[str, float]:
        """Each phase's share of the step; they sum to 1."""
        total = self.step_s or 1.0
        phases = {"data_wait": self.data_s, "copy": self.copy_s, "forward": self.forward_s,
                  "backward": self.backward_s, "optimizer": self.optimizer_s}
        return {name: seconds / total for name, seconds in phases.items()}

    @property
    def input_share(self) -> float:
        return (self.data_s + self.copy_s) / (self.step_s or 1.0)

    @property
    def scaling(self) -> float | None:
        """t(2b) / t(b): 2.0 is time proportional to the batch, 1.0 is a pure fixed cost."""
        return None if self.compute_2b_s is None else self.compute_2b_s / self.compute_b_s

    @property
    def compute_s(self) -> float:
        """Best evidence of the compute time at the batch: the probe, or the profiled steps' phases if faster.

        Both time the same work; whichever was less disturbed by other processes is closer to the truth.
        """
        return min(self.compute_b_s, self.forward_s + self.backward_s + self.optimizer_s)

    @property
    def achieved_tflops(self) -> float | None:
        return None if self.flops_per_step is None else self.flops_per_step / self.compute_s / 1e12

    def roofline_shares(self, yardstick: Yardstick) -> tuple[float, float] | None:
        """Shares of the compute time the step's FLOPs (at the measured matmul rate) and its bytes (at the
        measured copy rate) account for; None where either was not counted."""
        if self.flops_per_step is None or self.bytes_per_step is None or self.compute_s <= 0:
            return None
        fast = yardstick.fast_matmul_ratio if self.fast_matmuls and yardstick.fast_matmul_ratio else 1.0
        flops_s = self.flops_per_step / (yardstick.matmul_tflops * fast * 1e12)
        bytes_s = self.bytes_per_step / (yardstick.memory_gbps * 1e9)
        return flops_s / self.compute_s, bytes_s / self.compute_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Yardstick:
    """What the training is measured against: the device and the speed test's numbers."""

    device_type: str
    cpu_count: int
    matmul_tflops: float
    """Measured fp32 matmul rate: the precision the profiled training runs in."""
    memory_gbps: float
    fast_precision: str | None = None
    """"bf16" or "fp16" where the GPU has it, else None."""
    fast_matmul_ratio: float | None = None
    """Matmul rate of `fast_precision` / fp32 (measured where possible, else the peak table)."""
    fast_ratio_source: str = ""
    data_bytes: int | None = None
    """Bytes of the training data, if moved to the device whole."""
    free_bytes: int | None = None
    """Free device memory now."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """One bottleneck, the numbers behind it, the fix, and an expected gain with its derivation."""

    kind: VerdictKind
    reason: str
    evidence: dict[str, float | None]
    fix: str
    expected_gain: float | None
    expected_gain_reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "evidence": {k: (None if v is None else round(v, 6)) for k, v in self.evidence.items()},
            "fix": self.fix,
            "expected_gain": None if self.expected_gain is None else round(self.expected_gain, 2),
            "expected_gain_reason": self.expected_gain_reason,
        }


def classify(timings: PhaseTimings, yardstick: Yardstick) -> Verdict:
    """The one verdict for `timings` (rules in the module docstring)."""
    scaling = timings.scaling
    achieved = timings.achieved_tflops
    matmul_share = None if achieved is None else achieved / yardstick.matmul_tflops
    beside = timings.matmul_beside_tflops
    probe_tflops = None if timings.flops_per_step is None else timings.flops_per_step / timings.compute_b_s / 1e12
    if probe_tflops is not None and beside is not None:
        matmul_share = probe_tflops / beside  # the pair timed in the same rounds: under the same load
    evidence = {
        "input_share": timings.input_share,
        "step_s": timings.step_s,
        "compute_b_s": timings.compute_b_s,
        "compute_2b_s": timings.compute_2b_s,
        "scaling_2b_over_b": scaling,
        "achieved_tflops": achieved,
        "measured_matmul_tflops": yardstick.matmul_tflops,
        "matmul_beside_probe_tflops": beside,
        "matmul_share": matmul_share,
        "syncs_per_step": timings.syncs_per_step,
        "ops_per_step": timings.ops_per_step,
        "bytes_per_step": timings.bytes_per_step,
    }
    if timings.input_share >= INPUT_SHARE:
        return _input_bound(timings, yardstick, evidence)
    if scaling is not None and scaling < SCALING_OVERHEAD:
        reason = (f"compute at batch {2 * timings.batch_size} takes {scaling:.2f}x the time at {timings.batch_size} (< {SCALING_OVERHEAD}): "
                  "a fixed cost per step dominates, not the samples")
        return _overhead_bound(yardstick, evidence, scaling, reason)
    roofline = timings.roofline_shares(yardstick) if scaling is None else None
    # FLOP-bound and byte-bound kernels are different kernels: together they explain at most the sum.
    if roofline is not None and 1.0 + sum(roofline) < SCALING_OVERHEAD:
        explained = sum(roofline)
        evidence |= {"flops_share_of_compute": roofline[0], "bytes_share_of_compute": roofline[1]}
        ops = f" ({timings.ops_per_step} operators, {timings.compute_s / timings.ops_per_step * 1e6:.1f} us each)" if timings.ops_per_step else ""
        reason = (f"the step's FLOPs explain {roofline[0]:.0%} and its bytes {roofline[1]:.0%} of its {timings.compute_s * 1e3:.2f} ms of compute "
                  f"at the rates measured here (together < {SCALING_OVERHEAD - 1:.0%}): the rest{ops} is a fixed cost per step, so twice the "
                  f"batch would take at most about {1 + explained:.2f}x the time")
        return _overhead_bound(yardstick, evidence, 1.0 + explained, reason, estimated=True)
    scales = f"t(2b)/t(b) = {scaling:.2f} (>= {SCALING_OVERHEAD})" if scaling is not None else "scaling with the batch not measured (2b did not fit, or the batch is the script's own)"
    if matmul_share is None:
        # Without a FLOP count the two cannot be told apart; compute-bound is the verdict whose fix
        # (a faster precision or device) also helps a memory-bound training.
        # The gain then assumes the matmul share at the threshold: the smallest a compute-bound one has.
        reason = f"{scales}; FLOPs could not be counted, so compute-bound is assumed"
        return _compute_bound(yardstick, evidence, reason, MATMUL_SHARE)
    rate = (f"{achieved:.3g} TFLOP/s achieved = {matmul_share:.0%} of the {yardstick.matmul_tflops:.3g} TFLOP/s fp32 matmul rate measured here"
            if beside is None or probe_tflops is None else
            f"{probe_tflops:.3g} TFLOP/s achieved in the probe = {matmul_share:.0%} of the {beside:.3g} TFLOP/s fp32 matmul rate timed in its "
            f"rounds (the speed test's: {yardstick.matmul_tflops:.3g})")
    if matmul_share >= MATMUL_SHARE:
        return _compute_bound(yardstick, evidence, f"{scales}; {rate} (>= {MATMUL_SHARE:.0%})", min(matmul_share, 1.0))
    return _memory_bound(yardstick, evidence, f"{scales}; {rate} (< {MATMUL_SHARE:.0%}): bytes, not FLOPs, take the time", matmul_share)


def _input_bound(t: PhaseTimings, y: Yardstick, evidence: dict[str, float | None]) -> Verdict:
    share = t.input_share
    reason = (f"data wait {t.data_s * 1e3:.2f} ms + copy {t.copy_s * 1e3:.2f} ms = {share:.0%} of the "
              f"{t.step_s * 1e3:.2f} ms step (>= {INPUT_SHARE:.0%})")
    fits = y.data_bytes is not None and y.free_bytes is not None and y.data_bytes <= RESIDENT_SHARE * y.free_bytes
    workers = max(1, y.cpu_count - 1)  # one core stays with the training loop itself
    if fits:
        assert y.data_bytes is not None and y.free_bytes is not None
        where = "on the GPU" if y.device_type == "cuda" else "in memory as whole tensors"
        fix = (f"put the data on the device: gpufill.fit does it automatically for (inputs, targets) tensors under {RESIDENT_SHARE:.0%} "
               f"of free memory (this data: {y.data_bytes / 2**20:.1f} MiB = {y.data_bytes / y.free_bytes:.2%} of {y.free_bytes / 2**30:.1f} GiB "
               f"free) and batches them by index {where}: no loader, no per-sample __getitem__, no per-step copy")
    elif t.copy_s > t.data_s and y.device_type == "cuda":
        fix = "pin the host batches (pin_memory=True) and copy with non_blocking=True so copies overlap compute (gpufill.fit does both for loader data)"
    else:
        fix = (f"raise num_workers to {workers} with persistent_workers=True and prefetch (gpufill.fit picks these when the data "
               "cannot live on the device), or batch whole tensors by index instead of one __getitem__ per sample")
    gain = 1.0 / max(1.0 - share, 1e-9)
    return Verdict(kind="input-bound", reason=reason, evidence=evidence, fix=fix, expected_gain=gain,
                   expected_gain_reason=f"up to 1 / (1 - {share:.2f}) = {gain:.2f}x: the step shrinks to its compute when the input wait is gone")


def _overhead_bound(y: Yardstick, evidence: dict[str, float | None], scaling: float, reason: str, *, estimated: bool = False) -> Verdict:
    graphs = "torch.compile (mode='reduce-overhead' uses CUDA graphs)" if y.device_type == "cuda" else "torch.compile to cut per-op Python and dispatch cost"
    fix = (f"raise the micro-batch (gpufill.fit's batch choice and gpufill's batch search do), fuse several same-shape models into one "
           f"pack (gpufill campaigns do), or {graphs}")
    gain = 2.0 / scaling
    return Verdict(kind="launch/overhead-bound", reason=reason, evidence=evidence, fix=fix, expected_gain=gain,
                   expected_gain_reason=f"2 x t(b) / t(2b) = 2 / {scaling:.2f} = {gain:.2f}x samples/s per doubling of the batch (up to; it shrinks as the batch "
                                        "grows)" + ("; t(2b) estimated from the roofline, not measured" if estimated else ""))


def _compute_bound(y: Yardstick, evidence: dict[str, float | None], reason: str, matmul_share: float) -> Verdict:
    if y.device_type != "cuda":
        gain, why = _gpu_gain(y, matmul_share)
        return Verdict(kind="compute-bound", reason=reason, evidence=evidence,
                       fix="a GPU: this training is limited by the CPU's arithmetic rate (gpufill plans bf16/TF32 there automatically)",
                       expected_gain=gain, expected_gain_reason=why)
    gain, why = _precision_gain(y, matmul_share)
    fix = (f"mixed precision: {y.fast_precision} autocast (gpufill.fit picks it on this GPU) and TF32 for what stays fp32"
           if y.fast_precision else "TF32 is not available on this GPU: a newer GPU (sm_80+) or a smaller model")
    return Verdict(kind="compute-bound", reason=reason, evidence=evidence, fix=fix, expected_gain=gain, expected_gain_reason=why)


def _memory_bound(y: Yardstick, evidence: dict[str, float | None], reason: str, matmul_share: float) -> Verdict:
    if y.device_type != "cuda":
        gain, why = _gpu_gain(y, matmul_share)
        fix = "a GPU (many times the memory bandwidth); on this CPU, torch.compile fuses elementwise ops into fewer passes over memory"
        return Verdict(kind="memory-bound", reason=reason, evidence=evidence, fix=fix, expected_gain=gain, expected_gain_reason=why)
    gain, why = _precision_gain(y, matmul_share)
    fix = (f"mixed precision halves the bytes every kernel moves ({y.fast_precision} autocast, gpufill.fit picks it here); "
           "torch.compile fuses elementwise ops into fewer kernels")
    return Verdict(kind="memory-bound", reason=reason, evidence=evidence, fix=fix, expected_gain=gain, expected_gain_reason=why)


def _precision_gain(y: Yardstick, m: float) -> tuple[float | None, str]:
    """Amdahl over the step: matmul time (share m) speeds up by the precision's rate ratio, the rest by 2 (half the bytes)."""
    if y.fast_precision is None or y.fast_matmul_ratio is None:
        return None, "n/a: this GPU has no faster precision than fp32 in gpufill's table"
    r = y.fast_matmul_ratio
    gain = 1.0 / (m / r + (1.0 - m) / 2.0)
    return gain, (f"up to 1 / ({m:.2f} / {r:.1f} + {1 - m:.2f} / 2) = {gain:.2f}x: the matmul share ({m:.0%}) runs {r:.1f}x faster in "
                  f"{y.fast_precision} ({y.fast_ratio_source}), the rest moves half the bytes")


def _gpu_gain(y: Yardstick, m: float) -> tuple[float, str]:
    """Amdahl for moving a CPU training to the smallest GPU in the table, capped (see DEVICE_GAIN_CAP)."""
    entry = peak_for(REFERENCE_GPU)
    assert entry is not None, "the peak table lost its reference GPU"
    name, peak = entry
    r_flops = peak.fp32_tflops / y.matmul_tflops
    r_bytes = peak.memory_gbps / y.memory_gbps
    raw = 1.0 / (m / r_flops + (1.0 - m) / r_bytes)
    gain = min(raw, DEVICE_GAIN_CAP)
    return gain, (f"up to min(1 / ({m:.2f} / {r_flops:.0f} + {1 - m:.2f} / {r_bytes:.0f}), {DEVICE_GAIN_CAP:.0f}) = {gain:.1f}x: a {name} "
                  f"({peak.fp32_tflops} fp32 TFLOP/s, {peak.memory_gbps:.0f} GB/s) against {y.matmul_tflops:.3g} TFLOP/s and "
                  f"{y.memory_gbps:.3g} GB/s measured here; capped because small trainings meet launch overhead on a GPU first")
