"""Before/after measurements: the guides' starting loop against gpufill, and what each speed-up is worth.

- `loops`: the baseline loop, gpufill's run of the same training, `compare` (interleaved,
  repeated, from the same weights), GPU utilisation per run;
- `ablation`: one gpufill run per speed-up its plan turned on, with that speed-up off;
- `report`: `gpufill bench` (run_bench -> BenchReport) and the environment record every
  benchmark starts with.
"""

from gpufill.bench.ablation import Ablation, ablations, automatic_plan
from gpufill.bench.loops import (
    Comparison,
    LoopMeasurement,
    UtilisationMeter,
    WindowDataset,
    baseline_fit,
    compare,
    gpufill_fit,
    validation_mse,
)
from gpufill.bench.report import (
    BenchReport,
    BenchSettings,
    bench_table,
    environment,
    run_bench,
    summary_lines,
)

__all__ = [
    "Ablation",
    "BenchReport",
    "BenchSettings",
    "Comparison",
    "LoopMeasurement",
    "UtilisationMeter",
    "WindowDataset",
    "ablations",
    "automatic_plan",
    "baseline_fit",
    "bench_table",
    "compare",
    "environment",
    "gpufill_fit",
    "run_bench",
    "summary_lines",
    "validation_mse",
]
