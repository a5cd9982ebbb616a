"""A training whose step sits in a bare `except:` that keeps going on any error (SystemExit included), as a
"never stop the run" loop is sometimes written. `python swallows_stop.py STEPS [raise]`: `raise` ends it with an
error after the loop."""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
done = 0
for step in range(steps):
    try:
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1
    except:  # noqa: E722 - the point of this script
        done += 1
print(f"finished {done} steps")
if sys.argv[2:] == ["raise"]:
    raise RuntimeError("the end of a run that caught everything")
