"""Forecasting on top of the engine: what one trial is and how it trains. Projects and their sources, windows
and splits, forecast metrics (MASE included), the forecasters (neural, classical, their fused kernels), each
family's recipe, and one trial's run: `trial.py` (Trial, TrialResult), `run.py` (alone, global; `gpufill train`
too), `packs.py` (a pack of same-shape trials); `task.py` trains one forecaster on one project as a library call."""
