"""gpufill.fit against the guides' starting loop: one LSTM forecaster, same data, same epochs.

A third loop, "minimal" (a careful hand-written fp32 loop: resident tensors, fused AdamW,
no per-step sync), shows the ceiling of the data-path fixes at the same batch, so the
table says both how far gpufill is from the baseline and how close to that ceiling.

    python bench/fit_speed.py [--quick] [--epochs N] [--repeats N] [--device auto|cpu|cuda] [--out PATH]

Prints a table (samples/s, epoch time, final validation loss, peak memory) and the ratios
gpufill / baseline, and writes them as JSON (device, torch version and date included).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.bench import compare  # noqa: E402
from gpufill.forecasting.data import Split, load_projects, make_windows  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a couple of minutes on 2 CPU cores")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats; the median run is reported")
    parser.add_argument("--length", type=int, default=None, help="synthetic series length")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--lookback", type=int, default=30)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    epochs = args.epochs or (4 if args.quick else 10)
    repeats = args.repeats or (3 if args.quick else 7)
    length = args.length or (2000 if args.quick else 5000)

    project = next(iter(load_projects("synthetic", n_projects=1, length=length, seed=0).values()))
    windows = make_windows(project, args.lookback, 1, Split(val=0.1, test=0.2))
    train, val = (windows.x_train, windows.y_train), (windows.x_val, windows.y_val)

    def make_model() -> torch.nn.Module:
        torch.manual_seed(0)  # every loop starts from the same weights
        return registry.build("lstm", n_features=windows.n_features, lookback=args.lookback, horizon=1, params={"hidden_size": args.hidden_size})

    env = environment(args.device)
    comparison = compare(make_model, train, val, epochs=epochs, device=args.device, repeats=repeats, minimal=True)
    ratios = {
        "samples_per_s_gpufill_over_baseline": comparison.speedup(),
        "val_loss_gpufill_over_baseline": comparison.quality_ratio(),
        # The ceiling of the data-path and sync fixes at this batch, and what gpufill adds beyond them.
        "samples_per_s_minimal_over_baseline": comparison.minimal_over_baseline(),
        "samples_per_s_gpufill_over_minimal": comparison.gpufill_over_minimal(),
    }
    rows = comparison.rows()
    rows[1]["speedup_per_pair"] = [round(g.samples_per_s / b.samples_per_s, 3) for b, g in zip(comparison.baseline, comparison.gpufill, strict=True)]
    run_args = {"model": "lstm", "hidden_size": args.hidden_size, "lookback": args.lookback, "horizon": 1, "series_length": length,
                "train_windows": int(train[0].shape[0]), "epochs": epochs, "repeats": repeats, "quick": args.quick}
    finish("fit_speed", "LSTM forecaster, baseline loop vs gpufill.fit", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
