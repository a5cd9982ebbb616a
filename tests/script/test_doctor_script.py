"""`gpufill doctor -- COMMAND` on plain PyTorch scripts written the way the guides' users write them
(tests/user_scripts/, none of them uses gpufill): the verdict, the script's own lines, partial
reports and the script's exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import USER_SCRIPTS, run_ranks


def doctor(script: str, *args: str, steps: int = 5, threads: str | None = "1") -> tuple[int, dict, str]:
    """The doctor's JSON. One torch thread unless `threads` is None (the script's own): on a loaded box more
    would make any script thread-oversubscribed, and these tests are about the other verdicts."""
    command = [sys.executable, "-m", "gpufill", "doctor", "--steps", str(steps), "--json", "--", sys.executable, str(USER_SCRIPTS / script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": threads} if threads else None
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert run.stdout.strip(), run.stderr
    return run.returncode, json.loads(run.stdout), run.stderr


@pytest.mark.slow
def test_a_loader_bound_script_is_input_bound_and_its_dataloader_line_is_named():
    code, report, _ = doctor("loader_bound.py")
    assert code == 0 and report["stopped_by_doctor"]
    assert report["verdict"]["kind"] == "input-bound"
    assert report["shares"]["data_wait"] >= 0.4
    first = report["findings"][0]
    assert "DataLoader(num_workers=0" in first["what"] and "loader_bound.py:22" in first["what"]
    share = report["shares"]["data_wait"] + report["shares"]["copy"]
    assert first["expected_gain"] == pytest.approx(1 / (1 - share), rel=0.02)
    assert report["training"]["loaders"][0]["batch_size"] == 32 and report["training"]["parameters"] == 16 * 32 + 32 + 32 + 1
    host = report["machine"]["host"]  # the campaign sampler ran beside the script
    assert host["samples"] >= 2 and 0 < host["cpu_percent_mean"] <= 100 and host["ram_used_gib_peak"] > 0


@pytest.mark.slow
def test_a_per_step_item_is_named_with_its_line_and_counted_once_per_step():
    code, report, _ = doctor("item_every_step.py", steps=6)
    assert code == 0
    assert list(report["syncs"].values()) == [6] and list(report["syncs"])[0].startswith("item() at ")
    assert list(report["syncs"])[0].endswith("item_every_step.py:17")
    # On a CPU a host read waits for nothing: counted, but not a finding (on a GPU it is: test_on_a_gpu_...).
    assert report["training"]["device"] == "cpu" and not any("item() at" in f["what"] for f in report["findings"])


@pytest.mark.serial  # measures time: the verdict compares the script's steps with a matmul timed after them
@pytest.mark.slow
def test_a_compute_heavy_script_is_compute_bound_with_its_flops_counted():
    code, report, _ = doctor("compute_heavy.py", steps=3)
    assert code == 0
    assert report["verdict"]["kind"] == "compute-bound"
    first, layers = 1024 * 2048, 1024 * 2048 + 2048 * 2048 + 2048 * 1024
    # Forward 2 FLOPs per weight and sample, backward 4 (2 for the first layer: its input needs no gradient).
    assert report["training"]["flops_per_step"] == 512 * (6 * layers - 2 * first)
    assert report["training"]["precision"].startswith("float32 (")


@pytest.mark.serial  # measures time: the bytes share is measured against a copy rate timed after the steps
@pytest.mark.slow
def test_a_small_model_at_batch_8_is_overhead_bound_and_its_batch_size_line_is_named():
    code, report, _ = doctor("tiny_steps.py", steps=8)
    assert code == 0
    verdict = report["verdict"]
    assert verdict["kind"] == "launch/overhead-bound"
    # Neither the step's FLOPs nor its bytes explain the time: the roofline stands in for the batch probe.
    assert verdict["evidence"]["flops_share_of_compute"] < 0.05 and verdict["evidence"]["bytes_share_of_compute"] < 0.05
    assert report["training"]["ops_per_step"] > 100  # 13 layers forward and backward, and Adam's loop over 14 tensors
    first = report["findings"][0]
    assert first["what"].startswith("DataLoader(batch_size=8) at ") and "tiny_steps.py:10" in first["what"] and "batch_size=16, 32, 64" in first["what"]
    assert first["expected_gain"] == pytest.approx(verdict["expected_gain"], abs=0.01) and first["expected_gain"] > 1.9
    fused = next(f for f in report["findings"] if "fused=True" in f["what"])
    assert fused["what"].startswith("Adam(..., fused=True) at ") and fused["where"].endswith("tiny_steps.py:15")
    assert fused["expected_gain"] == pytest.approx(1 / (1 - report["shares"]["optimizer"]), rel=0.01)


@pytest.mark.slow
def test_a_script_that_crashes_gets_a_partial_report_and_keeps_its_exit_code():
    code, report, stderr = doctor("crash_at_step3.py")
    assert code == 1 and not report["stopped_by_doctor"]
    assert report["verdict"] is None and report["shares"] is None
    assert "RuntimeError" in report["error"] and "crash_at_step3.py:12" in report["error"]
    assert any("raised RuntimeError after 3 steps" in item for item in report["not_measured"])
    assert report["training"]["optimizer"] == "SGD"
    assert "Traceback" in stderr  # the script's own output passes through


@pytest.mark.slow
def test_a_command_that_is_not_there_is_one_line_and_exit_2():
    run = subprocess.run([sys.executable, "-m", "gpufill", "doctor", "--", "no-such-command-here", "x"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "'no-such-command-here' is not a command here" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def _report(pid: int, rank: int, *, launched: bool, trained: bool, error: str | None = None) -> dict:
    return {"pid": pid, "rank": rank, "launched_as_rank": launched, "stop_reason": "x", "steps_seen": 4 if trained else 0,
            "optimizers": [{"kind": "AdamW"}] if trained else [], "loaders": [], "error": error}


def test_a_launcher_that_failed_with_its_rank_is_not_counted_as_a_rank(tmp_path):
    from gpufill.script.launch import _training_reports

    # torchrun's own process raises ChildFailedError when a rank ends badly: its report has an error, and no RANK.
    reports = [_report(10, 0, launched=False, trained=False, error="ChildFailedError: rank 1 failed"),
               _report(11, 0, launched=True, trained=True), _report(12, 1, launched=True, trained=False, error="RuntimeError: gloo")]
    for report in reports:
        (tmp_path / f"report-{report['rank']}-{report['pid']}.json").write_text(json.dumps(report))
    problems: list[str] = []
    kept = _training_reports(tmp_path, problems)
    assert [r["pid"] for r in kept] == [11, 12] and problems == []
    # A plain script (no launcher, no RANK) is its own single rank.
    for path in tmp_path.glob("*.json"):
        path.unlink()
    (tmp_path / "report-0-20.json").write_text(json.dumps(_report(20, 0, launched=False, trained=True)))
    assert [r["pid"] for r in _training_reports(tmp_path, problems)] == [20]


@pytest.mark.serial  # measures time: two ranks' shares of loading and stepping decide the verdict
@pytest.mark.slow
def test_under_torchrun_each_rank_is_instrumented_and_rank_0_is_reported():
    command = [sys.executable, "-m", "gpufill", "doctor", "--steps", "4", "--json", "--",
               sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(USER_SCRIPTS / "ddp_train.py")]
    run = run_ranks(command, timeout=300)
    report = json.loads(run.stdout)
    assert run.returncode == 0 and report["stopped_by_doctor"], run.stderr
    assert report["ranks"] == 2 and report["training"]["world_size"] == 2  # the torchrun launcher is not counted as a rank
    assert report["training"]["optimizer"] == "AdamW" and report["training"]["loaders"][0]["at"].endswith("ddp_train.py:14")
    # A 2-layer MLP of width 64 whose gradients are all-reduced every step: a fixed cost per step.
    assert report["verdict"]["kind"] == "launch/overhead-bound"


@pytest.mark.slow
def test_a_script_that_never_steps_an_optimizer_says_what_could_not_be_measured():
    code, report, stderr = doctor("no_optimizer.py")
    assert code == 0 and not report["stopped_by_doctor"] and report["verdict"] is None
    assert report["stop_reason"] == "the script ended after 0 optimizer steps (wanted 3 warm-up + 5)"
    assert "step times: the script never called an optimizer's step()" in report["not_measured"]
    assert "FLOPs per step: fewer than two optimizer steps were seen" in report["not_measured"]
    assert any(item.startswith("GPU utilisation, memory and syncs: the training ran on") for item in report["not_measured"])
    assert report["training"]["loaders"][0]["batch_size"] == 64 and report["training"]["loaders"][0]["at"].endswith("no_optimizer.py:9")


@pytest.mark.gpu
def test_on_a_gpu_steps_are_timed_on_its_timeline_so_a_copy_that_waits_for_kernels_is_not_input_bound():
    code, report, _ = doctor("gpu_pageable_copies.py", steps=10)
    assert code == 0 and report["timed_on"] == "gpu"
    # A pageable .to('cuda') blocks the host until the queued matmuls finish; on the GPU the copy is a 4 MiB transfer.
    assert report["shares"]["copy"] + report["shares"]["data_wait"] < 0.2
    assert report["verdict"]["kind"] == "compute-bound"
    assert report["training"]["device"] == "cuda:0"



@pytest.mark.slow
def test_a_script_that_updates_its_parameters_by_hand_gets_a_verdict_and_its_step_times():
    code, report, _ = doctor("hand_updated.py", steps=6)
    assert code == 0 and report["stopped_by_doctor"] and report["stop_reason"] == "stopped after 3 warm-up and 6 measured steps"
    training = report["training"]
    embedding, lstm, linear = 200 * 64, 4 * 64 * (64 + 64) + 2 * 4 * 64, 64 * 200 + 200
    assert training["parameters"] == embedding + lstm + linear and training["steps"] == "backward (parameters updated by hand)"
    assert report["verdict"] is not None and report["step_ms"] > 0 and report["shares"]["backward"] > 0 and report["shares"]["optimizer"] == 0
    assert training["flops_per_step"] > 0
    assert any("torch.optim.SGD(model.parameters(), lr=lr, fused=True)" in f["what"] for f in report["findings"])
    assert any(item.startswith("the update's own time: the script updates its parameters by hand") for item in report["not_measured"])
