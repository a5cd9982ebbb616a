"""Model factories for the integrity tests (test_integrity.py, test_hung_trials.py), as `tests.integrity_models:NAME`."""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path

import torch
from torch import nn


class _Linear(nn.Module):
    def __init__(self, n_features: int, lookback: int, horizon: int):
        super().__init__()
        self.head = nn.Linear(n_features * lookback, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1))


class _CrashesOnFirstTry(_Linear):
    def __init__(self, marker: str, how: str, *shape: int):
        super().__init__(*shape)
        self.marker, self.how = Path(marker), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            if self.how == "segv":  # the trial's own crash (its code faulted); no core file left behind
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                os.kill(os.getpid(), signal.SIGSEGV)
            else:  # killed from outside, as kill -9 or the OOM killer would; "zygote": its lane's zygote killed first
                if self.how == "zygote":
                    zygote = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
                    assert b"gpufill.campaign.worker.zygote" in zygote, "this worker was not forked by a zygote"
                    os.kill(os.getppid(), signal.SIGKILL)
                    while os.getppid() != 1 and Path(f"/proc/{os.getppid()}/cmdline").read_bytes() == zygote:  # until it is gone
                        time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


def crashes_on_first_try(n_features: int, lookback: int, horizon: int, *, marker: str = "", how: str = "segv") -> nn.Module:
    return _CrashesOnFirstTry(marker, how, n_features, lookback, horizon)


class _Held(_Linear):
    """Writes its worker's pid to `pid_file`, then trains only once `gate` exists."""

    def __init__(self, gate: str, pid_file: str, *shape: int):
        super().__init__(*shape)
        self.gate, self.pid_file = Path(gate), Path(pid_file)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gate.exists():
            self.pid_file.write_text(str(os.getpid()))
        while not self.gate.exists():
            time.sleep(0.05)
        return super().forward(x)


def held(n_features: int, lookback: int, horizon: int, *, gate: str = "", pid_file: str = "") -> nn.Module:
    return _Held(gate, pid_file, n_features, lookback, horizon)
