"""Fused packs against one model at a time: training samples/s per family and pack size K.

    python bench/pack_speed.py [--quick] [--device auto|cpu|cuda] [--out PATH]

For each family and size, a few training steps (forward, backward, AdamW) of K fused
models against the plain model (K = 1: one model at a time, its own kernels, e.g.
cuDNN/oneDNN RNNs), all in this run. The ratio is fused samples/s over plain samples/s:
above 1, fusing K trials beats running them one after another on this device.
`ops_per_step` counts the computing operators of one step (forward, loss, backward,
optimizer; `gpufill.engine.measure.ops`): about one kernel launch each, so on a GPU it is
what a small pack's step costs in host time (5-10 us a launch), on any machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import environment, finish  # noqa: E402

from gpufill.engine.hardware import resolve_device  # noqa: E402
from gpufill.forecasting.models import registry  # noqa: E402
from gpufill.engine.measure.pack import measure_pack_size  # noqa: E402

SHAPES = {
    "small (demo)": {"lstm": {"hidden_size": 32}, "gru": {"hidden_size": 32}, "tcn": {"channels": 32},
                     "transformer": {"d_model": 32, "nhead": 4, "num_layers": 1}, "mlp": {"hidden_size": 64}},
    "ablation": {"lstm": {"hidden_size": 128}, "gru": {"hidden_size": 128}, "tcn": {"channels": 64},
                 "transformer": {"d_model": 64, "nhead": 4, "num_layers": 2}, "mlp": {"hidden_size": 128}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes only, K up to 8")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--lookback", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = str(resolve_device(args.device))
    sizes = (1, 2, 4, 8) if args.quick else (1, 2, 4, 8, 16, 32, 64)
    shapes = {"small (demo)": SHAPES["small (demo)"]} if args.quick else SHAPES
    env = environment(device)
    x = torch.randn(args.batch, args.lookback, 3)
    y = torch.randn(args.batch, 1)
    rows, ratios = [], {}
    for shape_name, families in shapes.items():
        for family, params in families.items():
            def build(family=family, params=params) -> torch.nn.Module:
                return registry.build(family, n_features=3, lookback=args.lookback, horizon=1, params=params)

            choice = measure_pack_size(build, (x, y), batch=args.batch, device=device, candidates=sizes, steps=3 if args.quick else 6, count=True, min_gain=None)
            plain = choice.samples_per_s[1]
            for k, rate in choice.samples_per_s.items():
                rows.append({"config": f"{family} {shape_name}", "params": str(params), "K": k, "samples_per_s": round(rate, 1), "vs_plain": round(rate / plain, 3),
                             "ops_per_step": choice.ops_per_step[k]})
            ratios[f"{family} {shape_name}: best fused / plain"] = max(r for k, r in choice.samples_per_s.items() if k > 1) / plain
    run_args = {"lookback": args.lookback, "batch": args.batch, "sizes": list(sizes), "quick": args.quick, "device": device}
    finish("pack_speed", "fused packs vs one model at a time", env, run_args, rows, ratios, args.out)


if __name__ == "__main__":
    main()
