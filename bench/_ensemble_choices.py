"""How bench/forecast_quality.py's `--select` ways combine the learned trials, each chosen on the trials' validation
forecasts (or by a rule fixed before the run), never on the test window: label and function per way."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpufill.campaign.results.greedy import select_greedily
from gpufill.forecasting.data.metrics import mean_over_series

GREEDY = "gpufill: chosen on validation"
LOOKBACKS = "gpufill: lookbacks chosen on validation"
FILLED = "gpufill: lookbacks the history fills"
BEST = "gpufill: the way best on validation"


def validation_matrix(val_rows: pd.DataFrame, trial_ids: list[str]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(candidates, their validation forecasts (K, windows, horizon), the truth (windows, horizon), each window's series
    number) over the windows every candidate forecast."""
    val = val_rows[val_rows["trial_id"].isin(set(trial_ids))]
    table = val.pivot_table(index=["project", "origin", "step"], columns="trial_id", values="forecast").dropna()
    truth = val.groupby(["project", "origin", "step"])["actual"].first().loc[table.index]
    horizon = int(table.index.get_level_values("step").max())
    windows = table.index.droplevel("step").unique()
    candidates = list(table.columns)
    forecasts = table.to_numpy().T.reshape(len(candidates), len(windows), horizon)
    return candidates, forecasts, truth.to_numpy().reshape(len(windows), horizon), pd.factorize(windows.get_level_values("project"))[0]


def combined_rows(rows: pd.DataFrame, weights: dict[str, int]) -> pd.DataFrame:
    """The median per series, origin and step of the test forecasts of `weights`' trials, each repeated as often as it weighs."""
    chosen = rows[rows["trial_id"].isin(weights)]
    repeated = pd.concat([chosen[chosen["trial_id"] == trial_id] for trial_id, count in weights.items() for _ in range(count)])
    return repeated.groupby(["project", "origin", "step"], as_index=False).agg(forecast=("forecast", "median"), actual=("actual", "first"))


def greedy_ensemble(rows: pd.DataFrame, val_rows: pd.DataFrame, trials: pd.DataFrame, families: list[str]
                    ) -> tuple[pd.DataFrame, dict[str, object]]:
    """The learned families' trials combined as forward selection with replacement chooses them on their validation
    forecasts (campaign/results/greedy.py; the median, weighted by how often each joined; sMAPE per series, averaged,
    as the table scores): (its test forecast rows, what it chose). The test rows are read only for the chosen."""
    learned = trials[trials["family"].isin(families)]
    candidates, forecasts, truth, groups = validation_matrix(val_rows, list(learned["trial_id"]))
    picked = select_greedily(forecasts, truth, groups, metric="smape", combine="median")
    weights = {candidates[index]: count for index, count in picked.weights.items()}
    by_id = trials.set_index("trial_id")
    about = {"validation_smape": round(picked.score, 3), "members_chosen": len(picked.picks), "distinct_members": len(weights),
             "candidates": len(candidates), "chosen_lookbacks": sorted({int(by_id.loc[t, "lookback"]) for t in weights}),
             "chosen": sorted(f"{by_id.loc[t, 'family']} lookback {by_id.loc[t, 'lookback']} seed {by_id.loc[t, 'seed']} {by_id.loc[t, 'params']}"
                              + (f" x{weights[t]}" if weights[t] > 1 else "") for t in weights)}
    return combined_rows(rows, weights), about


def lookback_range_ensemble(rows: pd.DataFrame, val_rows: pd.DataFrame, trials: pd.DataFrame, families: list[str]
                            ) -> tuple[pd.DataFrame, dict[str, object]]:
    """The median of every learned trial whose lookback lies in one contiguous range of the lookbacks trained, the
    range (of the n(n+1)/2) whose median scores best on the validation window (sMAPE per series, averaged): a choice
    among a handful of ensembles, coarse enough not to fit the validation window's noise, that lets M1's short series
    take short lookbacks and M3's long ones longer. (its test forecast rows, what it chose)."""
    learned = trials[trials["family"].isin(families)]
    candidates, forecasts, truth, groups = validation_matrix(val_rows, list(learned["trial_id"]))
    lookback_of = learned.set_index("trial_id")["lookback"].astype(int)
    lookbacks = sorted({int(lookback_of[t]) for t in candidates})
    ranges = [lookbacks[i : j + 1] for i in range(len(lookbacks)) for j in range(i, len(lookbacks))]
    scored = []
    for chosen in ranges:
        members = [k for k, t in enumerate(candidates) if int(lookback_of[t]) in chosen]
        scored.append((float(mean_over_series(np.median(forecasts[members], axis=0), truth, groups, "smape")), chosen, members))
    score, chosen, members = min(scored, key=lambda item: item[0])  # ties: the first range (shortest lookbacks first)
    weights = {candidates[k]: 1 for k in members}
    return combined_rows(rows, weights), {"validation_smape": round(score, 3), "members_chosen": len(members), "distinct_members": len(members),
                                          "candidates": len(candidates), "chosen_lookbacks": chosen,
                                          "ranges_on_validation": {"-".join(map(str, r)): round(v, 3) for v, r, _ in scored}}


def filled(rows: pd.DataFrame, lookback_of: pd.Series) -> pd.DataFrame:
    """The rows of the members whose lookback the series' history fills at the window's origin (no padded input),
    or, for a window no member's lookback fits, the rows of the shortest lookback's members."""
    lookbacks = rows["trial_id"].map(lookback_of)
    fits = rows["origin"] >= lookbacks
    window = [rows["project"], rows["origin"]]
    any_fits = fits.groupby(window).transform("any")
    shortest = lookbacks == lookbacks.groupby(window).transform("min")
    return rows[fits | (~any_fits & shortest)]


def median_smape(rows: pd.DataFrame) -> float:
    """sMAPE of the rows' median per series, origin and step: per series, averaged (the table's)."""
    combined = combined_rows(rows, dict.fromkeys(rows["trial_id"].unique(), 1))
    smape = 200 * np.abs(combined["actual"] - combined["forecast"]) / np.maximum(np.abs(combined["actual"]) + np.abs(combined["forecast"]), 1e-12)
    return float(smape.groupby(combined["project"]).mean().mean())


def filled_ensemble(rows: pd.DataFrame, val_rows: pd.DataFrame, trials: pd.DataFrame, families: list[str]
                    ) -> tuple[pd.DataFrame, dict[str, object]]:
    """The median, per series, of the learned trials whose lookback its history fills: a rule fixed before the run
    (a padded input window is partly made up: on a series shorter than a member's lookback, that member forecasts
    from zeros). The same rule's validation sMAPE and the plain median's are kept beside it, to see whether
    validation agrees. (its test forecast rows, what it chose)."""
    learned = trials[trials["family"].isin(families)]
    lookback_of = learned.set_index("trial_id")["lookback"].astype(int)
    test, val = rows[rows["trial_id"].isin(lookback_of.index)], val_rows[val_rows["trial_id"].isin(lookback_of.index)]
    kept, kept_val = filled(test, lookback_of), filled(val, lookback_of)
    windows = test.groupby(["project", "origin"])["trial_id"].nunique()
    members = kept.groupby(["project", "origin"])["trial_id"].nunique()
    about = {"validation_smape": round(median_smape(kept_val), 3), "validation_smape_of_all": round(median_smape(val), 3),
             "members_chosen": int(members.median()), "distinct_members": int(kept["trial_id"].nunique()), "candidates": len(lookback_of),
             "windows_with_every_member": int((members == windows.loc[members.index]).sum()), "windows": int(len(windows))}
    return combined_rows(kept, dict.fromkeys(kept["trial_id"].unique(), 1)), about


def best_on_validation(rows: pd.DataFrame, val_rows: pd.DataFrame, trials: pd.DataFrame, families: list[str]
                       ) -> tuple[pd.DataFrame, dict[str, object]]:
    """One method per data set, chosen on validation alone: of the lookback ranges (the full range is the median of
    every trial) and the rule `filled`, the ensemble whose validation sMAPE is lowest. Forward selection is not a
    candidate: its validation score is the one it was fitted to. (its test forecast rows, what it chose)."""
    ways = {LOOKBACKS: lookback_range_ensemble(rows, val_rows, trials, families), FILLED: filled_ensemble(rows, val_rows, trials, families)}
    label = min(ways, key=lambda way: ways[way][1]["validation_smape"])  # ties: the lookback ranges (listed first)
    forecast, about = ways[label]
    return forecast, {**about, "chosen_way": label, "ways_on_validation": {way: ways[way][1]["validation_smape"] for way in ways}}


SELECTIONS = {"greedy": (GREEDY, greedy_ensemble), "lookbacks": (LOOKBACKS, lookback_range_ensemble), "filled": (FILLED, filled_ensemble),
              "best": (BEST, best_on_validation)}
"""--select's ways of choosing the learned trials' ensemble on validation: name -> (its method's label, how)."""
