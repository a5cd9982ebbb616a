"""Data layer: projects from synthetic/csv/parquet sources, windows and splits, forecast metrics.

Names load lazily, on first use: the scheduler reads splits and projects without importing what windows and
metrics need (torch).
"""

from __future__ import annotations

from gpufill.lazy import lazy_names

# name -> submodule of gpufill.forecasting.data that defines it
_HOME = {
    **dict.fromkeys(["forecast_metrics", "mae", "mase", "rmse", "smape"], "metrics"),
    "Project": "project",
    "load_projects": "sources",
    "synthetic_projects": "synthetic",
    **dict.fromkeys(["Split", "split_bounds"], "split"),
    **dict.fromkeys(["Scaler", "WindowedProject", "make_windows"], "windows"),
}
__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_names(__name__, _HOME)
