"""Test hygiene (no leaked env vars, backend flags or threads), the gpu marker and the fast loop's time limit."""

from __future__ import annotations

import gc
import os
import sys
import threading

import pytest
import torch

from tests.time_limit import pytest_addoption, pytest_runtest_makereport  # noqa: F401 - hooks: the fast loop's time held

# A developer's own machine-wide tune cache (engine/measure/cache.py) would change what the tests measure.
os.environ.pop("GPUFILL_TUNE_CACHE", None)
# bf16 is chosen on a CPU with bf16 instructions when its first steps time faster, which depends on the load: a test that
# compares a fit with fp32 numbers would then pass or fail by the machine it runs on. Tests that exercise bf16 on a CPU
# build a Hardware with bf16_supported=True. Set before the hygiene fixture's snapshot, and inherited by subprocesses.
os.environ["GPUFILL_CPU_BF16"] = "0"
# Under pytest-xdist, two workers share two cores: torch's default of a thread per core would oversubscribe them, and a
# tiny training beside a busy neighbour then waits on OpenMP's spinning threads (measured: 0.1 s alone, 33 s so). One
# thread per worker; the tests that measure (marker `serial`) run after, in one process, at torch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


# A test whose outcome a second busy process could flip (it times a training, picks by measuring, or compares a wall time
# with an estimate) carries `@pytest.mark.serial` where it is defined: `make test` runs those alone, after the rest.
# A whole campaign, a server or an interpreter of its own is `@pytest.mark.slow`: `make test-fast` leaves it out.


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _torch_compile_pool() -> set[int]:
    """Threads of inductor's compile pool: torch makes it on the first compile that misses its disk cache and keeps it for the
    life of the process, so a fresh cache (a clean CI clone) shows it in whichever test compiles first."""
    if "torch._inductor.async_compile" not in sys.modules:
        return set()
    from torch._inductor.async_compile import AsyncCompile

    if AsyncCompile.pool.cache_info().currsize == 0:
        return set()
    return {thread.ident for thread in AsyncCompile.pool()._threads}


@pytest.fixture(autouse=True)
def _collected_heap(request: pytest.FixtureRequest) -> None:
    """A test that times something starts from a collected heap: a full collection of the earlier tests' objects fires
    when it will, and inside a timed call it is the call's seconds (measured in the serial pass: 645,000 objects, 0.44 s,
    landing in a 0.07 s pack training that test_many checks the epochs of)."""
    if request.node.get_closest_marker("serial") is not None:
        gc.collect()


@pytest.fixture(autouse=True)
def _hygiene():
    env = dict(os.environ)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    threads = torch.get_num_threads()
    python_threads = {t.ident for t in threading.enumerate()}
    yield
    changed = (set(env) ^ set(os.environ)) | {k for k in env if os.environ.get(k) != env[k]}
    # pytest, torch's compiler, scikit-learn (KMP_INIT_AT_FORK, on import) and MLflow (its telemetry session) set their own variables.
    leaked_env = {k for k in changed if not k.lstrip("_").startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_", "KMP_", "MLFLOW_TELEMETRY_"))}
    os.environ.clear()
    os.environ.update(env)
    assert not leaked_env, f"test leaked environment variables: {sorted(leaked_env)}"
    now = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    assert now == flags, "test leaked torch backend flags"
    torch.set_num_threads(threads)
    known = python_threads | _torch_compile_pool()
    # MLflow keeps one thread pool per artifact store for the process's life (its own, not a leak of gpufill's).
    leftover = [t for t in threading.enumerate() if t.ident not in known and t.is_alive() and not t.daemon and not t.name.startswith("Mlflow")]
    assert not leftover, f"test left threads running: {leftover}"
