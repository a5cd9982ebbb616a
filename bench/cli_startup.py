"""How fast the command line starts: `gpufill --help` against a bare Python start and `import torch`.

    python bench/cli_startup.py [--smoke | --quick] [--repeats N] [--out PATH]

Each command runs N times as a fresh process, interleaved (each round runs every command,
each round starting with a different one); the table gives the median and best wall time.
--smoke: one round (seconds, CI); --quick: 3; default 5. Nothing here runs torch in this
process (the commands are fresh interpreters), so there is no thread count to pin. `gpufill --help` must not import torch, pandas or the campaign machinery
(`import gpufill` is lazy), so it should cost a bare interpreter plus typer and rich, well
under a second; `import torch` is shown as the cost it avoids. Ratios: gpufill --help /
bare python, and import torch / gpufill --help, each the median of per-round ratios.
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
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="one round: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 5; --quick 3, --smoke 1)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.smoke else 3 if args.quick else 5)
    runs: dict[str, list[float]] = {name: [] for name in commands()}
    names = list(runs)
    for r in range(repeats):
        shift = r % len(names)  # interleaved, each round starting with a different command: drift hits every command alike
        for name in names[shift:] + names[:shift]:
            tick = time.perf_counter()
            subprocess.run(commands()[name], check=True, capture_output=True)
            runs[name].append(time.perf_counter() - tick)
    rows = [{"command": name, "median_s": round(statistics.median(times), 3), "best_s": round(min(times), 3), "runs": [round(t, 3) for t in times]}
            for name, times in runs.items()]

    def per_round(top: str, bottom: str) -> float:
        return statistics.median(a / b for a, b in zip(runs[top], runs[bottom], strict=True))

    ratios = {
        "help_over_bare_python": per_round("gpufill --help", "python -c pass"),
        "import_torch_over_help": per_round("python -c 'import torch'", "gpufill --help"),
        "help_median_s": statistics.median(runs["gpufill --help"]),
    }
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    finish("cli_startup", f"process start, median of {repeats}", environment("cpu"), {"size": size_name, "repeats": repeats}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
