"""`gpufill bench -- COMMAND` on plain PyTorch scripts (tests/user_scripts/): each speed-up switched on
from outside is in effect inside the script, rates and ratios add up, code changes name their line,
and a command that cannot be measured is one line."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from tests.helpers import USER_SCRIPTS


def bench(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "gpufill", "bench", *args, "--", sys.executable, str(USER_SCRIPTS / script)]
    # One torch thread: on a loaded box more would make the scripts thread-oversubscribed (test_threads.py), not these tests' subject.
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_each_speed_up_is_in_effect_inside_the_script_and_the_ratios_add_up():
    run = bench("item_every_step.py", "--steps", "8", "--try", "tf32", "--try", "cudnn_benchmark", "--try", "allocator", "--json")
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    rows = {row["variant"]: row for row in record["variants"]}
    assert list(rows) == ["as is", "tf32", "cudnn_benchmark", "allocator"]
    assert record["unit"] == "steps/s" and record["training_device"] == "cpu" and record["steps"] == 8  # no DataLoader: no batch size seen
    # The flags as the script saw them at its end: each variant switched on what it names, and nothing else.
    flags = {name: row["flags_in_effect"] for name, row in rows.items()}
    assert (flags["as is"]["tf32_matmul"], flags["tf32"]["tf32_matmul"], flags["cudnn_benchmark"]["tf32_matmul"]) == (False, True, False)
    assert (flags["as is"]["cudnn_benchmark"], flags["cudnn_benchmark"]["cudnn_benchmark"]) == (False, True)
    assert flags["allocator"]["cuda_alloc_conf"] == "expandable_segments:True" and flags["as is"]["cuda_alloc_conf"] is None
    as_is = rows["as is"]
    assert len(as_is["runs"]) == 2 and as_is["rate"] == pytest.approx(statistics.median(as_is["runs"]), rel=1e-3)  # first and closing run
    assert record["noise"] == pytest.approx(max(as_is["runs"]) / min(as_is["runs"]) - 1, abs=1e-3)
    for name in ("tf32", "cudnn_benchmark", "allocator"):
        assert rows[name]["vs_as_is"] == pytest.approx(rows[name]["rate"] / as_is["rate"], rel=1e-3, abs=5e-5)  # stored to 4 places
        assert rows[name]["note"] == "CUDA only: no effect expected on cpu"
        assert rows[name]["within_noise"] == (abs(rows[name]["vs_as_is"] - 1) <= record["noise"])
    # The script's own fixes, each at its line; its per-step item() is no finding on a CPU (a host read waits for nothing there).
    changes = record["code_changes"]
    (fused,) = [c for c in changes if "fused=True" in c["what"]]
    assert fused["what"].startswith("SGD(..., fused=True) at ") and fused["where"].endswith("item_every_step.py:9") and fused["expected_gain"] > 1
    assert not any("item()" in c["what"] for c in changes)
    batch = [c for c in changes if "no DataLoader seen" in c["what"]]  # when the verdict is overhead-bound: the batch, at the backward's line
    assert all(c["where"].endswith("item_every_step.py:15") for c in batch) and len(changes) == 1 + len(batch)
    assert record["torch"] and record["date"].startswith("20") and record["device_type"] == "cpu"


@pytest.mark.slow
def test_on_a_cpu_the_cuda_speed_ups_are_not_run_and_the_loader_fix_names_its_line(tmp_path):
    out = tmp_path / "bench.json"
    run = bench("loader_bound.py", "--steps", "5", "--out", str(out))
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    assert [row["variant"] for row in record["variants"]] == ["as is", "one_thread"] and record["unit"] == "samples/s"
    assert len(record["skipped"]) == 4 and all("CUDA only, and the training runs on cpu" in line for line in record["skipped"])
    assert record["variants"][1]["env"] == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert record["code_changes"][0]["what"].startswith("DataLoader(num_workers=0") and "loader_bound.py:22" in record["code_changes"][0]["what"]
    assert "not run: tf32: CUDA only" in run.stdout and "loader_bound.py:22" in run.stdout and "samples/s" in run.stdout


@pytest.mark.slow
def test_a_command_that_cannot_be_measured_is_one_line():
    crashed = bench("crash_at_step3.py")
    assert crashed.returncode == 1 and "Traceback" in crashed.stderr  # the script's own error shows
    assert crashed.stdout == "" and crashed.stderr.strip().splitlines()[-1] == (
        "gpufill bench: the command was not measured: the script raised RuntimeError after 3 steps (exit code 1)")
    too_short = bench("item_every_step.py", "--steps", "500")
    assert too_short.returncode == 2 and too_short.stderr.strip().splitlines()[1:] == [  # after how many times the command would run
        "gpufill bench: the command was not measured: the script ended after 200 optimizer steps (wanted 3 warm-up + 500) (exit code 0); "
        "fix: fewer --steps than 500, or a longer run"]
    unknown = bench("item_every_step.py", "--try", "amp", timeout=240)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr and "--try amp is not a speed-up" in unknown.stderr


@pytest.mark.gpu
def test_on_a_gpu_every_speed_up_is_measured_against_the_script_as_it_is():
    run = bench("cuda_training.py", "--steps", "10", "--json", timeout=600)
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    rows = {row["variant"]: row for row in record["variants"]}
    assert list(rows) == ["as is", "tf32", "cudnn_benchmark", "allocator", "all"] and record["skipped"] == []
    assert record["unit"] == "samples/s" and record["training_device"].startswith("cuda")
    assert rows["all"]["flags_in_effect"]["tf32_matmul"] and rows["all"]["flags_in_effect"]["cudnn_benchmark"]
    assert all(row["rate"] > 0 and row["vs_as_is"] == pytest.approx(row["rate"] / rows["as is"]["rate"], rel=1e-3, abs=5e-5) for row in rows.values())
    assert any("cuda_training.py:29" in change["what"] for change in record["code_changes"])


@pytest.mark.slow
def test_impossible_steps_are_one_line_before_anything_runs():
    run = bench("item_every_step.py", "--steps", "0", timeout=240)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "--steps 0" in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_one_thread_is_measured_on_a_cpu_and_a_script_that_sets_its_own_count_is_told():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}  # torch's own default as is
    command = [sys.executable, "-m", "gpufill", "bench", "--steps", "2", "--repeats", "1", "--json", "--", sys.executable,
               str(USER_SCRIPTS / "item_every_step.py")]  # the lightest script that leaves torch's threads as they are
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    rows = {row["variant"]: row for row in json.loads(run.stdout)["variants"]}
    assert rows["as is"]["flags_in_effect"]["torch_threads"] == len(os.sched_getaffinity(0))
    assert rows["one_thread"]["flags_in_effect"]["torch_threads"] == 1 and rows["one_thread"]["note"] == ""
    assert rows["one_thread"]["vs_as_is"] == pytest.approx(rows["one_thread"]["rate"] / rows["as is"]["rate"], rel=1e-3, abs=5e-5)
    pinned = bench("oversubscribed.py", "--steps", "3", "--repeats", "1", "--try", "one_thread", "--json")
    assert pinned.returncode == 0, pinned.stderr
    one = {row["variant"]: row for row in json.loads(pinned.stdout)["variants"]}["one_thread"]
    assert one["flags_in_effect"]["torch_threads"] == 4 and "sets its own thread count (torch.set_num_threads(4))" in one["note"]
