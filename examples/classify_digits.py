"""A small CNN classifying scikit-learn's bundled 8x8 digits: integer labels, cross-entropy, accuracy.

    python examples/classify_digits.py --quick     # seconds on a CPU
    gpufill bench --model examples/classify_digits.py:make_model --data examples/classify_digits.py:make_data \
        --loss cross_entropy --batch-size 64 --fit batch_size=64
"""

from __future__ import annotations

import argparse
import sys

import rich
import torch
from sklearn.datasets import load_digits
from torch import nn

import gpufill
from gpufill.bench import validation_loss
from gpufill.cli.render import plan_table
from gpufill.errors import InputError, exit_on_input_error

TEST_SHARE = 0.2


def make_data(seed: int = 0) -> dict:
    """{"train", "val"}: 1,797 images (1, 8, 8) scaled to [0, 1] with integer labels; a fifth held out (stratified by shuffling)."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - TEST_SHARE))
    train, test = order[:cut], order[cut:]
    return {"train": (images[train], labels[train]), "val": (images[test], labels[test])}


def make_model(channels: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(2 * channels * 16, 10),
    )


@torch.no_grad()
def accuracy(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    images, labels = data
    device = next(model.parameters()).device
    return (model(images.to(device)).argmax(1).cpu() == labels).float().mean().item()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 epochs (default 20)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    if args.channels < 1:
        raise InputError(f"--channels must be at least 1, got {args.channels}", field="--channels", fix="pass e.g. --channels 16")
    data = make_data()
    model = make_model(args.channels)
    before = accuracy(model, data["val"]), validation_loss(model, data["val"], "cross_entropy")
    result = gpufill.fit(model, data["train"], data["val"], loss="cross_entropy", epochs=args.epochs if args.epochs is not None else (8 if args.quick else 20),
                         batch_size=args.batch_size, lr=args.lr, device=args.device)
    rich.print(plan_table(result.plan))
    after = accuracy(result.model, data["val"])
    print(f"before: test accuracy {before[0]:.3f} (loss {before[1]:.3f}); after {result.metrics['epochs_run']} epochs: "
          f"test accuracy {after:.3f} (loss {result.metrics['val_loss']:.3f}); {result.timings['samples_per_s']:,.0f} images/s")
    return {"before": before[0], "after": after, "val_accuracy": result.metrics["val_accuracy"]}


if __name__ == "__main__":
    with exit_on_input_error("classify_digits.py"):
        main(sys.argv[1:])
