"""A compute-bound training with more torch threads than the cores it may use, beside a busy process:
the thread oversubscription a loaded box gives torch's defaults. Pinned to two cores with a spinner on
one of them, so the stall is alike on any machine with two cores or more (measured on a 2-core box:
4 threads 11.5 ms a step, 1 thread 8.2 ms). `python oversubscribed.py STEPS` (default 200)."""

import os
import subprocess
import sys

cores = set(sorted(os.sched_getaffinity(0))[:2])
os.sched_setaffinity(0, cores)
# The busy neighbour: spins until this process is gone (it checks its parent on every turn).
spinner = subprocess.Popen([sys.executable, "-c", f"import os\nwhile os.getppid() == {os.getpid()}: pass"])
os.sched_setaffinity(spinner.pid, {min(cores)})

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(4)
torch.manual_seed(0)
x, y = torch.randn(2048, 256), torch.randn(2048, 256)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 256))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
try:
    for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 200):
        index = torch.randint(0, 2048, (256,))
        loss = nn.functional.mse_loss(model(x[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
finally:
    spinner.kill()
