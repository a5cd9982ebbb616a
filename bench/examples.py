"""`gpufill bench` on each example of examples/: the guides' starting loop against gpufill, in one run per example.

Each example is named by reference, as a user names their own training (`--model
examples/X.py:make_model --data examples/X.py:make_data`); the before loop feeds batches the
guides' way (a per-sample Dataset in a plain DataLoader, `loss.item()` every step; the
language model's before loop accumulates micro-batches of 32 to its batch of 128, gpufill
picks its own micro-batch). Prints one table per example and a summary, writes the records
and the summary to bench/results/examples-<device>-<date>.json.

    .venv/bin/python bench/examples.py [--quick] [--only lm_char,classify_digits] [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import environment, finish  # noqa: E402
from rich.console import Console  # noqa: E402

from gpufill.bench import BenchSettings, bench_table, run_bench, summary_lines, target_from_references  # noqa: E402

# name -> (loss, before batch, before micro-batch, lr, epochs, quick epochs, gpufill settings)
EXAMPLES = {
    "lm_char": ("cross_entropy", 128, 32, 3e-3, 3, 1, {"weight_decay": 0.1}),
    "classify_digits": ("cross_entropy", 64, None, 3e-3, 5, 2, {}),
    "recsys_shards": ("bce_with_logits", 512, None, 3e-3, 3, 1, {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs and rounds (a smoke run, not a measurement)")
    parser.add_argument("--only", help="comma-separated example names")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(EXAMPLES)
    console = Console()
    records, rows, ratios = {}, [], {}
    for name in chosen:
        loss, batch, micro, lr, epochs, quick_epochs, fit_options = EXAMPLES[name]
        reference = f"{ROOT / 'examples' / name}.py"
        target = target_from_references(f"{reference}:make_model", f"{reference}:make_data", loss=loss, batch_size=batch, micro_batch=micro,
                                        lr=lr, epochs=quick_epochs if args.quick else epochs, fit_options=fit_options)
        settings = BenchSettings(device=args.device, repeats=1 if args.quick else args.repeats, ablation=not args.quick)
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
           {"repeats": 1 if args.quick else args.repeats, "quick": args.quick, "examples": {name: EXAMPLES[name][:6] for name in chosen},
            "records": records}, rows, ratios, args.out)


if __name__ == "__main__":
    main()
