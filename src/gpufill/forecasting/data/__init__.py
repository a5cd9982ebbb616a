"""Data layer: projects from synthetic/csv/parquet sources, windows and splits, forecast metrics."""

from gpufill.forecasting.data.metrics import forecast_metrics, mae, mase, rmse, smape
from gpufill.forecasting.data.project import Project
from gpufill.forecasting.data.sources import load_projects
from gpufill.forecasting.data.synthetic import synthetic_projects
from gpufill.forecasting.data.windows import Scaler, Split, WindowedProject, make_windows, split_bounds

__all__ = [
    "Project",
    "Scaler",
    "Split",
    "WindowedProject",
    "forecast_metrics",
    "load_projects",
    "mae",
    "make_windows",
    "mase",
    "rmse",
    "smape",
    "split_bounds",
    "synthetic_projects",
]
