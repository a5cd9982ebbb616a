"""What gpufill's instrumentation (`gpufill doctor|watch|bench -- COMMAND`) costs a training step.

    python bench/doctor_overhead.py [--widths 64,256,1024] [--device cpu|cuda] [--mode watch|doctor] [--pairs 20] [--block 200] [--out PATH]

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

TARGET = Path(__file__).parent / "_overhead_target.py"


def quartiles(values: list[float]) -> tuple[float, float]:
    low, _, high = statistics.quantiles(values, n=4)
    return low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default="64,256,1024")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", choices=("watch", "doctor"), default="watch")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--block", type=int, default=200, help="steps per block")
    parser.add_argument("--quick", action="store_true", help="6 pairs of 60-step blocks")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    pairs, block = (6, 60) if args.quick else (args.pairs, args.block)
    env = environment(args.device)
    rows, ratios = [], {}
    null = json.loads(subprocess.run([sys.executable, str(TARGET), "null", args.device, "1000", "10" if args.quick else "40", args.mode],
                                     capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    cost_us = null["null_instrumented_us"] - null["null_plain_us"]
    rows.append({"config": "null step", "plain_step_us": round(null["null_plain_us"], 2), "instrumented_step_us": round(null["null_instrumented_us"], 2),
                 "overhead_pct": round(cost_us / null["null_plain_us"] * 100, 2), "overhead_iqr_pct": "", "best_block_overhead_pct": None,
                 "cost_us_per_step": round(cost_us, 2),
                 "direct_overhead_pct": None})
    for width in map(int, args.widths.split(",")):
        run = subprocess.run([sys.executable, str(TARGET), str(width), args.device, str(block), str(pairs), args.mode], capture_output=True, text=True, check=True)
        times = json.loads(run.stdout.strip().splitlines()[-1])
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
           {"pairs": pairs, "block": block, "widths": args.widths, "device": args.device, "mode": args.mode}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
