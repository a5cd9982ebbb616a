"""Classical forecasters on the CPU lane: ``linear``, ``rf``, ``xgb``, ``lgbm``, and the statistical
references ``snaive``, ``ets``, ``theta`` (:mod:`.statistical`: series models, fitted per project).

Each sees the same windows as the neural families, flattened: ``(N, lookback, F)`` becomes
``(N, lookback * F)`` features (lagged target and covariates), and predicts ``(N, horizon)``.
Every family takes ``(n_features, lookback, horizon, *, <family params>, last_value_norm=True)``
and is named in ``models/builtin.py`` with the kind ``classical``.

The scheduler gives every trial an explicit thread count; ``fit(x, y, threads=, seed=)`` passes
it to the library (``n_jobs``) or, for ``linear``, caps the BLAS pool with threadpoolctl.
scikit-learn, XGBoost and LightGBM are imported when a model is built, not with
``gpufill.forecasting.models``: importing scikit-learn's ensembles alone takes seconds, and every CLI
command would pay it. Built before the fit timer starts, so ``fit_s`` never includes an import.

The package holds :mod:`.base` (the fit/predict contract every family shares: shapes, flattening, last-value
normalisation, thread caps), :mod:`.families` (the four library adapters), :mod:`.statistical` (the references) and
:mod:`.training` (the training entry point). Names load on first use (`gpufill.lazy`).
"""

from __future__ import annotations

from gpufill.lazy import by_home, lazy_names

_HOME = by_home({
    "base": ["ClassicalForecaster", "WindowRegressor"],
    "families": ["LGBMForecaster", "LinearForecaster", "RandomForestForecaster", "XGBForecaster"],
    "statistical": ["CombForecaster", "ETSForecaster", "SeasonalNaiveForecaster", "SeriesForecaster", "ThetaForecaster",
                    "fit_and_forecast", "fit_and_validate"],
    "training": ["ClassicalRun", "classical_plan", "train_classical", "validate_regressor"],
})
__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_names(__name__, _HOME)
