"""A real MLflow tracking server for the tracking tests: `mlflow server` on 127.0.0.1 with a SQLite backend in a
temporary folder, started, stopped and started again on the same store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 300.0
"""A server imports MLflow's web stack: ~10 s on 2 idle cores, a minute or more on a loaded one."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class MlflowServer:
    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> MlflowServer:
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                   "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}", "--artifacts-destination", str(self.folder / "artifacts")]
        log = (self.folder / "server.log").open("ab")
        # No job execution: MLflow would start a pool of huey consumers (each an interpreter importing MLflow, ~3 CPU-s)
        # for its GenAI jobs, which tracking never uses.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(command, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"mlflow server did not answer within {START_TIMEOUT_S} s: {(self.folder / 'server.log').read_text()[-3000:]}")

    def stop(self) -> None:
        """The server and its workers (its own process group), waited for: its port is closed afterwards."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
