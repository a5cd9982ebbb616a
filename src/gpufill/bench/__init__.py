"""Before/after measurements: the guides' starting loop against gpufill, and what each speed-up is worth.

- `guides`: how the guides feed data (a per-sample Dataset in a plain DataLoader) and the
  one quality yardstick (the training's loss on the validation data);
- `target`: what is trained: any model, data and loss (`BenchTarget`), from references too;
- `loops`: the baseline loop, gpufill's run of the same training, `compare` (interleaved,
  repeated, from the same weights); `utilisation`: GPU utilisation per run;
- `ablation`: one gpufill run per speed-up its plan turned on, with that speed-up off;
- `report`: `gpufill bench` (run_bench -> BenchReport) and the environment record every
  benchmark starts with.
"""

from gpufill.bench.ablation import Ablation, ablations, automatic_plan
from gpufill.bench.guides import SampleDataset, WindowDataset, validation_loss
from gpufill.bench.loops import (
    Comparison,
    LoopMeasurement,
    baseline_fit,
    compare,
    gpufill_fit,
    validation_mse,
)
from gpufill.bench.target import BenchTarget, target_from_references
from gpufill.bench.utilisation import UtilisationMeter
from gpufill.bench.report import (
    BenchReport,
    BenchSettings,
    bench_table,
    environment,
    forecaster_target,
    run_bench,
    summary_lines,
)

__all__ = [
    "Ablation",
    "BenchReport",
    "BenchSettings",
    "BenchTarget",
    "Comparison",
    "LoopMeasurement",
    "SampleDataset",
    "UtilisationMeter",
    "WindowDataset",
    "ablations",
    "automatic_plan",
    "baseline_fit",
    "bench_table",
    "compare",
    "environment",
    "forecaster_target",
    "gpufill_fit",
    "run_bench",
    "summary_lines",
    "target_from_references",
    "validation_loss",
    "validation_mse",
]
