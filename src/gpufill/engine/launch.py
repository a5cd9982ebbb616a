"""Re-run the current command under torchrun: `--nproc N` on one machine, one process per GPU
(or CPU processes on gloo). The command is run again with `--nproc` removed; the ranks find
each other through torchrun's environment (see `distributed.from_environment`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence


def under_torchrun() -> bool:
    """True inside a rank that torchrun (or srun with its variables) started."""
    return "WORLD_SIZE" in os.environ


def without_nproc(argv: Sequence[str]) -> list[str]:
    """`argv` with `--nproc N` / `--nproc=N` removed."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def relaunch_under_torchrun(nproc: int, entry: Sequence[str], argv: Sequence[str] | None = None) -> int:
    """Run `entry` (["-m", "pkg.mod"] or ["path/to/script.py"]) with this process's arguments minus --nproc
    under torchrun with `nproc` processes; returns torchrun's exit code."""
    args = without_nproc(sys.argv[1:] if argv is None else argv)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *entry, *args]
    return subprocess.call(command)
