"""A tracked run's follower: the child process that copies finished trials to MLflow while the campaign runs.

With `tracking: {mlflow: URI}` (or `gpufill run --mlflow URI`) the run starts `gpufill export mlflow --follow`
(gpufill/tracking/mlflow_export.py) the moment it begins: the child imports MLflow and the report's libraries while
the run prepares, and starts exporting on the run's "go" (its store exists, `begin`); the campaign never waits on
the server, a server that is down is retried at the next pass, and the store stays the record. The child writes each
pass's outcome to WORKDIR/tracking-mlflow.json; when the run ends (or is killed) its stdin closes and it makes a last
pass, and the run's last lines say what reached the server. A run refused before its store (bad input) closes the
child's stdin before "go": it ends having written nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["STATE_FILE", "Follower", "read_state", "summary"]

STATE_FILE = "tracking-mlflow.json"


FINAL_PASS_S = 15.0
"""What a run gives the follower's last pass beyond its runs (the report rendered and uploaded; a loaded 2-core box's
worst seen), plus PER_RUN_S per finished trial the follower has not exported yet: a bound on the work left, not a
wait (the run returns the moment the follower ends)."""
INTERRUPTED_PASS_S = 5.0
"""An interrupted run's wait for the follower's last pass: a Ctrl-C ends the command within 10 s (docs/guarantees.md),
whatever the server does (a frozen one held it 12.2 s with 10 s here)."""
PER_RUN_S = 0.5
"""One trial's export (three requests) to a slow server, with room to spare."""
FOLLOWER_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
"""A follower's client gives up on a request in 10 s with no retries (MLflow's default retries for minutes):
the next pass tries again. It prints no "View run" line per trial into the tracking log."""


class Follower:
    """The child process that exports a running campaign (`follow`); `finish` ends it and says what reached MLflow."""

    def __init__(self, workdir: Path, uri: str, experiment: str | None):
        command = [sys.executable, "-m", "gpufill", "export", "mlflow", "--workdir", str(workdir), "--uri", uri, "--follow"]
        if experiment:
            command += ["--experiment", experiment]
        self.workdir, self.uri = workdir, uri
        self.started = time.time()
        """A state file older than this is an earlier run's follower's, not this one's."""
        # Its own session: Ctrl-C stops the campaign, and the follower then ends on its own (stdin closes). Its output
        # goes to WORKDIR/logs/tracking.log once it has begun (the workdir may not exist yet).
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env={**os.environ, **FOLLOWER_ENV}, start_new_session=True)

    def begin(self) -> None:
        """The run's store exists: start exporting."""
        with contextlib.suppress(OSError):  # it died: `finish` says the export did not finish
            self.process.stdin.write(b"go\n")  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]

    def close(self) -> None:
        """End a follower that never began (the run was refused first): it exits at its stdin's end, writing nothing."""
        if self.process.poll() is None:
            self._ended_within(FINAL_PASS_S)

    def finish(self, finished: int, wait_s: float | None = None) -> str:
        """Close its stdin (its last pass begins), wait up to `wait_s` (default: the bound on the work left of
        `finished` trials, `final_pass_s`), and return one line for the run's end: what MLflow holds of the `finished`
        trials the store has, and the catch-up command wherever that is not all of them."""
        catch_up = f"gpufill export mlflow --workdir {self.workdir} --uri {self.uri}"
        died = self.process.poll()  # ended before its stdin closed: killed, or crashed
        if wait_s is None:
            wait_s = final_pass_s(finished, read_state(self.workdir))
        if died is None and not self._ended_within(wait_s):
            return (f"tracking: MLflow at {self.uri} took over {wait_s:.0f} s for the last export; the store keeps every result: {catch_up}")
        if died is not None or self.process.returncode != 0:
            code = self.process.returncode
            how = f"was killed ({signal.Signals(-code).name})" if code is not None and code < 0 and -code in signal.valid_signals() else f"exited with code {code}"
            state = read_state(self.workdir)
            held = _held(state, self.uri, self.started)
            return (f"tracking: the export to MLflow {how} before the run ended; {held} of {finished} finished trials reached it: "
                    f"the store keeps every result: {catch_up}")
        return summary(read_state(self.workdir), self.workdir, self.uri, finished=finished, since=self.started)

    def _ended_within(self, wait_s: float) -> bool:
        """Close its stdin and wait up to `wait_s` for it to end; False: it was still running, and is killed."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return False
        return True


def final_pass_s(finished: int, state: Mapping[str, Any] | None) -> float:
    """How long the last pass may take: its fixed part and each of the `finished` trials the last `state` lacks."""
    exported = int(state.get("finished") or 0) if state and not state.get("error") else 0
    return FINAL_PASS_S + PER_RUN_S * max(0, finished - exported)


def summary(state: Mapping[str, Any] | None, workdir: Path, uri: str, *, finished: int, since: float = 0.0) -> str:
    """One line: how many of the store's `finished` trials MLflow holds after the last export pass (one written after
    `since`), or that it could not and how to catch up."""
    catch_up = f"gpufill export mlflow --workdir {workdir} --uri {uri}"
    if state is None or state.get("uri") != uri or float(state.get("at") or 0) < since:
        return f"tracking: no export to MLflow at {uri} finished; the store keeps every result: {catch_up}"
    if state.get("error"):
        return f"tracking: {state['error']}; the store keeps every result: once it answers, {catch_up}"
    held = _held(state, uri, since)
    line = f"tracking: {held} of {finished} finished trials in MLflow at {uri}, experiment {state['experiment']!r}"
    refused = state.get("refused") or []
    if refused:
        line += f"; {len(refused)} refused by MLflow (first: {refused[0]})"
    return line if held >= finished else f"{line}; the rest: {catch_up}"


def _held(state: Mapping[str, Any] | None, uri: str, since: float) -> int:
    """Finished trials MLflow held after the follower's last pass of this run (0: none finished)."""
    if not state or state.get("uri") != uri or state.get("error") or float(state.get("at") or 0) < since:
        return 0
    return int(state.get("created") or 0) + int(state.get("already") or 0)


def read_state(workdir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The following export's last pass (None: none ran or its file is unreadable)."""
    try:
        return json.loads((Path(workdir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
