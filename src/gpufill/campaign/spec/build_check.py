"""Every grid point of a campaign's built-in families built once before its run, in a child process.

Building a point is what proves a value wrong (a transformer's d_model that its heads do not divide), and building
needs torch. The scheduler never imports torch: it reads the campaign file with the builds `deferred()`, starts
this child at once (`BuildCheck.start`), and waits for its verdict only when the data is loaded and the lanes are
planned (`BuildCheck.wait`), before anything is written; the child's imports run meanwhile. A bad value is the same
one line at its `file:line` as when the file is checked in one process (`gpufill check`, `load_campaign`).

    python -m gpufill.campaign.spec.build_check IN OUT     (the child: IN lists the builds, OUT gets the first error)
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpufill.campaign.spec.grid_checks import check_builds, corner_axes
from gpufill.campaign.spec.search_spec import Range
from gpufill.campaign.spec.spec_errors import LocatedError, dotted, line_of
from gpufill.errors import InputError
from gpufill.forecasting.models import registry

WAIT_S = 300.0
"""A child that takes longer (a stalled machine) is given up on: the builds run in the scheduler instead."""

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


def check_or_defer(family: str, axes: Mapping[str, list[Any] | Range], *, lookback: int, horizon: int) -> None:
    """`check_builds` now, or listed for the child inside `deferred()` (a user's `module:factory` is built in its own
    child already: campaign/spec/user_models.py)."""
    pending = _pending.get()
    build = {"family": family, "axes": corner_axes(axes), "lookback": lookback, "horizon": horizon}
    if pending is None or registry.is_remembered(family) or not _plain(build):
        check_builds(family, axes, lookback=lookback, horizon=horizon)
    else:
        pending.append(build)


class BuildCheck:
    """The child building a campaign file's deferred grid points; `wait` raises the first problem at its line."""

    def __init__(self, builds: list[dict[str, Any]], where: str, lines: Mapping[tuple[str | int, ...], int]):
        self.builds, self.where, self.lines = builds, where, lines
        self.folder = tempfile.TemporaryDirectory(prefix="gpufill-builds-")
        request, self.answer = Path(self.folder.name) / "in.json", Path(self.folder.name) / "out.json"
        request.write_text(json.dumps(builds))
        # stdin /dev/null: nothing in it reads the user's terminal; a session of its own: a Ctrl-C reaches the scheduler only.
        self.process = subprocess.Popen([sys.executable, "-m", "gpufill.campaign.spec.build_check", str(request), str(self.answer)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    @classmethod
    def start(cls, builds: list[dict[str, Any]], where: str, lines: Mapping[tuple[str | int, ...], int]) -> BuildCheck | None:
        """The child started on `builds` (None when there are none); `where` and `lines` place an error in the file."""
        return cls(builds, where, lines) if builds else None

    def wait(self) -> None:
        """Return once every point built; else raise the first problem as one line at its `file:line`. A child that
        could not answer (killed, stalled past WAIT_S) is replaced by building here: the check is never skipped."""
        try:
            _, err = self.process.communicate(timeout=WAIT_S)
            answered = self.process.returncode == 0 and self.answer.exists()
            found = json.loads(self.answer.read_text()) if answered else None
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            found = None
        finally:
            self.folder.cleanup()
        if found is None:
            try:
                for build in self.builds:
                    check_builds(build["family"], build["axes"], lookback=build["lookback"], horizon=build["horizon"])
            except LocatedError as error:
                raise self._located(error.loc, error.problem, error.fix) from None
            return
        if found.get("error"):
            error = found["error"]
            raise self._located(tuple(error["loc"]), error["problem"], error["fix"])

    def close(self) -> None:
        """Stop the child (a run refused for another reason first) and remove its files."""
        if self.process.poll() is None:
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


def main(request: Path, answer: Path) -> None:
    """Build every point asked for; the first LocatedError becomes data for the parent."""
    found: dict[str, Any] = {"error": None}
    try:
        for build in json.loads(request.read_text()):
            check_builds(build["family"], build["axes"], lookback=build["lookback"], horizon=build["horizon"])
    except LocatedError as error:
        found["error"] = {"loc": list(error.loc), "problem": error.problem, "fix": error.fix}
    answer.write_text(json.dumps(found, default=repr))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
