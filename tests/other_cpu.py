"""This machine computing as another CPU would (issue 34): numpy and OpenBLAS pick their kernels by CPU feature,
so generated values differ in the last bit from one machine kind to the next. Each setting below forces other
kernels than this CPU's best, in a process of its own: a stand-in for another machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())


def numpy_dispatch_found() -> list[str]:
    """The SIMD targets numpy dispatches to on this CPU beyond its baseline (what NPY_DISABLE_CPU_FEATURES turns off)."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as umath  # type: ignore[no-redef]
    return [name for name in umath.__cpu_dispatch__ if umath.__cpu_features__.get(name)]


def kernel_settings() -> dict[str, dict[str, str]]:
    """Environments that make this machine compute as another CPU would; each is a stand-in for a machine kind."""
    baseline_blas = "Prescott" if platform.machine().lower() in ("x86_64", "amd64") else "ARMV8"  # SSE3: every x86-64 has it
    numpy_baseline = {"NPY_DISABLE_CPU_FEATURES": " ".join(numpy_dispatch_found())}
    return {
        "as found": {},
        "numpy baseline SIMD": numpy_baseline,
        "OpenBLAS baseline kernel": {"OPENBLAS_CORETYPE": baseline_blas},
        "all baseline": {**numpy_baseline, "OPENBLAS_CORETYPE": baseline_blas, "ATEN_CPU_CAPABILITY": "default"},
    }


def run_python(*argv: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    """`python ARGV...` with this checkout's gpufill and `env` on top of this process's environment."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env={**os.environ, **env, "PYTHONPATH": path}, timeout=300, check=False)
    assert not check or done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
