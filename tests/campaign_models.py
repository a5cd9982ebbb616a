"""Model factories for campaign tests, used as `tests.campaign_models:NAME` in campaign files."""

from __future__ import annotations

import json
import os
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


class _KillOnFirstTry(_Linear):
    def __init__(self, marker: str, *shape: int):
        super().__init__(*shape)
        self.marker = Path(marker)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.marker.exists():  # first attempt: die like a segfault / OOM kill would
            self.marker.write_text("killed once")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


def killed_on_first_try(n_features: int, lookback: int, horizon: int, *, marker: str = "") -> nn.Module:
    return _KillOnFirstTry(marker, n_features, lookback, horizon)


class _Raises(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("this model always fails")


def always_raises(n_features: int, lookback: int, horizon: int) -> nn.Module:
    return _Raises(n_features, lookback, horizon)


class _ThreadProbe(_Linear):
    def __init__(self, report_dir: str, *shape: int):
        super().__init__(*shape)
        self.report_dir = Path(report_dir)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        report = {"pid": os.getpid(), "torch_threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS")}
        (self.report_dir / f"{os.getpid()}.json").write_text(json.dumps(report))
        return super().forward(x)


def thread_probe(n_features: int, lookback: int, horizon: int, *, report_dir: str = "") -> nn.Module:
    return _ThreadProbe(report_dir, n_features, lookback, horizon)


class _Gated(_Linear):
    def __init__(self, gate: str, *shape: int):
        super().__init__(*shape)
        self.gate = Path(gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while not self.gate.exists():  # holds its trial (and so the run) until the test opens the gate
            time.sleep(0.05)
        return super().forward(x)


def gated(n_features: int, lookback: int, horizon: int, *, gate: str = "") -> nn.Module:
    return _Gated(gate, n_features, lookback, horizon)



class _StallsOnFirstTry(_Linear):
    def __init__(self, marker: str, how: str, *shape: int):
        super().__init__(*shape)
        self.marker, self.how = Path(marker), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.marker.exists():  # first attempt: hang like a deadlock (stopped) or a runaway loop (sleeping)
            self.marker.write_text(str(os.getpid()))
            if self.how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)  # the whole process, heartbeat thread included
            else:
                time.sleep(600)  # the process stays alive and keeps sending heartbeats
        return super().forward(x)


def stalls_on_first_try(n_features: int, lookback: int, horizon: int, *, marker: str = "", how: str = "stop") -> nn.Module:
    return _StallsOnFirstTry(marker, how, n_features, lookback, horizon)


def tagged(n_features: int, lookback: int, horizon: int, *, tag: str = "") -> nn.Module:
    """A linear model with a text parameter that only names it (the hostile-input tests put `$` in it)."""
    return _Linear(n_features, lookback, horizon)


_CACHED: dict[tuple[int, int, int], nn.Module] = {}
_SHARED_HEAD = nn.Linear(1, 1)


def cached_linear(n_features: int, lookback: int, horizon: int) -> nn.Module:
    """A factory that caches its module per shape: each call hands back the same (trained) module."""
    return _CACHED.setdefault((n_features, lookback, horizon), _Linear(n_features, lookback, horizon))


def shared_part(n_features: int, lookback: int, horizon: int) -> nn.Module:
    """A new module each call that holds one submodule shared by all of them."""
    return nn.Sequential(nn.Flatten(), nn.Linear(n_features * lookback, 1), _SHARED_HEAD, nn.Linear(1, horizon))


def any_keywords(n_features: int, lookback: int, horizon: int, **settings: object) -> nn.Module:
    """Takes any keyword (a user's factory with **kwargs): its grid keys are whatever the campaign file writes."""
    return _Linear(n_features, lookback, horizon)
