"""Fused packs against one model at a time: training samples/s per family and pack size K.

    python bench/pack_speed.py [--smoke | --quick] [--rounds N] [--device auto|cpu|cuda] [--out PATH]

For each family and size, a few training steps (forward, backward, AdamW) of K fused
models against the plain model (K = 1: one model at a time, its own kernels, e.g.
cuDNN/oneDNN RNNs), all in this run. The ratio is fused samples/s over plain samples/s:
above 1, fusing K trials beats running them one after another on this device.
`ops_per_step` counts the computing operators of one step (forward, loss, backward,
optimizer; `gpufill.engine.measure.ops`): about one kernel launch each, so on a GPU it is
what a small pack's step costs in host time (5-10 us a launch), on any machine.

The sizes interleave: each round times every K, each round starting with a different one;
a row's samples/s is the median over rounds and its `vs_plain` the median of per-round
ratios (K's samples/s over K = 1's in the same round); a family's "best fused / plain" is the
largest of those medians. --smoke: MLP and LSTM (small), K 1 and 2, one step, one round
(seconds, CI); --quick: the small shapes, K up to 8, 3 rounds; default: both shape sets, K up
to 64, 3 rounds. On a CPU torch is pinned to one thread under --smoke and --quick.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402
from gpufill.engine.backend import is_out_of_memory  # noqa: E402
from gpufill.engine.packs.size import _time_candidate, _training_step  # noqa: E402  (measure_pack_size's own timing)

SHAPES = {
    "small (demo)": {"lstm": {"hidden_size": 32}, "gru": {"hidden_size": 32}, "tcn": {"channels": 32},
                     "transformer": {"d_model": 32, "nhead": 4, "num_layers": 1}, "mlp": {"hidden_size": 64}},
    "ablation": {"lstm": {"hidden_size": 128}, "gru": {"hidden_size": 128}, "tcn": {"channels": 64},
                 "transformer": {"d_model": 64, "nhead": 4, "num_layers": 2}, "mlp": {"hidden_size": 128}},
}


SMOKE_SHAPES = {"small (demo)": {"mlp": {"hidden_size": 64}, "lstm": {"hidden_size": 32}}}
RUNS = {  # shape sets, K sizes, timed steps per measurement, rounds, lookback, batch
    "smoke": (SMOKE_SHAPES, (1, 2), 1, 1, 12, 32),
    "quick": ({"small (demo)": SHAPES["small (demo)"]}, (1, 2, 4, 8), 3, 3, 30, 128),
    "full": (SHAPES, (1, 2, 4, 8, 16, 32, 64), 6, 3, 30, 128),
}


def measure(build, k: int, x: torch.Tensor, y: torch.Tensor, device: torch.device, steps: int, count: bool) -> tuple[float | None, int | None]:
    """(samples/s, operators per step when counted) of K fused models (K = 1: the plain model); (None, None) if it does not fit in memory."""
    try:
        seconds, counted = _time_candidate(_training_step(build, k, x, y, device), steps, device, count=count)
    except Exception as error:
        if k == 1 or not is_out_of_memory(error):
            raise
        torch.cuda.empty_cache()
        return None, None
    return k * x.shape[0] * steps / seconds, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="MLP and LSTM, K 1 and 2, one step, one round: seconds (CI)")
    size.add_argument("--quick", action="store_true", help="small shapes only, K up to 8, 3 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--lookback", type=int, default=None, help="default 30 (--smoke 12)")
    parser.add_argument("--batch", type=int, default=None, help="default 128 (--smoke 32)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    shapes, sizes, steps, rounds, lookback, batch = RUNS[size_name]
    rounds, lookback, batch = args.rounds or rounds, args.lookback or lookback, args.batch or batch
    device = resolve_device(args.device)
    if device.type == "cpu" and size_name != "full":
        torch.set_num_threads(1)
    env = environment(str(device))
    x = torch.randn(batch, lookback, 3).to(device)
    y = torch.randn(batch, 1).to(device)
    rows, ratios = [], {}
    for shape_name, families in shapes.items():
        for family, params in families.items():
            def build(family=family, params=params) -> torch.nn.Module:
                return registry.build(family, n_features=3, lookback=lookback, horizon=1, params=params)

            rates: dict[int, list[float]] = {k: [] for k in sizes}
            ops: dict[int, int | None] = {}
            too_big: set[int] = set()
            for r in range(rounds):
                shift = r % len(sizes)  # each round starts at a different K: drift hits every size alike
                for k in sizes[shift:] + sizes[:shift]:
                    if k in too_big:
                        continue
                    rate, counted = measure(build, k, x, y, device, steps, count=k not in ops)
                    if rate is None:
                        too_big.add(k)
                        continue
                    rates[k].append(rate)
                    ops.setdefault(k, counted)
            measured = [k for k in sizes if k not in too_big]
            per_round = {k: [rate / plain for rate, plain in zip(rates[k], rates[1], strict=True)] for k in measured}
            for k in measured:
                rows.append({"config": f"{family} {shape_name}", "params": str(params), "K": k, "samples_per_s": round(statistics.median(rates[k]), 1),
                             "vs_plain": round(statistics.median(per_round[k]), 3), "ops_per_step": ops[k],
                             "samples_per_s_runs": [round(rate, 1) for rate in rates[k]]})
            fused = [statistics.median(per_round[k]) for k in measured if k > 1]
            if fused:
                ratios[f"{family} {shape_name}: best fused / plain"] = max(fused)
            if too_big:
                print(f"note: {family} {shape_name}: K {', '.join(map(str, sorted(too_big)))} did not fit in memory", flush=True)
    run_args = {"size": size_name, "lookback": lookback, "batch": batch, "sizes": list(sizes), "steps": steps, "rounds": rounds,
                "threads": torch.get_num_threads(), "device": str(device)}
    finish("pack_speed", "fused packs vs one model at a time", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
