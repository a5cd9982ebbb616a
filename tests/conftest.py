"""Test hygiene (no leaked env vars, backend flags or threads) and the gpu marker."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
import torch

# A developer's own machine-wide tune cache (engine/measure/cache.py) would change what the tests measure.
os.environ.pop("GPUFILL_TUNE_CACHE", None)
# bf16 is chosen on a CPU with bf16 instructions when its first steps time faster, which depends on the load: a test that
# compares a fit with fp32 numbers would then pass or fail by the machine it runs on. Tests that exercise bf16 on a CPU
# build a Hardware with bf16_supported=True. Set before the hygiene fixture's snapshot, and inherited by subprocesses.
os.environ["GPUFILL_CPU_BF16"] = "0"


# Tests that time a training, pick threads or a plan by measuring, or compare a wall time with an estimate: `make test`
# runs them after the rest, alone on the machine (marker `serial`), and the rest two at a time (pytest-xdist). Of script/,
# watch, the script's ending (signals, deadlines) and the instrumentation count and wait; they measure nothing.
SERIAL = ("bench/", "script/test_bench_script.py", "script/test_doctor_script.py", "script/test_findings.py", "doctor/", "monitor/",
          "engine/test_many.py", "engine/test_many_limits.py", "engine/test_measured_plan.py", "engine/test_tune.py",
          "engine/test_tune_cache_shapes.py", "engine/test_plan.py", "engine/test_thread_watch.py",
          "campaign/run/test_estimate_accuracy.py", "campaign/executors/test_start_clock.py", "test_examples.py")
TESTS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    serial = pytest.mark.serial
    for item in items:
        if Path(item.fspath).resolve().relative_to(TESTS_DIR).as_posix().startswith(SERIAL):
            item.add_marker(serial)
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
