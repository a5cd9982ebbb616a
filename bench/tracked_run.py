"""A tracked campaign against the same campaign untracked: what tracking to MLflow adds to the command's wall.

    python bench/tracked_run.py [--smoke | --quick] [--rounds N] [--out PATH]

A local `mlflow server` (SQLite backend, one worker, no job execution) is started once; each round runs the same
campaign file twice as a user runs it, `python -m gpufill run FILE --fresh --yes` in a fresh process, once untracked
and once with `--mlflow URI` (a new experiment each round), in alternating order. Reported: each arm's median wall
seconds, the median of per-round differences (tracked minus untracked; goal <= 3 s) and ratios, the tracked run's
last line, and how many runs reached the server (every trial, checked each round).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _common import environment, finish, timed_command as timed  # noqa: E402

# (projects, series length, epochs, rounds): "quick" is the dozen trials.
SIZES = {"smoke": (4, 300, 2, 1), "quick": (12, 600, 5, 5), "full": (12, 600, 5, 9)}
GOAL_S = 3.0
SERVER_START_S = 300.0
"""A server imports MLflow's web stack: ~10 s on 2 idle cores, a minute or more on a loaded one."""


def write_campaign(folder: Path, projects: int, length: int, epochs: int) -> Path:
    path = folder / "untracked.yaml"
    path.write_text(
        "name: tracked-bench\n"
        f"data: {{source: synthetic, projects: {projects}, length: {length}, seed: 0}}\n"
        "task: {lookback: [24], horizon: 1, split: {val: 0.1, test: 0.2}}\n"
        "models: {mlp: {hidden_size: 32}}\n"
        f"train: {{epochs: {epochs}, early_stopping: null}}\n"
        "seeds: [0]\n"
        "resources: {retries: 0}\n"
    )
    return path


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder / "artifacts")]
    log = (folder / "server.log").open("ab")
    server = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"mlflow server exited: {(folder / 'server.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                if answer.status == 200:
                    return server, uri
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"mlflow server did not answer within {SERVER_START_S:.0f} s")


def runs_in(uri: str, experiment: str) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=5000) if found else []
    return sum("gpufill.trial_id" in run.data.tags for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="4 trials, one round (CI)")
    size.add_argument("--quick", action="store_true", help="12 trials, 5 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    projects, length, epochs, rounds = SIZES[size_name]
    rounds = args.rounds or rounds
    env = environment("cpu")
    folder = Path(tempfile.mkdtemp(prefix="gpufill-tracked-bench-"))
    server = None
    try:
        server, uri = start_server(folder)
        campaign = write_campaign(folder, projects, length, epochs)
        run = [sys.executable, "-m", "gpufill", "run", str(campaign), "--fresh", "--yes"]
        seconds: dict[str, list[float]] = {"untracked": [], "tracked": []}
        last_lines: list[str] = []
        for r in range(rounds):
            order = ["untracked", "tracked"] if r % 2 == 0 else ["tracked", "untracked"]
            for arm in order:
                print(f"round {r + 1}/{rounds}: {arm}", flush=True)
                if arm == "untracked":
                    wall, _ = timed([*run, "--workdir", str(folder / "untracked")])
                else:
                    experiment = f"round-{r}"
                    tracked = folder / "tracked.yaml"
                    tracked.write_text(campaign.read_text() + f"tracking: {{mlflow: '{uri}', experiment: {experiment}}}\n")
                    wall, stdout = timed([sys.executable, "-m", "gpufill", "run", str(tracked), "--fresh", "--yes", "--workdir", str(folder / "tracked")])
                    last_lines.append(next((line for line in stdout.splitlines() if line.startswith("tracking:")), ""))
                    exported = runs_in(uri, experiment)
                    if exported != projects:
                        raise SystemExit(f"round {r + 1}: {exported} of {projects} trials reached MLflow; the run said: {last_lines[-1]!r}")
                seconds[arm].append(wall)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
    rows = [{"arm": arm, "trials": projects, "wall_s": round(statistics.median(s), 2), "runs_s": [round(x, 2) for x in s]} for arm, s in seconds.items()]
    pairs = list(zip(seconds["tracked"], seconds["untracked"], strict=True))
    ratios = {
        "tracked_minus_untracked_s": statistics.median(t - u for t, u in pairs),
        "tracked_over_untracked": statistics.median(t / u for t, u in pairs),
        "goal_s": GOAL_S,
    }
    rows.append({"arm": "tracked run's last line", "trials": None, "wall_s": None, "runs_s": [], "said": last_lines[-1]})
    run_args = {"size": size_name, "projects": projects, "length": length, "epochs": epochs, "rounds": rounds}
    finish("tracked_run", f"{projects}-trial campaign tracked to a local mlflow server vs untracked", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
