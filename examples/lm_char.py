"""A small GPT trained byte by byte on any text file (default: gpufill's own source).

Token and position embeddings, causal attention through scaled_dot_product_attention,
cross-entropy over the 256 byte values at every position; an effective batch of 128 reached by
accumulating micro-batches, AdamW with weight decay off biases and norms, warm-up + cosine
schedule, gradient clipping. gpufill.fit chooses the rest (precision, compile, data on the
device, micro-batch by measurement) and says why.

    python examples/lm_char.py --quick              # a minute on 2 CPU cores
    python examples/lm_char.py --text book.txt --layers 6 --width 384 --heads 6 --epochs 5   # a GPU
    python examples/lm_char.py --quick --nproc 2    # DDP under torchrun (CPU processes on gloo)
    gpufill bench --model examples/lm_char.py:make_model --data examples/lm_char.py:make_data --loss cross_entropy \
        --micro-batch 32 --lr 3e-3 --epochs 2     # before: micro-batches of 32 accumulated; gpufill: its own
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import rich
import torch
from torch import nn
from torch.nn import functional as F

import gpufill
from gpufill.bench import validation_loss
from gpufill.cli.render import plan_table
from gpufill.engine.launch import relaunch_under_torchrun, under_torchrun
from gpufill.errors import InputError, exit_on_input_error

SOURCE = Path(gpufill.__file__).parent
"""The default text: every .py file of the installed gpufill package."""


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash / memory-efficient kernels where available
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, width: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied input and output embeddings, as GPT-2
        self.register_buffer("index", torch.arange(context), persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        """GPT-2's: small normal weights, zero biases (torch's default N(0, 1) embeddings make the tied logits huge)."""
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(self.index[: ids.shape[1]])
        return self.head(self.norm(self.blocks(x)))  # (batch, positions, vocabulary) logits


def read_text(path: str | None, limit: int | None) -> str:
    """The text of `path`, or gpufill's own source; at most `limit` characters."""
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise InputError(f"no text file {path!r}", field="--text", fix="pass a path to a text file")
        text = file.read_text(errors="replace")
    else:
        text = "\n".join(p.read_text() for p in sorted(SOURCE.rglob("*.py")))
    return text[:limit] if limit else text


def windows(ids: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (input, next-character target) windows of `context` characters."""
    n = (len(ids) - 1) // context
    x = ids[: n * context].view(n, context)
    y = ids[1 : n * context + 1].view(n, context)
    return x, y


VOCAB = 256
"""Byte-level: every text's vocabulary is the 256 byte values (no tokenizer to ship)."""


def make_data(text: str | None = None, *, context: int = 32, limit: int | None = 160_000, val_share: float = 0.1) -> dict:
    """{"train": (x, y), "val": (x, y)}: byte ids of the text, the last `val_share` held out (defaults: CPU-sized)."""
    content = read_text(text, limit).encode()
    if len(content) < 20 * context:
        raise InputError(f"the text has {len(content)} bytes, too few for windows of {context}", field="--text",
                         fix="pass a longer text or a smaller --context")
    ids = torch.frombuffer(bytearray(content), dtype=torch.uint8).long()
    cut = int(len(ids) * (1 - val_share))
    return {"train": windows(ids[:cut], context), "val": windows(ids[cut:], context)}


def make_model(*, context: int = 32, width: int = 64, layers: int = 2, heads: int = 4) -> GPT:
    if width % heads:
        raise InputError(f"width {width} is not a multiple of heads {heads}", field="--width", fix=f"pass e.g. --width {heads * 16}")
    torch.manual_seed(0)
    return GPT(VOCAB, context, width, layers, heads)


def _whole(option: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"{option} must be a whole number >= 1 or auto, got {text!r}", field=option, fix=f"pass e.g. {option} 32")
    return int(text)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", help="a text file (default: gpufill's own source)")
    parser.add_argument("--quick", action="store_true", help="CPU-sized: 160,000 bytes, context 32, 6 epochs")
    parser.add_argument("--context", type=int, help="characters per window (default 256; --quick: 32)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--micro-batch", default="auto",
                        help="samples per forward, accumulated to the batch of 128 (default: gpufill's choice; a GPU measures it)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--nproc", type=int, default=1, help="data-parallel processes under torchrun")
    args = parser.parse_args(argv)
    if args.nproc > 1 and not under_torchrun():
        raise SystemExit(relaunch_under_torchrun(args.nproc, [__file__], argv))
    args.context = args.context or (32 if args.quick else 256)
    micro_batch = args.micro_batch if args.micro_batch == "auto" else _whole("--micro-batch", args.micro_batch)
    for name in ("context", "width", "layers", "heads", "epochs", "nproc"):
        value = getattr(args, name)
        if value is not None and value < 1:
            option = "--" + name.replace("_", "-")
            raise InputError(f"{option} must be at least 1, got {value}", field=option, fix=f"pass e.g. {option} 2")
    data = make_data(args.text, context=args.context, limit=160_000 if args.quick else None)
    model = make_model(context=args.context, width=args.width, layers=args.layers, heads=args.heads)
    before = validation_loss(model, data["val"], "cross_entropy")
    result = gpufill.fit(model, data["train"], data["val"], loss="cross_entropy", epochs=args.epochs if args.epochs is not None else (6 if args.quick else 10),
                         batch_size=128, micro_batch=micro_batch, lr=args.lr, optimizer="adamw", weight_decay=0.1,
                         schedule="warmup_cosine", grad_clip=1.0, device=args.device)
    if int(os.environ.get("RANK", "0")) == 0:  # under DDP rank 0 reports for all
        rich.print(plan_table(result.plan))
        for event in result.events:  # what happened besides the plan: DDP ranks, casts, out-of-memory retries
            print(f"note: {event}")
        after = result.metrics["val_loss"]
        print(f"before: val loss {before:.3f} (perplexity {math.exp(before):.1f}); after {result.metrics['epochs_run']} epochs: "
              f"val loss {after:.3f} (perplexity {math.exp(after):.1f}), accuracy {result.metrics['val_accuracy']:.3f}; "
              f"{result.timings['samples_per_s']:,.0f} windows/s")
    return {"before": before, "after": result.metrics["val_loss"], "accuracy": result.metrics["val_accuracy"],
            "accumulation": result.plan.accumulation.value}


if __name__ == "__main__":
    with exit_on_input_error("lm_char.py"):
        main(sys.argv[1:])
