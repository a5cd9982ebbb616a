"""The two CPU settings gpufill applies without measuring them, each against its alternative, in fresh processes.

    python bench/cpu_settings.py [--smoke | --quick] [--rounds N] [--out PATH]

1. How the thread count is set (`engine/backend.py` `set_threads`): scaled_dot_product_attention's forward and
   backward at the character LM's shape (batch 128, 4 heads, 32 positions of 16), milliseconds per call, in a process
   that set its threads with `torch.set_num_threads` (as every script and torch's own tooling does), with gpufill's
   `set_threads`, or not at all, each after going to one thread and back, as a thread measurement does; and, as the
   fix a doctor gives a script, the count set once at its start: by `torch.set_num_threads(N)` or by
   `OMP_NUM_THREADS=N` in the environment (N the machine's default count).
2. Keeping freed host memory (`keep_freed_memory`, the plan's `host_memory`): the character LM's training step
   (examples/lm_char.py, batch 128, fused AdamW; gpufill's thread setting in both arms) under glibc's own thresholds
   and with freed memory kept: milliseconds and minor page faults per step.

Every arm is a fresh interpreter (the settings last for a process); the arms of a round run one after the other, the
order turned each round; ratios are medians of the per-round ratios. CPU only: on a GPU neither setting applies.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish, turned  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"smoke": {"calls": 5, "steps": 3, "rounds": 1}, "quick": {"calls": 200, "steps": 150, "rounds": 7},
         "full": {"calls": 400, "steps": 400, "rounds": 9}}
THREAD_ARMS = ("untouched", "torch.set_num_threads", "gpufill set_threads", "torch.set_num_threads once", "OMP_NUM_THREADS")
MEMORY_ARMS = ("glibc thresholds", "freed memory kept")

_ATTENTION = """
import json, sys, time, torch
import torch.nn.functional as F
from gpufill.engine.backend import set_threads
arm, calls = sys.argv[1], int(sys.argv[2])
threads = torch.get_num_threads()
setter = {"torch.set_num_threads": torch.set_num_threads, "gpufill set_threads": set_threads}.get(arm)
if setter is not None:
    setter(1)
    setter(threads)
if arm == "torch.set_num_threads once":  # a script's first line, at the count torch already has
    torch.set_num_threads(threads)
q = torch.randn(128, 4, 32, 16, requires_grad=True)
for _ in range(max(2, calls // 10)):
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
tick = time.perf_counter()
for _ in range(calls):
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
print(json.dumps({"ms_per_call": (time.perf_counter() - tick) / calls * 1e3, "threads": torch.get_num_threads()}))
"""

_LM_STEP = """
import json, resource, sys, time, torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[3])
import lm_char
from gpufill.engine.backend import keep_freed_memory, set_threads
arm, steps = sys.argv[1], int(sys.argv[2])
set_threads(torch.get_num_threads())
kept = keep_freed_memory() if arm == "freed memory kept" else False
data = lm_char.make_data(context=32, limit=60_000)
torch.manual_seed(0)
model = lm_char.make_model(context=32)
x, y = data["train"]
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
def step(i):
    index = order[(i * 128) % (x.shape[0] - 128):][:128]
    loss = F.cross_entropy(model(x[index]).flatten(0, -2), y[index].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
for i in range(max(3, steps // 4)):  # warm-up: glibc's own thresholds rise to the blocks freed here
    step(i)
faults, tick = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
for i in range(steps):
    step(i)
seconds = time.perf_counter() - tick
print(json.dumps({"ms_per_step": seconds / steps * 1e3, "faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps,
                  "kept": kept}))
"""


def run_arm(code: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"cpu_settings: arm {args[0]!r} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rounds_of(arms: tuple[str, ...], rounds: int, measure: Any) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in turned(arms, r):
            print(f"round {r + 1}/{rounds}: {arm}", flush=True)
            runs[arm].append(measure(arm))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="a few calls and steps, one round (CI)")
    size.add_argument("--quick", action="store_true", help="2-6 minutes on 2 CPU cores")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = SIZES[size_name]
    rounds = args.rounds or sizes["rounds"]
    env = environment("cpu")
    import torch

    omp = {"OMP_NUM_THREADS": str(torch.get_num_threads())}  # the machine's default count, as the environment's variable
    attention = rounds_of(THREAD_ARMS, rounds, lambda arm: run_arm(_ATTENTION, arm, str(sizes["calls"]), env=omp if arm == "OMP_NUM_THREADS" else None))
    memory = rounds_of(MEMORY_ARMS, rounds, lambda arm: run_arm(_LM_STEP, arm, str(sizes["steps"]), str(ROOT / "examples")))
    rows = [{"setting": "threads", "arm": arm, "ms": round(statistics.median(m["ms_per_call"] for m in runs), 3),
             "threads": runs[0]["threads"], "ms_runs": [round(m["ms_per_call"], 3) for m in runs]} for arm, runs in attention.items()]
    rows += [{"setting": "host memory", "arm": arm, "ms": round(statistics.median(m["ms_per_step"] for m in runs), 3),
              "faults_per_step": round(statistics.median(m["faults_per_step"] for m in runs), 1), "kept": runs[0]["kept"],
              "ms_runs": [round(m["ms_per_step"], 3) for m in runs]} for arm, runs in memory.items()]

    def per_round(runs: dict[str, list[dict[str, Any]]], key: str, slow: str, fast: str) -> float:
        return round(statistics.median(s[key] / f[key] for s, f in zip(runs[slow], runs[fast], strict=True)), 3)

    ratios = {"attention ms, torch.set_num_threads / gpufill set_threads": per_round(attention, "ms_per_call", "torch.set_num_threads", "gpufill set_threads"),
              "attention ms, untouched / gpufill set_threads": per_round(attention, "ms_per_call", "untouched", "gpufill set_threads"),
              "attention ms, torch.set_num_threads once / OMP_NUM_THREADS": per_round(attention, "ms_per_call", "torch.set_num_threads once", "OMP_NUM_THREADS"),
              "LM step ms, glibc thresholds / freed memory kept": per_round(memory, "ms_per_step", "glibc thresholds", "freed memory kept")}
    run_args = {"size": size_name, "rounds": rounds, **sizes, "attention_shape": [128, 4, 32, 16], "lm": {"text_bytes": 60_000, "batch": 128},
                "process": "each arm a fresh interpreter"}
    finish("cpu_settings", "how gpufill sets CPU threads and keeps host memory, against the alternatives", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
