"""The child process of campaign/spec/user_models.py: imports a campaign file's `module:factory` models, checks
their grids and builds every grid point, and writes what it found as JSON (the scheduler never does this)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpufill.campaign.spec.grid_checks import check_builds, check_grid
from gpufill.campaign.spec.spec import TaskSpec, TrainSpec
from gpufill.campaign.spec.spec_errors import LocatedError
from gpufill.errors import InputError
from gpufill.forecasting.models import registry


def main(request: Path, answer: Path) -> None:
    """Import and check every factory asked about; a LocatedError becomes data for the parent."""
    asked = json.loads(request.read_text())
    out: dict[str, Any] = {}
    for ref, grid in asked["grids"].items():
        try:
            family = registry.resolve(ref)
        except InputError as error:
            out[ref] = {"error": {"loc": [ref], "problem": error.problem, "fix": error.fix}}
            continue
        entry: dict[str, Any] = {"kind": family.kind, "defaults": dict(family.defaults), "accepts_any": family.accepts_any, "error": None}
        try:
            axes = check_grid(ref, grid, TrainSpec, TaskSpec, search=asked.get("search", False))
            if asked["lookback"] is not None and asked["horizon"] is not None:
                check_builds(ref, axes, lookback=asked["lookback"], horizon=asked["horizon"])
        except LocatedError as error:
            entry["error"] = {"loc": list(error.loc), "problem": error.problem, "fix": error.fix}
        out[ref] = entry
    answer.write_text(json.dumps(out, default=repr))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
