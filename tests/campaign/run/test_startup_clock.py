"""The start-up timeline's clock: a process's age to the kernel's tick (psutil's create_time rounds the boot time to
the second, so marks read up to 1 s late: bench/campaign_overhead.py's timeline then ended after the command did)."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def test_a_process_age_is_never_more_than_the_time_since_it_was_started_and_counts_its_sleep():
    script = ("import time; time.sleep(0.3)\n"
              "from gpufill.campaign.run.startup import process_age_s\n"
              "import json; print(json.dumps([process_age_s(), time.time()]))\n")
    before = time.time()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    age, now = json.loads(done.stdout)
    assert age >= 0.3  # its own sleep, at least
    assert age <= now - before + 0.02  # created after `before`: one clock tick (10 ms) of rounding at most, never a second
