"""How fast the command line starts: `gpufill --help` against a bare Python start and `import torch`.

    python bench/cli_startup.py [--quick] [--repeats N] [--out PATH]

Each command runs N times as a fresh process, interleaved; the table gives the median and
best wall time. `gpufill --help` must not import torch, pandas or the campaign machinery
(`import gpufill` is lazy), so it should cost a bare interpreter plus typer and rich, well
under a second; `import torch` is shown as the cost it avoids. Ratios: gpufill --help /
bare python, and import torch / gpufill --help.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402


def commands() -> dict[str, list[str]]:
    gpufill = shutil.which("gpufill") or str(Path(sys.executable).with_name("gpufill"))
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "gpufill --help": [gpufill, "--help"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    runs: dict[str, list[float]] = {name: [] for name in commands()}
    for _ in range(repeats):
        for name, command in commands().items():  # interleaved: drift hits every command alike
            tick = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            runs[name].append(time.perf_counter() - tick)
    rows = [{"command": name, "median_s": round(statistics.median(times), 3), "best_s": round(min(times), 3), "runs": [round(t, 3) for t in times]}
            for name, times in runs.items()]
    median = {name: statistics.median(times) for name, times in runs.items()}
    ratios = {
        "help_over_bare_python": median["gpufill --help"] / median["python -c pass"],
        "import_torch_over_help": median["python -c 'import torch'"] / median["gpufill --help"],
        "help_median_s": median["gpufill --help"],
    }
    finish("cli_startup", f"process start, median of {repeats}", environment("cpu"), {"repeats": repeats}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
