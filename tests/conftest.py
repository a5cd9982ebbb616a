"""Test hygiene (no leaked env vars, backend flags or threads) and the gpu marker."""

from __future__ import annotations

import os
import threading

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _hygiene():
    env = dict(os.environ)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    threads = torch.get_num_threads()
    python_threads = {t.ident for t in threading.enumerate()}
    yield
    changed = (set(env) ^ set(os.environ)) | {k for k in env if os.environ.get(k) != env[k]}
    # pytest, torch's compiler and scikit-learn (KMP_INIT_AT_FORK, on import) set their own variables.
    leaked_env = {k for k in changed if not k.lstrip("_").startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_", "KMP_"))}
    os.environ.clear()
    os.environ.update(env)
    assert not leaked_env, f"test leaked environment variables: {sorted(leaked_env)}"
    now = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    assert now == flags, "test leaked torch backend flags"
    torch.set_num_threads(threads)
    leftover = [t for t in threading.enumerate() if t.ident not in python_threads and t.is_alive() and not t.daemon]
    assert not leftover, f"test left threads running: {leftover}"
