"""What `gpufill doctor -- COMMAND`'s instrumentation costs a training step.

    python bench/doctor_overhead.py [--steps 400] [--repeats 5] [--widths 64,512] [--out PATH]

Runs bench/_overhead_target.py (a plain PyTorch loop: DataLoader, .to(), forward, backward,
AdamW, .item() every step) as a separate process, plain and with the instrumentation loaded
at interpreter start (told to measure every step and never stop the script), alternating,
and compares their best runs' median step times (the least disturbed run of each: a shared
machine's noise is +-20 % run to run, far above the effect). The ratio is instrumented / plain - 1 (target < 2 %);
small widths are the worst case: the instrumentation's cost is per call, not per FLOP.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.script.launch import instrumented_environment  # noqa: E402

TARGET = Path(__file__).parent / "_overhead_target.py"


def step_time(steps: int, width: int, env: dict[str, str]) -> float:
    run = subprocess.run([sys.executable, str(TARGET), str(steps), str(width)], env=env, capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])["median_step_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--widths", default="64,512")
    parser.add_argument("--quick", action="store_true", help="200 steps, 3 repeats")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    steps, repeats = (200, 3) if args.quick else (args.steps, args.repeats)
    env = environment("cpu")
    rows, ratios = [], {}
    with tempfile.TemporaryDirectory() as folder:
        instrumented = instrumented_environment(Path(folder), steps=10**9)  # measure every step, never stop the script
        plain = dict(os.environ)
        for width in map(int, args.widths.split(",")):
            times: dict[str, list[float]] = {"plain": [], "instrumented": []}
            for _ in range(repeats):  # alternating, so drift in the machine hits both alike
                times["plain"].append(step_time(steps, width, plain))
                times["instrumented"].append(step_time(steps, width, instrumented))
            best = {way: min(values) for way, values in times.items()}
            for way, value in best.items():
                rows.append({"config": f"width {width}", "way": way, "best_run_step_ms": round(value * 1e3, 4), "median_run_step_ms": round(statistics.median(times[way]) * 1e3, 4), "runs_ms": [round(v * 1e3, 4) for v in times[way]]})
            ratios[f"width {width}: instrumentation overhead (instrumented / plain - 1)"] = best["instrumented"] / best["plain"] - 1
    finish("doctor_overhead", "gpufill doctor's instrumentation vs the plain script", env, {"steps": steps, "repeats": repeats, "widths": args.widths}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
