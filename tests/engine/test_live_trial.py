"""The live trial (engine/measure/live.py): a CPU training's threads and precision chosen on its own first steps."""

from __future__ import annotations

import pytest
import torch

from gpufill.engine.loop import fit
from gpufill.engine.measure import live
from gpufill.engine.measure.cache import clear_memory
from gpufill.engine.measure.live import Arm, LiveTrial, arms_for, rounds_that_fit, steps_needed
from tests.engine.common import assert_same_weights, mlp, regression

PLANNED, ONE_FP32, ONE_BF16, TWO_BF16 = Arm(2, "fp32"), Arm(1, "fp32"), Arm(1, "bf16"), Arm(2, "bf16")


def drive(trial: LiveTrial, seconds: dict[Arm, float], *, steps: int = 200, losses: dict[str, float] | None = None,
          first_step_s: float = 0.1) -> list[Arm]:
    """Run `trial` as a training would: each step at the arm it asks for, taking that arm's seconds; returns the arms
    the steps ran at until it decided."""
    ran: list[Arm] = []
    for index in range(steps):
        if trial.done:
            break
        arm = trial.needs_check()
        if arm is not None:
            trial.precision_checked(arm.precision, (losses or {}).get(PLANNED.precision, 1.0), (losses or {}).get(arm.precision, 1.0))
        trial.before_step()
        running = trial.running
        assert running is not None
        ran.append(running)
        trial.observe(first_step_s if index == 0 else seconds[running])
    return ran


def a_trial(total_steps: int = 1000, arms: list[Arm] | None = None) -> tuple[LiveTrial, list[Arm]]:
    applied: list[Arm] = []
    arms = arms or arms_for(PLANNED, [2, 1], ["fp32", "bf16"])
    return LiveTrial(arms, rounds_that_fit(len(arms), total_steps), applied.append, total_steps), applied


def test_the_arms_are_every_pair_the_planned_first_then_its_own_threads_other_precision():
    assert arms_for(PLANNED, [2, 1], ["fp32", "bf16"]) == [PLANNED, TWO_BF16, ONE_FP32, ONE_BF16]
    assert arms_for(Arm(1, "fp32"), [1], ["fp32", "bf16"]) == [Arm(1, "fp32"), Arm(1, "bf16")]


def test_the_fastest_pair_wins_even_where_neither_setting_alone_is_faster():
    # The LSTM of the module docstring: 1 thread alone and bf16 alone are slower, 1 thread bf16 is the fastest.
    trial, applied = a_trial()
    ran = drive(trial, {PLANNED: 0.0065, TWO_BF16: 0.0070, ONE_FP32: 0.0095, ONE_BF16: 0.0045})
    assert trial.winner == ONE_BF16
    assert applied[-1] == ONE_BF16 and trial.running == ONE_BF16
    assert len(ran) <= steps_needed(4, 2)
    # bf16 warmed up on 2 threads before; no rival within 1.25x of it after the first round, so no second one.
    assert ran.count(ONE_BF16) == live.BLOCK and ran.count(TWO_BF16) == 1 + live.BLOCK and ran.count(ONE_FP32) == 2
    assert "1 thread bf16, 1.44x 2 threads fp32" in trial.log and "6.5 ms per step" in trial.log
    assert trial.record() == {"winner": "1/bf16", "log": trial.log, "seconds": pytest.approx(
        {"2/fp32": 0.0065, "2/bf16": 0.0070, "1/fp32": 0.0095, "1/bf16": 0.0045})}


def test_an_arm_far_slower_on_its_first_two_steps_runs_no_further_and_the_plain_one_wins_ties():
    trial, _ = a_trial()
    ran = drive(trial, {PLANNED: 0.010, TWO_BF16: 0.030, ONE_FP32: 0.0101, ONE_BF16: 0.040})
    assert trial.winner == PLANNED  # 1 thread fp32 is 1 % slower: under MIN_GAIN, the planned arm is kept
    assert ran.count(TWO_BF16) == 1 + 2 and ran.count(ONE_BF16) == 2  # bf16 warmed once, then two timed steps each
    assert TWO_BF16 in trial.dropped and ONE_BF16 in trial.dropped and "over 1.25x the best" in trial.dropped[TWO_BF16]
    assert "2 threads fp32 kept" in trial.log


def test_the_trial_stops_once_slower_arms_cost_three_percent_of_the_training():
    # 100 steps of 10 ms: 3 % is 30 ms, passed by the bf16 warm-up (40 ms over); the arm still gets its two timed steps,
    # then the trial ends: the arms after it are never tried.
    trial, _ = a_trial(total_steps=100)
    ran = drive(trial, {PLANNED: 0.010, TWO_BF16: 0.050, ONE_FP32: 0.008, ONE_BF16: 0.008})
    assert trial.winner == PLANNED
    assert ran.count(TWO_BF16) == 3 and ONE_FP32 not in ran and ONE_BF16 not in ran
    assert trial.excess_s == pytest.approx(0.120)
    assert "stopped after 0.12 s of slower steps" in trial.log and "1 thread fp32, 1 thread bf16 not tried" in trial.log


def test_a_slow_warm_up_does_not_end_the_trial_before_its_arm_is_timed():
    # 176 steps of 6.5 ms (the LSTM): 3 % is 34 ms; bf16's first step builds its kernels (60 ms), its steps then run 4.6 ms.
    trial, _ = a_trial(total_steps=176)
    seconds = {PLANNED: 0.0065, TWO_BF16: 0.0046, ONE_FP32: 0.0095, ONE_BF16: 0.0060}
    ran: list[Arm] = []
    for index in range(200):
        if trial.done:
            break
        trial.needs_check() and trial.precision_checked("bf16", 1.0, 1.0)
        trial.before_step()
        ran.append(trial.running)
        warm_bf16 = trial.running == TWO_BF16 and ran.count(TWO_BF16) == 1
        trial.observe(0.1 if index == 0 else 0.060 if warm_bf16 else seconds[trial.running])
    assert trial.winner == TWO_BF16 and "2 threads bf16, 1.41x 2 threads fp32" in trial.log


def test_a_precision_whose_loss_drifts_is_dropped_for_every_thread_count():
    trial, _ = a_trial()
    ran = drive(trial, {PLANNED: 0.010, TWO_BF16: 0.005, ONE_FP32: 0.011, ONE_BF16: 0.004}, losses={"fp32": 1.0, "bf16": 1.05})
    assert trial.winner == PLANNED
    assert TWO_BF16 not in ran and ONE_BF16 not in ran
    assert "its loss differs by 5.0% from fp32's (tolerance 2%)" in trial.dropped[ONE_BF16]


def test_a_training_too_short_for_the_trial_keeps_its_plan():
    assert rounds_that_fit(4, 200) == 2 and rounds_that_fit(4, 80) == 1 and rounds_that_fit(4, 50) == 0
    assert steps_needed(4, 1) == 16 and steps_needed(4, 2) == 28


# -- in fit ---------------------------------------------------------------------------------------------------------------

def test_a_fit_whose_trial_switches_threads_trains_as_a_plain_fit_at_the_winner(tmp_path):
    clear_memory()
    users = torch.get_num_threads()
    x, y = regression(n=4096)
    torch.manual_seed(0)
    measured = fit(mlp(), (x, y), (x[:256], y[:256]), epochs=3, batch_size=32, seed=1, precision="fp32", tune_cache=str(tmp_path),
                   optimizer_kernel="fused", compile=False, verbose=False)
    # The precision's reason: the thread watch after the trial may re-check threads on a loaded box and say so instead.
    assert "measured on the training's first steps" in measured.plan.precision.reason
    trial_events = [event for event in measured.events if event.startswith("threads and precision: ")]
    assert len(trial_events) == 1
    torch.manual_seed(0)
    plain = fit(mlp(), (x, y), (x[:256], y[:256]), epochs=3, batch_size=32, seed=1, precision="fp32", threads=1, probe=False, verbose=False)
    # The same batches and updates; only the thread count of some steps differs (the order of a sum's terms).
    assert_same_weights(measured.model, plain.model, atol=1e-5)
    assert [r.train_loss for r in measured.history] == pytest.approx([r.train_loss for r in plain.history], rel=1e-5)
    clear_memory()  # the next fit reads the file, as the next process would
    cached = fit(mlp(), (x, y), (x[:256], y[:256]), epochs=3, batch_size=32, seed=1, precision="fp32", tune_cache=str(tmp_path),
                 optimizer_kernel="fused", compile=False, verbose=False)
    log = trial_events[0].removeprefix("threads and precision: ")
    assert cached.plan.precision.reason == f"fp32: cached from an earlier training of this shape on this machine ({log})"
    assert not any(event.startswith("threads and precision: ") for event in cached.events)
    assert torch.get_num_threads() == users  # the trial's switches end with the training


def test_a_fit_too_short_for_the_trial_says_so():
    clear_memory()
    x, y = regression(n=256)
    result = fit(mlp(), (x, y), epochs=2, batch_size=32, precision="fp32", verbose=False)
    assert result.plan.threads.reason.endswith("not measured: trying 2 settings takes 8 steps, over 25% of this training's 16")


def test_arms_within_reach_of_the_best_race_a_second_block_and_each_keeps_its_faster_block():
    trial, _ = a_trial()
    ran = drive(trial, {PLANNED: 0.010, TWO_BF16: 0.009, ONE_FP32: 0.020, ONE_BF16: 0.020})
    assert ran.count(TWO_BF16) == 1 + 2 * live.BLOCK and ran.count(PLANNED) == 1 + 2 * live.BLOCK
    assert [len(block) for block in trial.times[TWO_BF16]] == [live.BLOCK, live.BLOCK]
    assert trial.winner == TWO_BF16 and "2 threads bf16, 1.11x 2 threads fp32" in trial.log


def test_a_precision_whose_forward_fails_is_dropped_with_its_error_and_the_training_goes_on(monkeypatch):
    from gpufill.engine.hardware import detect

    with_bf16 = _with_bf16(detect("cpu"))
    monkeypatch.setattr("gpufill.engine.prepare.detect", lambda device="auto": with_bf16)

    class NoBf16(torch.nn.Linear):
        def forward(self, x):
            if torch.is_autocast_enabled("cpu"):
                raise RuntimeError("no bf16 kernel for this op")
            return super().forward(x)

    clear_memory()
    x, y = regression(n=2048)
    result = fit(torch.nn.Sequential(NoBf16(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)), (x, y), epochs=2, batch_size=16, threads=1,
                 verbose=False)
    assert result.status == "completed" and result.plan.precision.value == "fp32"
    assert "1 thread bf16 dropped: its forward failed (RuntimeError: no bf16 kernel for this op)" in result.plan.precision.reason


def _with_bf16(hardware):
    fields = {name: getattr(hardware, name) for name in hardware.__dataclass_fields__}
    return hardware.__class__(**{**fields, "bf16_supported": True})
