"""What gpufill's instrumentation (`gpufill doctor|watch|bench -- COMMAND`) costs a training step.

    python bench/doctor_overhead.py [--smoke | --quick] [--widths 64,256,1024] [--device cpu|cuda] [--mode watch|doctor] [--pairs 20] [--block 200] [--out PATH]

--mode doctor measures a doctor's run, which on a GPU adds about ten CUDA events per step (the
phases on the GPU's timeline); watch (default) is the host-clock recording of a whole run.

bench/_overhead_target.py runs a plain PyTorch loop (DataLoader, .to(), forward, backward,
AdamW, .item() every step) in blocks of steps, alternately plain and with the instrumentation
installed in the same process (the code `gpufill watch` loads at interpreter start, recording
the whole run: hooks, wrapped DataLoader and Tensor methods, per-second timeline). Alternating
blocks inside one process cancels what separate runs cannot (a shared machine's +-20 % from
run to run): each pair's ratio is instrumented / plain median step, and the overhead is the
median of those ratios - 1 (target < 2 %), with its interquartile range as the noise, and
the least disturbed blocks' ratio (best instrumented / best plain - 1).

A few microseconds are still below that noise on a shared machine, so the instrumentation's
own cost per step is also measured directly ("null" step: next() on a DataLoader, .to(), a
one-element forward and backward, SGD, .item(); best of many short runs, plain and
instrumented alternating) and divided by each width's plain step: `direct_overhead_pct`.
Small widths are the worst case: the cost is per call, not per FLOP.

--smoke: width 64 only, 2 pairs of 10-step blocks, a short null step (seconds, CI); --quick:
6 pairs of 60-step blocks. On a CPU every child runs torch on one thread (OMP_NUM_THREADS=1;
the width runs also pin it themselves).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

TARGET = Path(__file__).parent / "_overhead_target.py"
SIZES = {  # pairs, steps per block, null-step steps, null-step repeats, default widths
    "smoke": (2, 10, 100, 2, "64"),
    "quick": (6, 60, 1000, 10, "64,256,1024"),
    "full": (20, 200, 1000, 40, "64,256,1024"),
}


def quartiles(values: list[float]) -> tuple[float, float]:
    low, _, high = statistics.quantiles(values, n=4)
    return low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="width 64, 2 pairs of 10-step blocks: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="6 pairs of 60-step blocks")
    parser.add_argument("--widths", default=None, help="default 64,256,1024 (--smoke: 64)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", choices=("watch", "doctor"), default="watch")
    parser.add_argument("--pairs", type=int, default=None, help="default 20 (--quick 6, --smoke 2)")
    parser.add_argument("--block", type=int, default=None, help="steps per block (default 200; --quick 60, --smoke 10)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    pairs, block, null_steps, null_repeats, widths = SIZES[size_name]
    pairs, block, widths = args.pairs or pairs, args.block or block, args.widths or widths
    env = environment(args.device)
    child_env = {**os.environ, "OMP_NUM_THREADS": "1"} if args.device == "cpu" else None  # one thread on a CPU

    def child(*argv: str) -> dict:
        done = subprocess.run([sys.executable, str(TARGET), *argv], capture_output=True, text=True, env=child_env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{TARGET.name} {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    rows, ratios = [], {}
    null = child("null", args.device, str(null_steps), str(null_repeats), args.mode)
    cost_us = null["null_instrumented_us"] - null["null_plain_us"]
    rows.append({"config": "null step", "plain_step_us": round(null["null_plain_us"], 2), "instrumented_step_us": round(null["null_instrumented_us"], 2),
                 "overhead_pct": round(cost_us / null["null_plain_us"] * 100, 2), "overhead_iqr_pct": "", "best_block_overhead_pct": None,
                 "cost_us_per_step": round(cost_us, 2),
                 "direct_overhead_pct": None})
    for width in map(int, widths.split(",")):
        times = child(str(width), args.device, str(block), str(pairs), args.mode)
        plain, instrumented = times["plain_s"], times["instrumented_s"]
        pair_ratios = [i / p for i, p in zip(instrumented, plain, strict=True)]
        costs = [(i - p) * 1e6 for i, p in zip(instrumented, plain, strict=True)]
        low, high = quartiles(pair_ratios)
        rows.append({"config": f"width {width}", "plain_step_us": round(statistics.median(plain) * 1e6, 2),
                     "instrumented_step_us": round(statistics.median(instrumented) * 1e6, 2),
                     "overhead_pct": round((statistics.median(pair_ratios) - 1) * 100, 2),
                     "overhead_iqr_pct": f"{(low - 1) * 100:+.1f} .. {(high - 1) * 100:+.1f}",
                     "best_block_overhead_pct": round((min(instrumented) / min(plain) - 1) * 100, 2),
                     "cost_us_per_step": round(statistics.median(costs), 2),
                     "direct_overhead_pct": round(cost_us / (statistics.median(plain) * 1e6) * 100, 2),
                     "pair_ratios": [round(r, 4) for r in pair_ratios]})
        ratios[f"width {width}: overhead, alternating blocks (median instrumented / plain step - 1)"] = statistics.median(pair_ratios) - 1
        ratios[f"width {width}: overhead, direct (null-step cost / plain step)"] = cost_us / (statistics.median(plain) * 1e6)
    finish("doctor_overhead", "gpufill's script instrumentation vs the same loop plain, alternating blocks in one process", env,
           {"size": size_name, "pairs": pairs, "block": block, "null_steps": null_steps, "null_repeats": null_repeats, "widths": widths,
            "device": args.device, "mode": args.mode}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
