"""A tracked run's follower: the child process that copies finished trials to MLflow while the campaign runs.

With `tracking: {mlflow: URI}` (or `gpufill run --mlflow URI`) the run starts `gpufill export mlflow --follow`
(gpufill/tracking/mlflow_export.py) beside its scheduler: the campaign never waits on the server, a server that is
down is retried at the next pass, and the store stays the record. The child writes each pass's outcome to
WORKDIR/tracking-mlflow.json; when the run ends (or is killed) its stdin closes and it makes a last pass, and the
run's last lines say what reached the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["STATE_FILE", "Follower", "read_state", "summary"]

STATE_FILE = "tracking-mlflow.json"


FINAL_PASS_S = 60.0
"""How long a run waits, once its trials are done, for the follower's last pass (the report included)."""
FOLLOWER_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
"""A follower's client gives up on a request in 10 s with no retries (MLflow's default retries for minutes):
the next pass tries again. It prints no "View run" line per trial into the tracking log."""


class Follower:
    """The child process that exports a running campaign (`follow`); `finish` ends it and says what reached MLflow."""

    def __init__(self, workdir: Path, uri: str, experiment: str | None, log_path: Path):
        from gpufill.files import open_append

        command = [sys.executable, "-m", "gpufill", "export", "mlflow", "--workdir", str(workdir), "--uri", uri, "--follow"]
        if experiment:
            command += ["--experiment", experiment]
        self.workdir, self.uri = workdir, uri
        with open_append(log_path, field="tracking") as log:
            # Its own session: Ctrl-C stops the campaign, and the follower then ends on its own (stdin closes).
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **FOLLOWER_ENV}, start_new_session=True)

    def finish(self, wait_s: float = FINAL_PASS_S) -> str:
        """Close its stdin (its last pass begins), wait up to `wait_s`, and return one line for the run's end."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return (f"tracking: MLflow at {self.uri} took over {wait_s:.0f} s for the last export; the store keeps every result: "
                    f"gpufill export mlflow --workdir {self.workdir} --uri {self.uri}")
        return summary(read_state(self.workdir), self.workdir, self.uri)


def summary(state: Mapping[str, Any] | None, workdir: Path, uri: str) -> str:
    """One line: what the last export pass brought to MLflow, or that it could not and how to catch up."""
    catch_up = f"gpufill export mlflow --workdir {workdir} --uri {uri}"
    if state is None or state.get("uri") != uri:
        return f"tracking: no export to MLflow at {uri} finished; the store keeps every result: {catch_up}"
    if state.get("error"):
        return f"tracking: {state['error']}; the store keeps every result: once it answers, {catch_up}"
    return (f"tracking: {state['finished']} finished trials in MLflow at {uri}, experiment {state['experiment']!r} "
            f"({state['created']} new runs this pass)")


def read_state(workdir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The following export's last pass (None: none ran or its file is unreadable)."""
    try:
        return json.loads((Path(workdir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
