"""The inline executor (campaign/executors/inline.py): tasks run in the scheduler's own process, in submission order,
with their lane's thread count; a task that raises is the crash of its worker; the command line offers it."""

from __future__ import annotations

import re

import torch

from gpufill.campaign.executors import LaneRequest, make_executor
from gpufill.campaign.executors.base import Crashed, Finished
from gpufill.campaign.policy.messages import Started, Task, TaskEnded
from gpufill.campaign.spec.spec import load_campaign
from tests.helpers import a_trial, run_cli, write_campaign


def _executor(tmp_path):  # noqa: ANN202
    spec = load_campaign(write_campaign(tmp_path, models="mlp: {hidden_size: 8}\n  linear: {}"))
    executor = make_executor("inline", spec=spec, base_dir=str(tmp_path), workdir=tmp_path / "work")
    lanes, _ = executor.plan(LaneRequest(kinds=frozenset({"neural", "classical"}), gpu_slots="auto", cpu_slots=2, threads_per_trial=1,
                                         memory_margin=0.85, where="tiny.yaml"))
    return executor, lanes


class _Runner:
    """A lane's TrialRunner stand-in: says which trial started, records torch's thread count, then returns or raises."""

    def __init__(self, raises: bool):
        self.raises, self.on_progress, self.threads = raises, None, []

    def run_task(self, task):  # noqa: ANN001, ANN201
        self.on_progress(Started((task.trials[0].trial_id,)))
        self.threads.append(torch.get_num_threads())
        if self.raises:
            raise RuntimeError("the pack could not be built")
        return TaskEnded()


def test_tasks_run_in_submission_order_with_the_lane_s_threads_and_a_raise_is_the_worker_s_crash(tmp_path):
    executor, lanes = _executor(tmp_path)
    threads_before = torch.get_num_threads()
    executor.start(lanes)
    lane = lanes[0]
    first, second = executor.idle(lane)[:2]
    assert first.ready and second.ready and executor.busy() == []
    executor.runners[lane.name] = runner = _Runner(raises=False)
    executor.submit(first, Task((a_trial("t1"),)))
    executor.submit(second, Task((a_trial("t2"),)))
    assert executor.busy() == [first, second]
    done = executor.poll(timeout=0.0)
    assert len(done) == 1 and isinstance(done[0], Finished) and done[0].worker is first and first.task is None
    assert first.started == {"t1"} and runner.threads == [lane.threads]
    executor.runners[lane.name] = _Runner(raises=True)
    crashed = executor.poll(timeout=0.0)
    assert len(crashed) == 1 and isinstance(crashed[0], Crashed) and crashed[0].worker is second and not crashed[0].environment
    assert crashed[0].reason.startswith("the task raised RuntimeError: the pack could not be built") and second.started == {"t2"}
    assert executor.poll(timeout=0.0) == [] and executor.busy() == []
    executor.shutdown()
    assert torch.get_num_threads() == threads_before


def test_gpufill_run_executor_inline_trains_every_trial_in_the_command_s_process(tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", write_campaign(tmp_path), "--workdir", tmp_path / "work", "--executor", "inline")
    assert code == 0, err
    assert "done 4, failed 0, pending 0 of 4 trials" in out and "0 worker crashes" in out
    marks = re.findall(r"start-up: (.+?) at [\d.]+ s", (tmp_path / "work" / "logs" / "run-1.log").read_text())
    assert marks[marks.index("workers started"):] == ["workers started", "first worker ready", "first task done", "last task done", "workers stopped"]
