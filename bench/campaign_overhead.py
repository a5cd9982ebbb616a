"""A small campaign against the plain for-loop over the same trainings, start-up included.

    python bench/campaign_overhead.py [--smoke | --quick] [--rounds N] [--out PATH]

The campaign: N synthetic projects x one MLP (hidden 32), a fixed number of epochs, no early
stopping, run as a user runs it: `python -m gpufill run FILE --workdir DIR` in a fresh process
(interpreter, imports, data, store, worker processes and their imports all inside the time).
The plain loop: `python bench/_plain_trials.py`, one process training the same models one after
the other with a careful hand loop (resident tensors, fused AdamW, no per-step sync), once with
torch's default threads and once pinned to one thread; each round's ratio is taken against the
faster of the two (the best the user would have written). Arms interleave, each round starting
with a different one; reported: each arm's median wall seconds, the median of per-round ratios
(campaign over the best plain loop; goal <= 1.5), and the campaign's start-up timeline from its
run log (the median over rounds of each mark).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _common import environment, finish, timed_command as timed  # noqa: E402

# (projects, series length, epochs, rounds): "quick" is the 16 tiny trials.
SIZES = {"smoke": (4, 400, 2, 1), "quick": (16, 2000, 20, 5), "full": (16, 2000, 20, 9)}
LOOKBACK, HIDDEN = 24, 32
GOAL = 1.5
MARK = re.compile(r"start-up: (?P<name>.+?) at (?P<at>[\d.]+) s")


def write_campaign(folder: Path, projects: int, length: int, epochs: int) -> Path:
    path = folder / "overhead.yaml"
    path.write_text(
        "name: campaign-overhead\n"
        f"data: {{source: synthetic, projects: {projects}, length: {length}, seed: 0}}\n"
        f"task: {{lookback: [{LOOKBACK}], horizon: 1, split: {{val: 0.1, test: 0.2}}}}\n"
        f"models: {{mlp: {{hidden_size: {HIDDEN}}}}}\n"
        f"train: {{epochs: {epochs}, early_stopping: null}}\n"
        "seeds: [0]\n"
        "resources: {retries: 0}\n"
    )
    return path


def start_up_marks(workdir: Path) -> dict[str, float]:
    """The run log's start-up timeline: mark -> seconds since the command started."""
    logs = sorted((workdir / "logs").glob("run-*.log"))
    if not logs:
        return {}
    return {m["name"]: float(m["at"]) for m in MARK.finditer(logs[-1].read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="4 trials, one round: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="16 trials, 5 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    projects, length, epochs, rounds = SIZES[size_name]
    rounds = args.rounds or rounds
    env = environment("cpu")
    folder = Path(tempfile.mkdtemp(prefix="gpufill-overhead-"))
    python = sys.executable
    try:
        campaign = write_campaign(folder, projects, length, epochs)
        plain = [python, str(BENCH / "_plain_trials.py"), str(projects), str(length), str(LOOKBACK), str(HIDDEN), str(epochs)]
        arms = {
            "plain loop (default threads)": plain + ["default"],
            "plain loop (1 thread)": plain + ["1"],
            "gpufill run": [python, "-m", "gpufill", "run", str(campaign), "--workdir", str(folder / "work"), "--fresh", "--yes"],
        }
        seconds: dict[str, list[float]] = {name: [] for name in arms}
        maes: dict[str, list[float]] = {}
        marks: list[dict[str, float]] = []
        names = list(arms)
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                print(f"round {r + 1}/{rounds}: {name}", flush=True)
                wall, stdout = timed(arms[name])
                seconds[name].append(wall)
                if name == "gpufill run":
                    marks.append(start_up_marks(folder / "work"))
                else:
                    maes[name] = json.loads(stdout.strip().splitlines()[-1])["mae"]
        trials = len(maes["plain loop (1 thread)"])
        from gpufill.campaign.run.runner import read_results

        results = read_results(folder / "work")
        if len(results) != trials or set(results["status"]) != {"done"}:
            raise SystemExit(f"the campaign stored {len(results)} trials ({sorted(set(results['status']))}), expected {trials} done")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = [{"arm": name, "trials": trials, "wall_s": round(statistics.median(s), 2), "runs_s": [round(x, 2) for x in s]} for name, s in seconds.items()]
    best_plain = [min(a, b) for a, b in zip(seconds["plain loop (default threads)"], seconds["plain loop (1 thread)"], strict=True)]
    ratio = statistics.median(c / p for c, p in zip(seconds["gpufill run"], best_plain, strict=True))
    timeline = {name: round(statistics.median(m[name] for m in marks if name in m), 2) for name in dict.fromkeys(k for m in marks for k in m)}
    for name, at in timeline.items():
        rows.append({"arm": f"gpufill start-up: {name}", "trials": None, "wall_s": at, "runs_s": []})
    ratios = {
        "campaign_wall_over_best_plain_loop": ratio,
        "goal": GOAL,
        "mean_mae_campaign_over_plain": float(results["mae"].mean()) / statistics.fmean(maes["plain loop (1 thread)"]),
    }
    run_args = {"size": size_name, "projects": projects, "length": length, "epochs": epochs, "lookback": LOOKBACK, "hidden_size": HIDDEN, "rounds": rounds}
    finish("campaign_overhead", f"{trials}-trial campaign vs a plain for-loop, start-up included", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
