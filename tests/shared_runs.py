"""Finished campaigns made once per test session and shared by the tests that read them.

A whole campaign (the demo is a minute of CI) is worth running once, not once per test or per pytest-xdist
worker: `shared_folder` makes it in a folder every worker of the session sees, under a file lock, the first
worker to ask doing the work and the others waiting for it. A test that only reads the run reads it where it is;
a test that changes it (a resume, a report written into the workdir) works on `copy_of` it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from filelock import FileLock

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
DONE = ".made"
"""Written last into a shared folder: a folder without it was left half-made by a failed attempt and is made again."""


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temporary root, common to every xdist worker (each worker's basetemp is a folder inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`make(folder)` once per session, whichever worker asks first; the folder, made."""
    folder = session_root(tmp_path_factory) / f"shared-{name}"
    with FileLock(str(folder) + ".lock"):
        if not (folder / DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / DONE).write_text("")
    return folder


def copy_of(folder: Path, tmp_path: Path) -> Path:
    """A private copy of a shared folder, for a test that changes what it holds."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, symlinks=True, ignore=shutil.ignore_patterns(DONE))
    return copy


def demo_metrics_tool() -> ModuleType:
    """tools/demo_metrics.py as a module."""
    return load_script(ROOT / "tools" / "demo_metrics.py")


DEMO_WORKDIR = "gpufill-demo"
DEMO_STDOUT = "stdout.txt"


def finished_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo campaign run to its end once per session: a folder holding ./gpufill-demo (the workdir `gpufill demo`
    uses there) and what the run printed (stdout.txt). It runs as tools/demo_metrics.py runs it, a fresh `gpufill`
    process with the pack size pinned (the reference's: `gpufill demo` measures it by timing, and the measured size
    moves the neural metrics by rounding), so the same run serves the README's demo tests and the metrics reference."""
    tool = demo_metrics_tool()

    def make(folder: Path) -> None:
        (folder / DEMO_STDOUT).write_text(tool.run_demo(folder / DEMO_WORKDIR, tool.DEFAULT_PACK_SIZE))

    return shared_folder(tmp_path_factory, "demo", make)
