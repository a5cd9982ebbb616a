"""Statistical reference families: ``snaive`` (seasonal naive), ``ets`` (AutoETS), ``theta`` and ``comb`` (the
mean of AutoETS, Theta and AutoTheta), the lines forecasting practitioners put beside every network. ETS and Theta
come from statsforecast (a well-kept library; nothing of them is written here).

They are series models, not window regressors: each is fitted on one project's whole history
before the test region (train + validation, as the other classical families) and then, at each
test window's origin t, forecasts the next ``horizon`` steps from the series up to t with the
fitted parameters (statsforecast's ``forward``: the state is updated with the actual values, the
parameters are not refitted). So they are scored on exactly the test windows every other family
is scored on. Before that, fitted on the train region alone, they forecast the validation windows
(`fit_and_validate`): their validation score is what a choice between families reads, as a network's is. They run on the CPU lane like the classical families and see the target only.

The season length is ``season_length`` (an int) or ``auto``: the project's
(``data.project.season_length_of``: daily 7, weekly 52, monthly 12, quarterly 4, hourly 24;
synthetic data is daily; else 1). A series shorter than two seasons is fitted without one.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from gpufill.errors import InputError
from gpufill.forecasting.data.scoring import ValidationScored, score_validation
from gpufill.forecasting.models.checks import whole_number

__all__ = ["CombForecaster", "ETSForecaster", "SeasonalNaiveForecaster", "SeriesForecaster", "ThetaForecaster", "fit_and_forecast",
           "fit_and_validate"]

@runtime_checkable
class SeriesForecaster(Protocol):
    """What a statistical family builds: fitted on a series, forecasting from any prefix of it."""

    def fit_series(self, series: np.ndarray, *, season_length: int, threads: int, seed: int) -> None:
        """``series`` (T,) float64, original scale: the history before the test region."""

    def forecast_from(self, series: np.ndarray, origins: np.ndarray) -> np.ndarray:
        """(len(origins), horizon): each row forecasts ``series[t:t + horizon]`` from ``series[:t]``."""


class _StatisticalForecaster:
    family: ClassVar[str] = "statistical"
    deterministic: ClassVar[bool] = True
    """No random number is drawn (statsforecast's AutoETS and Theta fit by deterministic optimisation): a campaign
    runs one seed of it (registry.Family.deterministic)."""

    def __init__(self, n_features: int, lookback: int, horizon: int, *, season_length: int | str = "auto"):
        self.n_features, self.lookback, self.horizon = n_features, lookback, horizon
        if season_length != "auto":
            season_length = whole_number(self.family, "season_length", season_length)
        self.season_length_param = season_length
        self.season_length = 1
        self.history: np.ndarray | None = None

    def fit_series(self, series: np.ndarray, *, season_length: int, threads: int, seed: int) -> None:
        self.season_length = season_length if self.season_length_param == "auto" else int(self.season_length_param)
        if len(series) < 2 * self.season_length:  # too short for a seasonal model: a practitioner would drop the season too
            self.season_length = 1
        self.history = np.asarray(series, dtype=np.float64)
        self._fit(self.history)

    def _fit(self, series: np.ndarray) -> None:
        raise NotImplementedError

    def forecast_from(self, series: np.ndarray, origins: np.ndarray) -> np.ndarray:
        series = np.asarray(series, dtype=np.float64)
        return np.stack([self._forecast(series[:origin]) for origin in origins]) if len(origins) else np.zeros((0, self.horizon))

    def _forecast(self, prefix: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class SeasonalNaiveForecaster(_StatisticalForecaster):
    """Each step repeats the value one season before it: y[t + h] = y[t + h - m * ceil((h + 1) / m)]."""

    family = "snaive"

    def _fit(self, series: np.ndarray) -> None:
        pass  # nothing to estimate

    def _forecast(self, prefix: np.ndarray) -> np.ndarray:
        m = self.season_length
        last_season = prefix[-m:]
        return np.resize(last_season, self.horizon)  # repeats the last season over the horizon


class _StatsforecastForecaster(_StatisticalForecaster):
    """A statsforecast model: fitted once, then `forward` on each prefix with the fitted parameters."""

    def _model(self) -> Any:
        raise NotImplementedError

    def _fit(self, series: np.ndarray) -> None:
        self.model_ = self._model().fit(y=series)

    def _forecast(self, prefix: np.ndarray) -> np.ndarray:
        try:
            return np.asarray(self.model_.forward(y=prefix, h=self.horizon)["mean"], dtype=np.float64)
        except Exception as error:  # noqa: BLE001 - statsforecast's own errors, named with the family
            raise InputError(f"{self.family} could not forecast from a series of length {len(prefix)}: {error}",
                             field=f"{self.family}.season_length", fix="use season_length: 1, or a longer series") from None


class ETSForecaster(_StatsforecastForecaster):
    """statsforecast's AutoETS: error, trend and season chosen by AICc (``model: ZZZ``), or fixed (e.g. ``AAN``)."""

    family = "ets"

    def __init__(self, n_features: int, lookback: int, horizon: int, *, season_length: int | str = "auto", model: str = "ZZZ"):
        super().__init__(n_features, lookback, horizon, season_length=season_length)
        if not (isinstance(model, str) and len(model) == 3 and model[0] in "ZAM" and model[1] in "ZANM" and model[2] in "ZANM"):
            raise InputError(f"model must be three letters (error, trend, season) from Z/A/M/N, got {model!r}",
                             field="ets.model", fix="use ZZZ (chosen by AICc) or e.g. AAN")
        self.model = model

    def _model(self) -> Any:
        from statsforecast.models import AutoETS

        return AutoETS(season_length=self.season_length, model=self.model)


class ThetaForecaster(_StatsforecastForecaster):
    """statsforecast's standard Theta method (the M3 winner's), with its seasonality test."""

    family = "theta"

    def _model(self) -> Any:
        from statsforecast.models import Theta

        return Theta(season_length=self.season_length)


class _AutoThetaForecaster(_StatsforecastForecaster):
    """statsforecast's AutoTheta (the Theta variant chosen by its in-sample error): a member of `comb`."""

    family = "comb"

    def _model(self) -> Any:
        from statsforecast.models import AutoTheta

        return AutoTheta(season_length=self.season_length)


COMBINES = ("mean", "median")


class CombForecaster(_StatisticalForecaster):
    """The statistical combination: the mean (or median) of AutoETS, Theta and AutoTheta, each fitted on the series as
    its own family is. A combination that trains nothing, as M4's "Comb" benchmark was (of exponential smoothing
    methods there), and often better than each of its members: the line a learned ensemble has to beat."""

    family = "comb"

    def __init__(self, n_features: int, lookback: int, horizon: int, *, season_length: int | str = "auto", combine: str = "mean"):
        super().__init__(n_features, lookback, horizon, season_length=season_length)
        if combine not in COMBINES:
            raise InputError(f"combine must be one of {', '.join(COMBINES)}, got {combine!r}", field="comb.combine", fix="use combine: mean or median")
        self.combine = combine
        self.members = [member(n_features, lookback, horizon, season_length=season_length)
                        for member in (ETSForecaster, ThetaForecaster, _AutoThetaForecaster)]

    def fit_series(self, series: np.ndarray, *, season_length: int, threads: int, seed: int) -> None:
        for member in self.members:
            member.fit_series(series, season_length=season_length, threads=threads, seed=seed)
        self.season_length = self.members[0].season_length

    def forecast_from(self, series: np.ndarray, origins: np.ndarray) -> np.ndarray:
        return getattr(np, self.combine)(np.stack([member.forecast_from(series, origins) for member in self.members]), axis=0)


def fit_and_forecast(model: SeriesForecaster, windows: Any, *, threads: int, seed: int) -> tuple[np.ndarray, dict[str, float]]:
    """Fit on one project's history before its test region; forecast every test window (original scale)."""
    started = time.perf_counter()
    model.fit_series(windows.series[: windows.fit_end], season_length=windows.season_length, threads=threads, seed=seed)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    prediction = model.forecast_from(windows.series, windows.test_origins)
    predict_s = time.perf_counter() - started
    return prediction, {"fit_s": fit_s, "predict_s": predict_s, "samples_per_s": windows.fit_end / fit_s if fit_s > 0 else 0.0}


def fit_and_validate(model: SeriesForecaster, windows: Any, *, threads: int, seed: int) -> ValidationScored | None:
    """The validation metrics and forecast of `model` fitted on the history before the validation windows (the train region) and
    forecasting them, as a network is scored on them before anything is chosen; None without validation windows.
    Give it a model of its own: the test's is fitted by `fit_and_forecast` on train + validation."""
    if not len(windows.val_origins):
        return None
    model.fit_series(windows.series[: int(windows.val_origins[0])], season_length=windows.season_length, threads=threads, seed=seed)
    return score_validation(windows, model.forecast_from(windows.series, windows.val_origins))
