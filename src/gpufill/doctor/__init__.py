"""`gpufill doctor`: is this machine set up for speed, and what limits this training?

- `environment`: software, device and variable checks (ok / warn / info, each with a note);
- `speedtest`: measured matmul TFLOP/s and copy GB/s next to the datasheet peak;
- `profiler`: a training's step split into data wait, copy, forward, backward, optimizer,
  plus batch scaling and a FLOP count;
- `bottleneck`: the verdict (input-, launch/overhead-, compute- or memory-bound), a pure
  function of those numbers, with the fix and an expected gain;
- `target`: the training to diagnose, built the way users run it before gpufill;
- `report`: `run` / `diagnose` -> DoctorReport; `display`: the rich tables.
"""

from gpufill.doctor.bottleneck import (
    PhaseTimings,
    Verdict,
    VerdictKind,
    Yardstick,
    classify,
)
from gpufill.doctor.environment import Check, check_environment
from gpufill.doctor.profiler import profile_training
from gpufill.doctor.report import DoctorReport, diagnose, run
from gpufill.doctor.speedtest import SpeedTest, SpeedTestSizes, run_speed_test

__all__ = [
    "Check",
    "DoctorReport",
    "PhaseTimings",
    "SpeedTest",
    "SpeedTestSizes",
    "Verdict",
    "VerdictKind",
    "Yardstick",
    "check_environment",
    "classify",
    "diagnose",
    "profile_training",
    "run",
    "run_speed_test",
]
