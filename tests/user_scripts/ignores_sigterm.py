"""A training that will not stop (issue 37's catcher.py): it ignores SIGTERM and catches everything, gpufill's stop
included, in an endless loop. `python ignores_sigterm.py PIDFILE [daemon]`: its pid is written to PIDFILE once it
ignores SIGTERM (a test's cue, and what it cleans up); `daemon` first starts a sleeper in a session of its own (out of
the script's process group), whose pid goes on the file's second line."""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # first of all: from here on SIGTERM does nothing

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

pids = [os.getpid()]
if sys.argv[2:] == ["daemon"]:
    pids.append(subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(300)"], start_new_session=True).pid)
with open(sys.argv[1] + ".tmp", "w") as handle:
    handle.write("\n".join(map(str, pids)) + "\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])

import torch  # noqa: E402
from torch import nn  # noqa: E402

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
while True:
    try:
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    except BaseException:  # noqa: BLE001, S110 - the point of this script
        pass
