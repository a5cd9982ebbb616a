"""The training bench/doctor_overhead.py times: a plain PyTorch loop (DataLoader, .to(), forward,
backward, AdamW, .item() every step) run in blocks of steps, alternately plain and with gpufill's
instrumentation installed in this process (the same code `gpufill watch` loads at interpreter
start, recording the whole run); prints each block's median step time as JSON.

    python bench/_overhead_target.py WIDTH DEVICE STEPS_PER_BLOCK PAIRS [watch|doctor]
    python bench/_overhead_target.py null DEVICE STEPS REPEATS [watch|doctor]

`watch` (default) records the whole run on the host's clock; `doctor` is a doctor's run (never
stopped here), which on a GPU times every step with CUDA events on the GPU's timeline.

`null`: the instrumentation's own cost per step, measured directly: a step that does almost
nothing (next() on a DataLoader, .to(), a one-element forward and backward, SGD, .item()),
timed plain and instrumented, the best of REPEATS runs of STEPS each (the least disturbed run;
a difference of microseconds survives a noisy machine this way, not in a real step's median).
"""

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpufill.script.instrument import WHOLE_RUN, install

SKIP = 5  # each block's first steps: the instrumentation counts FLOPs on one of them; plain blocks skip as many
MODE = sys.argv[5] if len(sys.argv) > 5 else "watch"
STEPS = {"watch": WHOLE_RUN, "doctor": 10**9}[MODE]


def null_cost(device: str, steps: int, repeats: int) -> dict[str, float]:
    weight = torch.zeros(1, device=device, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.0)
    data = TensorDataset(torch.zeros(steps + 1, 1))

    def run() -> float:
        batches = iter(DataLoader(data, batch_size=1))
        tick = time.perf_counter()
        for _ in range(steps):
            (x,) = next(batches)
            loss = (weight * x.to(device)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
        return (time.perf_counter() - tick) / steps

    run()
    plain, instrumented = [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(repeats):
            plain.append(run())
            installed = install(Path(folder), steps=STEPS, warmup=0)
            run()  # its first steps count FLOPs once
            instrumented.append(run())
            installed.remove()
    return {"null_plain_us": min(plain) * 1e6, "null_instrumented_us": min(instrumented) * 1e6}


if sys.argv[1] == "null":
    print(json.dumps(null_cost(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    sys.exit(0)
width, device, block, pairs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
if device == "cpu":
    torch.set_num_threads(1)  # one core: the other runs the machine's noise
rows = 64 * (block + 1)
data = TensorDataset(torch.randn(rows, width), torch.randn(rows, 1))
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def run_block() -> float:
    times, tick = [], time.perf_counter()
    for x, y in DataLoader(data, batch_size=64, shuffle=True):
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()
        now = time.perf_counter()
        times.append(now - tick)
        tick = now
        if len(times) >= block + SKIP:
            break
    return statistics.median(times[SKIP:])


run_block()  # warm-up: allocator, first kernels
plain, instrumented = [], []
with tempfile.TemporaryDirectory() as folder:
    for pair in range(pairs):
        for way in (("plain", "instrumented") if pair % 2 == 0 else ("instrumented", "plain")):  # ABBA: drift hits both alike
            if way == "plain":
                plain.append(run_block())
            else:
                installed = install(Path(folder) / str(pair), steps=STEPS, warmup=0)
                instrumented.append(run_block())
                installed.remove()
print(json.dumps({"plain_s": plain, "instrumented_s": instrumented}))
