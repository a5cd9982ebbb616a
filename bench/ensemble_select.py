"""Forward selection of ensemble members (`ensemble: {select: greedy}`, campaign/results/greedy.py) at M1's size.

    python bench/ensemble_select.py [--smoke | --quick] [--members 36,160] [--rounds N] [--out PATH]

Validation forecasts shaped like M1 monthly's (617 series, one window of 18 months each), K members (a campaign's
networks: lookbacks x losses x seeds), each a noisy copy of the truth with its own bias and noise; selection by sMAPE,
combined by median (the docs' recipe). Arms, interleaved per round: gpufill's selection (one pass per round: each
candidate clipped between the picks' middle order statistics) and the same selection as first written (np.median of
the picks with each candidate, sorted every round: cubic in K), the latter only where it ends in minutes (K <= 36).
The two must pick the same members with the same scores, bit for bit. --smoke: K 8 and 16, 40 series (CI).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish, turned  # noqa: E402

from gpufill.campaign.results.greedy import select_greedily  # noqa: E402
from gpufill.forecasting.data.metrics import mean_over_series  # noqa: E402

SIZES = {"smoke": ((8, 16), 40, 1), "quick": ((36, 160), 617, 1), "full": ((36, 80, 160), 617, 3)}  # members, series, rounds
HORIZON = 18
SORTED_UP_TO = 36
"""The as-first-written arm runs only up to this many members (36: 98 s on a 2-core EPYC; 160: hours)."""


def forecasts_like_m1(members: int, series: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = rng.lognormal(8, 1, (series, 1)) * (1 + 0.1 * rng.standard_normal((series, HORIZON)))
    bias = rng.normal(0, 0.05, (members, 1, 1))
    noise = rng.uniform(0.03, 0.15, (members, 1, 1))
    forecasts = truth * (1 + bias + noise * rng.standard_normal((members, series, HORIZON)))
    return forecasts, truth, np.arange(series)


def by_sorting(forecasts: np.ndarray, truth: np.ndarray, groups: np.ndarray) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The selection as first written: np.median of the picks with each candidate, sorted afresh every round."""
    picks: list[int] = []
    scores: list[float] = []
    for _ in range(2 * forecasts.shape[0]):
        chosen = forecasts[picks]
        candidates = np.stack([np.median(np.concatenate([chosen, forecasts[k:k + 1]]), axis=0) for k in range(forecasts.shape[0])])
        round_scores = mean_over_series(candidates, truth, groups, "smape", None)
        picks.append(int(np.argmin(round_scores)))
        scores.append(float(round_scores[picks[-1]]))
    kept = int(np.argmin(scores)) + 1
    return tuple(picks[:kept]), tuple(scores[:kept])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="K 8 and 16 over 40 series, one round (CI)")
    size.add_argument("--quick", action="store_true", help="K 36 and 160 over M1's 617 series, one round")
    parser.add_argument("--members", default=None, help="comma-separated K values")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    members, series, rounds = SIZES[size_name]
    members = tuple(int(k) for k in args.members.split(",")) if args.members else members
    rounds = args.rounds or rounds
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    for k in members:
        forecasts, truth, groups = forecasts_like_m1(k, series)
        arms = ["gpufill (one pass per round)", *(["as first written (sorted every round)"] if k <= SORTED_UP_TO else [])]
        seconds: dict[str, list[float]] = {arm: [] for arm in arms}
        answers: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {}
        for r in range(rounds):
            for arm in turned(arms, r):
                print(f"K {k}: round {r + 1}/{rounds}: {arm}", flush=True)
                tick = time.perf_counter()
                if arm.startswith("gpufill"):
                    chosen = select_greedily(forecasts, truth, groups, metric="smape", combine="median")
                    answers[arm] = (chosen.picks, chosen.scores)
                else:
                    answers[arm] = by_sorting(forecasts, truth, groups)
                seconds[arm].append(time.perf_counter() - tick)
        same = len(set(answers.values())) == 1
        for arm in arms:
            picks, scores = answers[arm]
            rows.append({"members": k, "series": series, "horizon": HORIZON, "arm": arm, "seconds": round(statistics.median(seconds[arm]), 3),
                         "runs_s": [round(s, 3) for s in seconds[arm]], "picked": len(picks), "distinct": len(set(picks)),
                         "val_smape": round(scores[-1], 4), "same_as_gpufill": same})
        if len(arms) == 2:
            ratios[f"K {k}: gpufill speed-up over sorting every round"] = statistics.median(
                s / g for s, g in zip(seconds[arms[1]], seconds[arms[0]], strict=True))
        ratios[f"K {k}: gpufill seconds"] = statistics.median(seconds[arms[0]])
    env = environment("cpu")
    run_args = {"size": size_name, "members": list(members), "series": series, "horizon": HORIZON, "rounds": rounds, "metric": "smape",
                "combine": "median", "sorted_up_to": SORTED_UP_TO}
    finish("ensemble_select", "ensemble members chosen by forward selection (median, sMAPE) at M1's size", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
