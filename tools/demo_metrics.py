"""The demo campaign's metrics, identical before and after a restructuring (issue 27).

Issue 27 gives "run one trial" one owner (campaign/, forecasting/); a trial's behaviour must not change.
This script runs the bundled demo campaign (examples/demo.yaml of the gpufill it imports, through the command
line, in a temporary workdir) and reads each trial's test and naive metrics, and the values of its plan's
choices, back through the store's read API (`Store.records`, `Store.trial_details`).

    python tools/demo_metrics.py save OUT.json [--pack-size N|auto] [--workdir DIR]
    python tools/demo_metrics.py compare REFERENCE.json [--tolerance T] [--pack-size N|auto] [--workdir DIR]

`compare` prints, per metric name, the largest relative difference |a - b| / max(|a|, |b|) over the trials,
the trial ids found on one side only, the trials whose plan choices differ from the reference's, and last
`max relative difference: X (N trials)`; it exits 0 when every trial is on both sides and X <= T, else 1.

Why the pack size is pinned (`--pack-size 2`, the default; `resources.pack_size` in a copy of the demo file,
which leaves the trial ids as they are). `gpufill demo` itself (`--pack-size auto`) measures the pack size of
each neural shape by timing, so it differs from run to run: six runs of commit 90fdd68 on the 2-core CPU
machine chose tcn packs of 1, 2 and 4 and transformer packs of 1 and 2, and the metrics of those trials differed
(most by 1e-8 to 1e-7, a few by 1e-4 to 2.7 %: tcn on p001), while runs that made the same choices were
bit-identical. With the size pinned the demo is reproducible on this machine: three saves from
90fdd68 were bit-identical (max relative difference 0.0 over 80 trials), so the default tolerance is 0: any
change in any metric is a change in behaviour. tools/demo_reference.json was saved that way from 90fdd68
(before the restructuring). It is a CPU run: on another machine (a GPU, another torch or BLAS,
enough time to measure bf16) the same code may choose or compute differently; compare there against a
reference saved there, and read the "plan choices that differ" line first.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_TOLERANCE = 0.0
"""Three saves from 90fdd68 with the pack size pinned were bit-identical (0.0 over 80 trials)."""
DEFAULT_PACK_SIZE = "2"
"""Packs of 2 exercise the fused-pack path; "auto" measures the size by timing (not reproducible)."""
TIMED = ("probe",)
"""Plan entries whose value is a time (seconds spent measuring), not a choice."""

Metrics = dict[str, dict[str, Any]]
"""trial_id -> {"family", "project", "seed", "status", "metrics": {"test.mae": float, ..., "naive.mae": ...}, "choices": {...}}."""


def run_demo(workdir: Path, pack_size: str) -> None:
    """`gpufill demo --fresh --yes` in `workdir` with this interpreter (and its PYTHONPATH); for a pinned pack
    size, `gpufill run` of a copy of the same demo file (in a temporary directory) with `resources.pack_size` set."""
    with tempfile.TemporaryDirectory(prefix="gpufill-demo-file-") as tmp:
        command = [sys.executable, "-m", "gpufill", "demo", "--fresh", "--yes", "--workdir", str(workdir)]
        if pack_size != "auto":
            import yaml

            from gpufill.campaign.runner import demo_campaign_path

            campaign = yaml.safe_load(demo_campaign_path().read_text())
            campaign.setdefault("resources", {})["pack_size"] = int(pack_size)
            copy = Path(tmp) / "demo.yaml"
            copy.write_text(yaml.safe_dump(campaign, sort_keys=False))
            command = [sys.executable, "-m", "gpufill", "run", str(copy), "--fresh", "--yes", "--workdir", str(workdir)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the demo failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def read_metrics(workdir: Path) -> Metrics:
    """Each trial's test and naive metrics and its plan's choice values, keyed by trial id, through the store's read API."""
    from gpufill.campaign.store import Store

    store = Store.open(workdir)
    try:
        out: Metrics = {}
        for record in store.records():
            details = store.trial_details(record["trial_id"]) or {}
            recorded = details.get("metrics") or {}
            flat = {f"{part}.{name}": value for part in ("test", "naive") for name, value in sorted((recorded.get(part) or {}).items())}
            choices = {name: choice["value"] for name, choice in sorted((details.get("plan") or {}).items())
                       if isinstance(choice, dict) and "value" in choice and name not in TIMED}
            out[record["trial_id"]] = {"family": record["family"], "project": record["project"], "seed": record["seed"],
                                       "status": record["status"], "metrics": flat, "choices": choices}
        return out
    finally:
        store.close()


def demo_metrics(workdir: Path | None, pack_size: str = DEFAULT_PACK_SIZE) -> Metrics:
    """Run the demo in `workdir` (in a new temporary directory when None) and read its metrics."""
    if workdir is not None:
        run_demo(workdir, pack_size)
        return read_metrics(workdir)
    with tempfile.TemporaryDirectory(prefix="gpufill-demo-") as tmp:
        run_demo(Path(tmp) / "demo", pack_size)
        return read_metrics(Path(tmp) / "demo")


def relative_difference(a: Any, b: Any) -> float:
    """|a - b| / max(|a|, |b|); 0 for equal values (NaN and NaN, None and None), inf where one side is missing or NaN."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else math.inf
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def compare(reference: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """{"per_metric": name -> max relative difference over the shared trials, "missing_current": ids only in the
    reference, "missing_reference": ids only in current, "choices": Counter of "name: old -> new" over shared trials,
    "max": the largest difference, "trials": how many trials are shared}."""
    shared = sorted(set(reference) & set(current))
    per_metric: dict[str, float] = {}
    choices: Counter[str] = Counter()
    for trial_id in shared:
        ref, cur = reference[trial_id]["metrics"], current[trial_id]["metrics"]
        for name in sorted(set(ref) | set(cur)):
            per_metric[name] = max(per_metric.get(name, 0.0), relative_difference(ref.get(name), cur.get(name)))
        old, new = reference[trial_id].get("choices", {}), current[trial_id].get("choices", {})
        choices.update(f"{reference[trial_id]['family']} {name}: {old.get(name)!r} -> {new.get(name)!r}"
                       for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name))
    return {"per_metric": per_metric, "missing_current": sorted(set(reference) - set(current)),
            "missing_reference": sorted(set(current) - set(reference)), "choices": choices,
            "max": max(per_metric.values(), default=0.0), "trials": len(shared)}


def report_lines(outcome: Mapping[str, Any]) -> list[str]:
    """What `compare` prints: one line per metric, the missing trial ids, the choices that differ, the max line last."""
    lines = [f"{name:<12} max relative difference {value!r}" for name, value in sorted(outcome["per_metric"].items())]
    lines.append(f"missing now (in the reference only): {', '.join(outcome['missing_current']) or 'none'}")
    lines.append(f"missing in the reference (new now): {', '.join(outcome['missing_reference']) or 'none'}")
    changed = ", ".join(f"{what} ({n} trials)" for what, n in sorted(outcome["choices"].items()))
    lines.append(f"plan choices that differ from the reference: {changed or 'none'}")
    lines.append(f"max relative difference: {outcome['max']!r} ({outcome['trials']} trials)")
    return lines


def passes(outcome: Mapping[str, Any], tolerance: float) -> bool:
    return not outcome["missing_current"] and not outcome["missing_reference"] and outcome["max"] <= tolerance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    save = sub.add_parser("save", help="run the demo and write its metrics")
    save.add_argument("out", type=Path)
    check = sub.add_parser("compare", help="run the demo and compare its metrics with a saved reference")
    check.add_argument("reference", type=Path)
    check.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    for each in (save, check):
        each.add_argument("--workdir", type=Path, default=None, help="where to run the demo (default: a temporary directory)")
        each.add_argument("--pack-size", default=DEFAULT_PACK_SIZE, help="pinned pack size (default 2), or auto as `gpufill demo` (measured)")
    args = parser.parse_args(argv)
    import gpufill

    source = str(Path(gpufill.__file__).resolve().parent)
    current = demo_metrics(args.workdir, args.pack_size)
    if args.command == "save":
        payload = {"gpufill": source, "pack_size": args.pack_size, "trials": current}
        args.out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
        print(f"{len(current)} trials written to {args.out} (gpufill from {source}, pack size {args.pack_size})")
        return 0
    saved = json.loads(args.reference.read_text())
    if saved.get("pack_size") != args.pack_size:
        print(f"note: the reference was saved with --pack-size {saved.get('pack_size')}, this run uses {args.pack_size}")
    outcome = compare(saved["trials"], current)
    print("\n".join(report_lines(outcome)))
    return 0 if passes(outcome, args.tolerance) else 1


if __name__ == "__main__":
    sys.exit(main())
