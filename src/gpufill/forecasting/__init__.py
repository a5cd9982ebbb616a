"""Forecasting on top of the engine: projects and their sources, windows and splits, forecast
metrics (MASE included), the forecasters (neural, classical, their fused kernels) and the task
runner that trains one forecaster on one project (`task.py`)."""
