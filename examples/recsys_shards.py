"""A click-through model over a data set sharded into name_partN.csv files, streamed through a DataLoader.

Each shard is read in chunks by a streaming IterableDataset; DataLoader workers split the shards
between them, so adding workers adds readers. Categorical ids (user, item, hour) go through
embeddings, numbers through a linear layer; the model returns one logit per impression and is
trained with bce_with_logits. Scored by log-loss against the constant predictor (the click rate)
and by AUC. The shards are generated here (`--make-shards DIR`) from a known click model.

    python examples/recsys_shards.py --quick                     # generates shards in a temp dir
    python examples/recsys_shards.py --shards data/clicks --rows 5_000_000 --workers 8 --device cuda
    gpufill bench --model examples/recsys_shards.py:make_model --data examples/recsys_shards.py:make_data \
        --loss bce_with_logits --batch-size 512 --no-hand-loop
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import rich
import torch
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

import gpufill
from gpufill.cli.render import plan_table
from gpufill.errors import InputError, exit_on_input_error

USERS, ITEMS, HOURS = 200, 100, 24
CATEGORICAL = ("user", "item", "hour")
NUMERIC = ("price", "position")
CHUNK_ROWS = 4096
"""Rows per read of a shard: memory stays flat whatever the shard's size."""


def make_shards(directory: str | Path, *, parts: int = 4, rows: int = 40_000, name: str = "clicks", seed: int = 0) -> list[Path]:
    """Write `parts` shards name_part0.csv ... of `rows` impressions in all; clicks drawn from a known logistic model."""
    rng = np.random.default_rng(seed)
    user_taste = rng.normal(0, 1, (USERS, 4))
    item_style = rng.normal(0, 1, (ITEMS, 4))
    hour_effect = 1.0 * np.sin(np.arange(HOURS) / HOURS * 2 * np.pi)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for part in range(parts):
        n = rows // parts
        frame = pd.DataFrame({"user": rng.integers(0, USERS, n), "item": rng.integers(0, ITEMS, n), "hour": rng.integers(0, HOURS, n),
                              "price": rng.lognormal(3, 0.5, n).round(2), "position": rng.integers(1, 11, n)})
        logit = ((user_taste[frame.user] * item_style[frame["item"]]).sum(1) - 2.0 + hour_effect[frame.hour]
                 - 0.03 * (frame.price - 20) - 0.25 * (frame.position - 1))
        frame["click"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int8)
        path = directory / f"{name}_part{part}.csv"
        frame.to_csv(path, index=False)
        paths.append(path)
    return paths


def _tensors(frame: pd.DataFrame) -> dict[str, torch.Tensor]:
    """One chunk as a dict batch: ids (n, 3) long, numbers (n, 2) float (log price, position / 10), click (n,) float."""
    return {"ids": torch.from_numpy(frame[list(CATEGORICAL)].to_numpy(np.int64)),
            "numbers": torch.from_numpy(np.stack([np.log(frame.price.to_numpy(np.float32)), frame.position.to_numpy(np.float32) / 10], 1)),
            "click": torch.from_numpy(frame.click.to_numpy(np.float32))}


class ShardStream(IterableDataset):
    """Impressions of the shards, one sample at a time; worker w of W reads shards w, w+W, ... ."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        worker = get_worker_info()
        mine = self.paths[worker.id :: worker.num_workers] if worker else self.paths
        for path in mine:
            for frame in pd.read_csv(path, chunksize=CHUNK_ROWS):
                chunk = _tensors(frame)
                for i in range(len(frame)):
                    yield {"ids": chunk["ids"][i], "numbers": chunk["numbers"][i]}, chunk["click"][i]


class ClickModel(nn.Module):
    def __init__(self, width: int = 16, hidden: int = 64):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(size, width) for size in (USERS, ITEMS, HOURS))
        self.mlp = nn.Sequential(nn.Linear(3 * width + len(NUMERIC), hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = features["ids"]
        embedded = [table(ids[:, i]) for i, table in enumerate(self.embeddings)]
        return self.mlp(torch.cat([*embedded, features["numbers"]], dim=1)).squeeze(1)  # one logit per impression


def make_model(width: int = 16, hidden: int = 64) -> ClickModel:
    torch.manual_seed(0)
    return ClickModel(width, hidden)


def split(paths: list[Path]) -> dict:
    """{"train": a stream over all shards but the last, "val": the last shard as tensors}."""
    if len(paths) < 2:
        raise InputError(f"{len(paths)} shard(s) found: one is held out for validation, so at least two are needed", field="--shards",
                         fix="point --shards at a directory of name_part0.csv, name_part1.csv, ...")
    frame = pd.read_csv(paths[-1])
    missing = sorted({*CATEGORICAL, *NUMERIC, "click"} - set(frame.columns))
    if missing:
        raise InputError(f"{paths[-1]} has no column(s) {', '.join(missing)}", field="--shards", fix="write shards with make_shards, or rename the columns")
    val = _tensors(frame)
    return {"train": ShardStream(paths[:-1]), "val": ({"ids": val["ids"], "numbers": val["numbers"]}, val["click"])}


_GENERATED: list[Path] = []


def make_data() -> dict:
    """CPU-sized shards generated once per process in a temporary directory (for `gpufill bench --data`)."""
    if not _GENERATED:
        _GENERATED.extend(make_shards(tempfile.mkdtemp(prefix="gpufill-clicks-"), rows=40_000))
    return split(_GENERATED)


def find_shards(directory: str) -> list[Path]:
    paths = sorted(Path(directory).glob("*_part*.csv"), key=lambda p: int(p.stem.rpartition("_part")[2] or 0))
    if not Path(directory).is_dir():
        raise InputError(f"no directory {directory!r}", field="--shards", fix="pass a directory of name_partN.csv files, or --make-shards DIR")
    return paths


@torch.no_grad()
def scores(model: nn.Module, val: tuple[dict[str, torch.Tensor], torch.Tensor]) -> tuple[float, float]:
    """(log-loss, AUC) of the model on the held-out shard."""
    model.eval()
    device = next(model.parameters()).device
    features, clicks = val
    logits = model({k: v.to(device) for k, v in features.items()}).float().cpu()
    return nn.functional.binary_cross_entropy_with_logits(logits, clicks).item(), roc_auc_score(clicks.numpy(), logits.numpy())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", help="a directory of name_partN.csv files (default: generate them)")
    parser.add_argument("--make-shards", metavar="DIR", help="write generated shards here and train on them")
    parser.add_argument("--rows", type=int, default=200_000, help="impressions to generate (--quick: 40,000)")
    parser.add_argument("--quick", action="store_true", help="40,000 impressions, 3 epochs")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--workers", default="auto", help="DataLoader workers reading shards (default: measured)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    if args.shards:
        paths = find_shards(args.shards)
    else:
        paths = make_shards(args.make_shards or tempfile.mkdtemp(prefix="gpufill-clicks-"), rows=40_000 if args.quick else args.rows)
    data = split(paths)
    rate = data["val"][1].mean().item()
    constant = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    model = make_model()
    before = scores(model, data["val"])
    workers = args.workers if args.workers == "auto" else int(args.workers)
    result = gpufill.fit(model, data["train"], data["val"], loss="bce_with_logits", epochs=args.epochs if args.epochs is not None else (3 if args.quick else 5),
                         batch_size=args.batch_size, lr=args.lr, num_workers=workers, device=args.device)
    rich.print(plan_table(result.plan))
    after = scores(result.model, data["val"])
    print(f"{len(paths)} shards in {paths[0].parent}; click rate {rate:.3f}, constant predictor log-loss {constant:.4f}")
    print(f"before: log-loss {before[0]:.4f}, AUC {before[1]:.3f}; after {result.metrics['epochs_run']} epochs: log-loss {after[0]:.4f}, "
          f"AUC {after[1]:.3f}; {result.timings['samples_per_s']:,.0f} impressions/s")
    return {"constant": constant, "log_loss": after[0], "auc": after[1], "before_log_loss": before[0], "shards": len(paths)}


if __name__ == "__main__":
    with exit_on_input_error("recsys_shards.py"):
        main(sys.argv[1:])
