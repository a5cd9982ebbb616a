"""`gpufill bench` on each example of examples/: the guides' starting loop against gpufill, in one run per example.

Each example is named by reference, as a user names their own training (`--model
examples/X.py:make_model --data examples/X.py:make_data`); the before loop feeds batches the
guides' way (a per-sample Dataset in a plain DataLoader, `loss.item()` every step; the
language model's before loop accumulates micro-batches of 32 to its batch of 128, gpufill
picks its own micro-batch). Prints one table per example and a summary, writes the records
and the summary to bench/results/examples-<device>-<date>.json.

    .venv/bin/python bench/examples.py [--smoke | --quick] [--only lm_char,classify_digits] [--device cuda] [--out PATH]

Loops interleave (`gpufill bench`'s rounds: every loop each round, the order rotating), each
ratio the median of per-round ratios. --smoke: classify_digits only, one epoch, one round,
no ablation, no tuned hand loop (torch.compile) and no Lightning row (seconds, CI); --quick:
fewer epochs, 3 rounds, no ablation. On a CPU this process pins torch to one thread under
--smoke and --quick.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import environment, finish  # noqa: E402
from rich.console import Console  # noqa: E402

from gpufill.bench import BenchSettings, bench_table, run_bench, summary_lines, target_from_references  # noqa: E402
from gpufill.engine.hardware import resolve_device  # noqa: E402

# name -> (loss, before batch, before micro-batch, lr, epochs, quick epochs, gpufill settings)
EXAMPLES = {
    "lm_char": ("cross_entropy", 128, 32, 3e-3, 3, 1, {"weight_decay": 0.1}),
    "classify_digits": ("cross_entropy", 64, None, 3e-3, 5, 2, {}),
    "recsys_shards": ("bce_with_logits", 512, None, 3e-3, 3, 1, {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="classify_digits, one epoch, one round: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="fewer epochs, 3 rounds, no ablation")
    parser.add_argument("--only", help="comma-separated example names")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; --smoke 1)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    chosen = args.only.split(",") if args.only else ["classify_digits"] if args.smoke else list(EXAMPLES)
    unknown = sorted(set(chosen) - set(EXAMPLES))
    if unknown:
        parser.error(f"unknown example(s) {', '.join(unknown)}: use {', '.join(EXAMPLES)}")
    repeats = args.repeats or (1 if args.smoke else 3)
    if str(resolve_device(args.device)) == "cpu" and size_name != "full":
        torch.set_num_threads(1)
    left_out = []
    if args.smoke:
        left_out.append("smoke: the ablation, the tuned hand loop (torch.compile) and the Lightning row are left out; one epoch, one round")
        if not args.only:
            left_out.append(f"smoke: examples {', '.join(name for name in EXAMPLES if name not in chosen)} are left out")
    console = Console()
    for line in left_out:
        console.print(f"note: {line}")
    records, rows, ratios = {}, [], {}
    for name in chosen:
        loss, batch, micro, lr, epochs, quick_epochs, fit_options = EXAMPLES[name]
        reference = f"{ROOT / 'examples' / name}.py"
        target = target_from_references(f"{reference}:make_model", f"{reference}:make_data", loss=loss, batch_size=batch, micro_batch=micro,
                                        lr=lr, epochs=1 if args.smoke else quick_epochs if args.quick else epochs, fit_options=fit_options)
        settings = BenchSettings(device=args.device, repeats=repeats, ablation=size_name == "full", hand_tuned=not args.smoke, lightning=not args.smoke)
        with console.status(f"bench {name}") as spinner:
            report = run_bench(settings, target=target, progress=lambda text, name=name: spinner.update(f"bench {name}: {text}")).to_dict()
        console.print(bench_table(report))
        for line in summary_lines(report):
            console.print(line)
        records[name] = report
        before, gpufill = report["results"][0], report["results"][1]
        rows.append({"example": name, "loss": loss, "train_samples": report["args"]["train_samples"], "before_samples_per_s": before["samples_per_s"],
                     "gpufill_samples_per_s": gpufill["samples_per_s"], "before_val_loss": before["val_loss"], "gpufill_val_loss": gpufill["val_loss"],
                     "speedup": round(report["ratios"]["speedup"], 3), "round_spread": round(report["ratios"]["round_spread"], 3)})
        ratios[f"{name}_speedup"] = report["ratios"]["speedup"]
    env = environment(args.device)
    finish("examples", "gpufill / the guides' before loop, per example", env,
           {"size": size_name, "repeats": repeats, "threads": torch.get_num_threads(), "left_out": left_out,
            "examples": {name: EXAMPLES[name][:6] for name in chosen}, "records": records}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
