"""A tracked run's end: the follower's last pass is bounded by the work left, never a fixed minute, and a follower past
its bound is stopped with the command that catches up."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufill.campaign.run import tracking
from gpufill.campaign.run.tracking import FINAL_PASS_S, PER_RUN_S, Follower, final_pass_s


def test_the_last_pass_is_given_its_fixed_part_and_half_a_second_per_trial_not_yet_exported():
    assert final_pass_s(12, None) == FINAL_PASS_S + 12 * PER_RUN_S == 21.0  # no pass finished yet: every trial is left
    assert final_pass_s(12, {"finished": 10, "error": None}) == FINAL_PASS_S + 2 * PER_RUN_S
    assert final_pass_s(12, {"finished": 12, "error": None}) == FINAL_PASS_S  # the report only
    assert final_pass_s(12, {"finished": 12, "error": "MLflow at x did not answer"}) == FINAL_PASS_S + 12 * PER_RUN_S
    assert final_pass_s(3, {"finished": 5, "error": None}) == FINAL_PASS_S  # a store's trials made stale since


def follower_of(command: list[str], workdir: Path) -> Follower:
    follower = Follower.__new__(Follower)  # the real one starts `gpufill export mlflow --follow`: here, a stand-in child
    follower.workdir, follower.uri, follower.started = workdir, "http://127.0.0.1:9", time.time()
    follower.process = subprocess.Popen(command, stdin=subprocess.PIPE)
    return follower


def test_a_follower_past_its_bound_is_stopped_and_the_run_says_how_to_catch_up(tmp_path):
    follower = follower_of([sys.executable, "-c", "import time; time.sleep(120)"], tmp_path)
    started = time.monotonic()
    said = follower.finish(4, wait_s=0.5)
    assert time.monotonic() - started < 60  # killed at its bound, not waited for
    assert follower.process.returncode is not None and follower.process.returncode < 0
    assert said == (f"tracking: MLflow at http://127.0.0.1:9 took over 0 s for the last export; the store keeps every result: "
                    f"gpufill export mlflow --workdir {tmp_path} --uri http://127.0.0.1:9")


def test_a_follower_that_ends_is_not_waited_on_and_its_last_pass_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "FINAL_PASS_S", 600.0)  # a bound the test would notice if it were a wait
    state = '{"uri": "http://127.0.0.1:9", "finished": 4, "created": 1, "already": 3, "experiment": "e", "error": null, "at": 4102444800.0}'
    script = f"import sys, pathlib; sys.stdin.read(); pathlib.Path({str(tmp_path / tracking.STATE_FILE)!r}).write_text({state!r})"
    follower = follower_of([sys.executable, "-c", script], tmp_path)
    started = time.monotonic()
    said = follower.finish(4)
    assert time.monotonic() - started < 60
    assert follower.process.returncode == 0
    assert said == "tracking: 4 of 4 finished trials in MLflow at http://127.0.0.1:9, experiment 'e'"  # what MLflow holds, not this pass


@pytest.mark.slow  # an interpreter importing MLflow and the report's libraries
def test_a_follower_whose_run_was_refused_before_its_store_ends_having_written_nothing(tmp_path):
    workdir = tmp_path / "never-made"
    follower = Follower(workdir, "http://127.0.0.1:9", "e")  # started as a run begins: before its workdir exists
    follower.close()  # the run was refused: no "go"; it ends at its stdin's end (or is stopped at FINAL_PASS_S on a stalled box)
    assert follower.process.returncode is not None
    assert not workdir.exists() and list(tmp_path.iterdir()) == []


def test_a_follower_killed_before_the_run_ended_is_said_with_what_reached_mlflow_and_the_catch_up(tmp_path):
    """bd3c8d8: after kill -9 of the follower the resumed run said "9 finished trials in MLflow (0 new runs this pass)"
    from an old state file while the store held 21, and no catch-up command."""
    stale = '{"uri": "http://127.0.0.1:9", "finished": 9, "created": 0, "already": 9, "experiment": "e", "error": null, "at": 1.0}'
    (tmp_path / tracking.STATE_FILE).write_text(stale)  # an earlier run's follower's last pass
    follower = follower_of([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], tmp_path)
    follower.process.wait(timeout=60)
    said = follower.finish(21)
    assert said == ("tracking: the export to MLflow was killed (SIGKILL) before the run ended; 0 of 21 finished trials reached it: "
                    f"the store keeps every result: gpufill export mlflow --workdir {tmp_path} --uri http://127.0.0.1:9")


def test_the_end_line_counts_what_mlflow_holds_of_the_store_and_names_the_catch_up_when_short():
    state = {"uri": "u", "finished": 21, "created": 2, "already": 7, "experiment": "e", "error": None, "at": 10.0,
             "refused": ["t1: INVALID_PARAMETER_VALUE: Invalid param name"]}
    said = tracking.summary(state, Path("w"), "u", finished=21, since=5.0)
    assert said == ("tracking: 9 of 21 finished trials in MLflow at u, experiment 'e'; 1 refused by MLflow (first: t1: "
                    "INVALID_PARAMETER_VALUE: Invalid param name); the rest: gpufill export mlflow --workdir w --uri u")
    assert tracking.summary(state, Path("w"), "u", finished=21, since=11.0).startswith("tracking: no export to MLflow at u finished")


def test_did_not_answer_is_said_only_for_a_connection_that_failed():
    from gpufill.tracking.mlflow_export import unreachable

    def wrapped() -> BaseException:
        try:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except OSError:
                raise RuntimeError("API request to http://x/api failed with exception Max retries exceeded") from None
        except RuntimeError as error:
            error.__context__ = ConnectionRefusedError(111, "Connection refused")  # as MLflow's client re-raises it
            return error

    assert unreachable(wrapped(), "http://x") == "MLflow at http://x did not answer (RuntimeError: API request to http://x/api failed with exception Max retries exceeded)"
    assert unreachable(ValueError("INVALID_PARAMETER_VALUE: bad key\nmore"), "http://x") == \
        "MLflow at http://x refused the export (ValueError: INVALID_PARAMETER_VALUE: bad key)"
