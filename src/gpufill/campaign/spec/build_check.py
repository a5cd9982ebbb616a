"""Every grid point of a campaign's built-in families built once before its run, in a child process.

Building a point is what proves a value wrong (a transformer's d_model that its heads do not divide), and building
needs torch. The scheduler never imports torch: it reads the campaign file with the builds `deferred()` and writes
them down (`BuildCheck.prepare`). Who builds them: the first lane's zygote, which imports torch for the workers
anyway, forks a child for them as soon as its imports are done (`answered_by`: one torch import on the machine, not
two at once); else (no zygote: Ray, Slurm, fresh workers) a child of its own, started by `wait`. The
scheduler waits for the verdict only when the data is loaded and the lanes are planned (`wait`), before anything is
written. A bad value is the same one line at its `file:line` as when the file is checked in one process
(`gpufill check`, `load_campaign`).

    python -m gpufill.campaign.spec.build_check IN OUT     (the child: IN lists the builds, OUT gets the first error)
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufill.campaign.spec.grid_checks import check_builds, corner_axes
from gpufill.campaign.spec.search_spec import Range
from gpufill.campaign.spec.spec_errors import LocatedError, dotted, line_of
from gpufill.errors import InputError
from gpufill.forecasting.models import registry

WAIT_S = 300.0
"""A builder that takes longer (a stalled machine) is given up on: the builds run in the scheduler instead."""
POLL_S = 0.02

_pending: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar("gpufill_deferred_builds", default=None)


def wanted() -> bool:
    """Whether a child is worth starting: not in a process that has torch already (the Python API, a notebook, a
    test), where it would import torch a second time only to build what this process builds in milliseconds."""
    return "torch" not in sys.modules


@contextlib.contextmanager
def deferred() -> Iterator[list[dict[str, Any]]]:
    """Within the block, `check_or_defer` lists the builds of built-in families instead of running them."""
    builds: list[dict[str, Any]] = []
    token = _pending.set(builds)
    try:
        yield builds
    finally:
        _pending.reset(token)


def check_or_defer(family: str, axes: Mapping[str, list[Any] | Range], *, lookback: int, horizon: int,
                   outputs_per_step: Sequence[int] = (1,)) -> None:
    """`check_builds` now, or listed for the child inside `deferred()` (a user's `module:factory` is built in its own
    child already: campaign/spec/user_models.py)."""
    pending = _pending.get()
    build = {"family": family, "axes": corner_axes(axes), "lookback": lookback, "horizon": horizon, "outputs_per_step": list(outputs_per_step)}
    if pending is None or registry.is_remembered(family) or not _plain(build):
        check_builds(family, axes, lookback=lookback, horizon=horizon, outputs_per_step=outputs_per_step)
    else:
        pending.append(build)


class BuildCheck:
    """A campaign file's deferred grid points and who builds them; `wait` raises the first problem at its line."""

    def __init__(self, builds: list[dict[str, Any]], where: str, lines: Mapping[tuple[str | int, ...], int]):
        self.builds, self.where, self.lines = builds, where, lines
        self.folder = tempfile.TemporaryDirectory(prefix="gpufill-builds-")
        self.request, self.answer = Path(self.folder.name) / "in.json", Path(self.folder.name) / "out.json"
        self.request.write_text(json.dumps(builds))
        self.process: subprocess.Popen[bytes] | None = None
        """Our own child, if started."""
        self.helper: Any = None
        """Another process whose fork builds them (a zygote): its `poll()` says whether it still runs."""

    @classmethod
    def prepare(cls, builds: list[dict[str, Any]], where: str, lines: Mapping[tuple[str | int, ...], int]) -> BuildCheck | None:
        """The builds written down, nothing started (None when there are none); `where` and `lines` place an error."""
        return cls(builds, where, lines) if builds else None

    def answered_by(self, helper: Any) -> None:
        """`helper` (a process with `poll()`) forks the builder: it writes ANSWER.pid as it starts and ANSWER when done."""
        self.helper = helper

    def start_child(self) -> None:
        # stdin /dev/null: nothing in it reads the user's terminal; a session of its own: a Ctrl-C reaches the scheduler only.
        self.process = subprocess.Popen([sys.executable, "-m", "gpufill.campaign.spec.build_check", str(self.request), str(self.answer)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def wait(self) -> None:
        """Return once every point built; else raise the first problem as one line at its `file:line`. A builder that
        could not answer (killed, stalled past WAIT_S) is replaced by building here: the check is never skipped."""
        if self.process is None and self.helper is None:
            self.start_child()
        try:
            found = self._from_child() if self.process is not None else self._from_helper()
        finally:
            self.folder.cleanup()
        if found is None:
            try:
                for build in self.builds:
                    check_builds(build["family"], build["axes"], lookback=build["lookback"], horizon=build["horizon"],
                                 outputs_per_step=build.get("outputs_per_step", (1,)))
            except LocatedError as error:
                raise self._located(error.loc, error.problem, error.fix) from None
            return
        if found.get("error"):
            error = found["error"]
            raise self._located(tuple(error["loc"]), error["problem"], error["fix"])

    def _from_child(self) -> dict[str, Any] | None:
        assert self.process is not None
        try:
            self.process.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            return None
        return json.loads(self.answer.read_text()) if self.process.returncode == 0 and self.answer.exists() else None

    def _from_helper(self) -> dict[str, Any] | None:
        """The zygote's fork's answer: None once the zygote or its fork is gone without one, or after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        started = self.answer.with_suffix(".pid")
        while time.monotonic() < deadline:
            if self.answer.exists():
                return json.loads(self.answer.read_text())
            if self.helper.poll() is not None or (started.exists() and not _running(int(started.read_text() or 0))):
                return json.loads(self.answer.read_text()) if self.answer.exists() else None
            time.sleep(POLL_S)
        return None

    def close(self) -> None:
        """Stop our child (a run refused for another reason first) and remove the files."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
        self.folder.cleanup()

    def _located(self, loc: tuple[str | int, ...], problem: str, fix: str) -> InputError:
        path, line = line_of(loc, self.lines)
        return InputError(problem, fix=fix, where=f"{self.where}:{line}", field=dotted(path) or None)


def _plain(build: dict[str, Any]) -> bool:
    """Whether `build` travels to the child as JSON unchanged (grid values are YAML scalars and lists)."""
    try:
        return json.loads(json.dumps(build)) == build
    except (TypeError, ValueError):
        return False


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def main(request: Path, answer: Path) -> None:
    """Build every point asked for; the first LocatedError becomes data for the parent (written whole: a temporary
    file renamed, since a waiting scheduler reads it the moment it exists)."""
    answer.with_suffix(".pid").write_text(str(os.getpid()))
    found: dict[str, Any] = {"error": None}
    try:
        for build in json.loads(request.read_text()):
            check_builds(build["family"], build["axes"], lookback=build["lookback"], horizon=build["horizon"],
                         outputs_per_step=build.get("outputs_per_step", (1,)))
    except LocatedError as error:
        found["error"] = {"loc": list(error.loc), "problem": error.problem, "fix": error.fix}
    partial = answer.with_suffix(".part")
    partial.write_text(json.dumps(found, default=repr))
    os.replace(partial, answer)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
