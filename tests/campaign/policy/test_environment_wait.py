"""How long a run waits for its environment (issue 37 item 11): a data file that stays changed stops the wait after
CHANGED_PATIENCE_S, not after the PATIENCE_S a missing file or a full disk gets, and says what to run."""

from __future__ import annotations

from gpufill.campaign.policy.environment import CHANGED, CHANGED_PATIENCE_S, PATIENCE_S, EnvironmentWait

CHANGED_ERROR = f"the data of project p000 {CHANGED} (fingerprint abc now, def in the trial's id): not trained on data its id does not name"
MISSING_ERROR = "the data could not be loaded: data.path: no such file"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def failing_for(error: str, seconds: float) -> EnvironmentWait:
    clock = Clock()
    wait = EnvironmentWait(clock=clock, trial_limit=10_000)
    for step in range(int(seconds) + 1):
        clock.now = float(step)
        wait.failed(f"t{step % 8}", error)
    return wait


def test_data_that_stays_changed_stops_the_wait_after_a_minute_with_the_command_to_run():
    assert CHANGED_PATIENCE_S == 60.0 < PATIENCE_S
    assert not failing_for(CHANGED_ERROR, CHANGED_PATIENCE_S - 1).exhausted()
    wait = failing_for(CHANGED_ERROR, CHANGED_PATIENCE_S + 1)
    assert wait.exhausted()
    line = wait.why_stopped(7)
    assert line.startswith("the data stayed changed for 60 s (replaced, not being rewritten): 7 trials registered")
    assert "run the same command again" in line and "fingerprint abc now" in line and "\n" not in line


def test_a_missing_file_still_gets_the_whole_patience():
    wait = failing_for(MISSING_ERROR, CHANGED_PATIENCE_S + 1)
    assert not wait.exhausted()
    wait = failing_for(MISSING_ERROR, PATIENCE_S + 1)
    assert wait.exhausted() and wait.why_stopped(3).startswith("the environment failed every trial for 300 s: 3 trials stay pending")


def test_a_success_forgets_the_change_and_the_worker_says_the_words_the_wait_looks_for():
    clock = Clock()
    wait = EnvironmentWait(clock=clock)
    wait.failed("t0", CHANGED_ERROR)
    clock.now = 30.0
    wait.succeeded()  # the file was restored: a trial finished
    clock.now = 40.0
    wait.failed("t1", CHANGED_ERROR)
    clock.now = 95.0  # 95 s after the first change, 55 s after the streak's
    assert not wait.exhausted()
    clock.now = 101.0
    assert wait.exhausted()
    from importlib.util import find_spec
    from pathlib import Path

    worker_source = Path(find_spec("gpufill.campaign.worker.worker").origin).read_text()
    assert "{environment.CHANGED} (fingerprint" in worker_source  # one phrase, written by the worker, read here
