"""An LSTM forecaster on gpufill's synthetic series (or a CSV), scored against the last-value forecast.

The campaign's own building blocks: windows cut and scaled per project, a registered family,
mse in scaled space, MASE in the original scale.

    python examples/forecast_lstm.py --quick
    python examples/forecast_lstm.py --data sales.csv --lookback 60 --horizon 7 --device cuda
    gpufill bench --model lstm      # the forecaster bench needs no references
"""

from __future__ import annotations

import argparse
import sys

import rich
import torch

import gpufill
from gpufill.cli.render import plan_table
from gpufill.errors import exit_on_input_error
from gpufill.forecasting.data import Split
from gpufill.forecasting.data.metrics import mase
from gpufill.forecasting.models import registry
from gpufill.forecasting.task import load_windows, predict


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="synthetic", help="synthetic, a .csv/.parquet file, a directory or a glob")
    parser.add_argument("--quick", action="store_true", help="5 epochs (default 20)")
    parser.add_argument("--lookback", type=int, default=30)
    parser.add_argument("--horizon", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    windows = load_windows(args.data, project=None, lookback=args.lookback, horizon=args.horizon, split=Split())
    torch.manual_seed(0)
    model = registry.build("lstm", n_features=windows.n_features, lookback=args.lookback, horizon=args.horizon,
                           params={"hidden_size": args.hidden_size})

    def test_mase(network: torch.nn.Module) -> float:
        return mase(windows.test_truth, windows.inverse_target(predict(network, windows.x_test)), windows.mase_scale)

    before = test_mase(model)
    result = gpufill.fit(model, (windows.x_train, windows.y_train), (windows.x_val, windows.y_val), loss="mse",
                         epochs=args.epochs if args.epochs is not None else (5 if args.quick else 20), patience=5, device=args.device)
    rich.print(plan_table(result.plan))
    naive = mase(windows.test_truth, windows.naive_test, windows.mase_scale)
    print(f"{windows.name}: {windows.x_train.shape[0]} training windows; last-value forecast MASE {naive:.3f}")
    after = test_mase(result.model)
    print(f"before: test MASE {before:.3f}; after {result.metrics['epochs_run']} epochs: test MASE {after:.3f}; "
          f"{result.timings['samples_per_s']:,.0f} windows/s")
    return {"before": before, "after": after, "naive": naive}


if __name__ == "__main__":
    with exit_on_input_error("forecast_lstm.py"):
        main(sys.argv[1:])
