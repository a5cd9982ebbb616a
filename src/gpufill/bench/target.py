"""What `gpufill bench` and `gpufill doctor` train: any model, data and loss, named by reference.

A `BenchTarget` is a model factory, training and validation data in any form fit takes, a
loss (a name or `fn(model, batch)`), the guides' batch and learning rate, and gpufill's own
settings. On the command line the pieces are references: `--model pkg.mod:make_model` (called
with no arguments), `--data pkg.mod:make_data` and `--loss NAME|pkg.mod:fn`. `make_data()`
returns the training data, or a dict with "train" and optionally "val" (without "val", the
last tenth of tensor data is held out; other data are scored on the training data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from gpufill.engine import losses
from gpufill.engine.batches import rows, sample_count
from gpufill.engine.config import DEFAULTS, FitConfig
from gpufill.engine.inputs import Data, as_source
from gpufill.errors import InputError
from gpufill.user_code import is_reference, load_object

VAL_SHARE = 0.1
"""Held out of tensor data for validation when make_data gives no "val"."""


@dataclasses.dataclass(kw_only=True)
class BenchTarget:
    """One training to measure: the same model, data and loss for every loop."""

    name: str
    make_model: Callable[[], nn.Module]
    """Called once per run; it must give the same initial weights each time (seed inside)."""
    train: Data
    val: Data
    loss: Any = "mse"
    batch_size: int = 128
    """The guides' batch (and gpufill's effective batch unless fit_options say otherwise)."""
    micro_batch: int | None = None
    """The guides' accumulation: loader batches of this size, batch_size // micro_batch per step."""
    lr: float = DEFAULTS.lr
    epochs: int = DEFAULTS.epochs
    fit_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """FitConfig fields for gpufill's run (its automatic plan for the rest)."""
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What the record says about the training (shapes, sizes) besides the above."""

    def validate(self, where: str = "bench") -> None:
        losses.resolve(self.loss)
        unknown = sorted(set(self.fit_options) - {f.name for f in dataclasses.fields(FitConfig)})
        if unknown:
            raise InputError(f"unknown setting(s) {', '.join(unknown)}", where=where, field="fit_options",
                             fix="use FitConfig fields (see help(gpufill.FitConfig))")
        FitConfig(**{"loss": self.loss, "lr": self.lr, "epochs": self.epochs, "batch_size": self.batch_size, **self.fit_options}).validate()
        if self.micro_batch is not None and not (isinstance(self.micro_batch, int) and 1 <= self.micro_batch <= self.batch_size):
            raise InputError(f"micro_batch {self.micro_batch!r} must be a whole number from 1 to the batch {self.batch_size}", where=where,
                             field="micro_batch", fix="pass a micro-batch that divides the batch, e.g. batch_size // 4")

    def record(self) -> dict[str, Any]:
        loss = self.loss if isinstance(self.loss, str) else getattr(self.loss, "__qualname__", type(self.loss).__name__)
        train_samples = as_source(self.train, "train").n
        return {"target": self.name, **self.args, "loss": loss, "batch_size": self.batch_size, "micro_batch": self.micro_batch, "lr": self.lr,
                "train_samples": train_samples, "epochs": self.epochs,
                "fit_options": {k: v if isinstance(v, str | int | float | bool | None) else repr(v) for k, v in self.fit_options.items()}}


def split_data(made: Any, reference: str, *, field: str = "--data", where: str = "bench") -> tuple[Data, Data]:
    """(train, val) from what make_data returned (see the module docstring)."""
    if isinstance(made, Mapping) and "train" in made:
        unknown = sorted(set(made) - {"train", "val"})
        if unknown:
            raise InputError(f"{reference} returned keys {unknown} besides train and val", where=where, field=field,
                             fix="return the training data, or {'train': ..., 'val': ...}")
        train, val = made["train"], made.get("val")
    else:
        train, val = made, None
    source = as_source(train, "train")  # a bad structure is one line here, before any timing
    if val is not None:
        as_source(val, "val")
        return source.data if source.kind == "tensors" else train, val
    if source.kind != "tensors":
        return train, train
    n = sample_count(source.data, "train")
    cut = n - max(1, round(VAL_SHARE * n))
    return rows(source.data, 0, cut), rows(source.data, cut, n)


def target_from_references(model: str, data: str, *, loss: str = "mse", batch_size: int = 128, micro_batch: int | None = None,
                           lr: float = DEFAULTS.lr, epochs: int = DEFAULTS.epochs, fit_options: Mapping[str, Any] | None = None,
                           where: str = "bench") -> BenchTarget:
    """A BenchTarget from `--model pkg.mod:factory --data pkg.mod:make_data --loss NAME|pkg.mod:fn`; bad input is one line."""
    for option, value in (("--model", model), ("--data", data)):
        if not is_reference(value):
            raise InputError(f"{value!r} is not a reference", where=where, field=option, fix="write it as e.g. mypkg.train:make_model or train.py:make_model")
    factory = load_object(model, field="--model", where=where)
    make_data = load_object(data, field="--data", where=where)
    loss_value = load_object(loss, field="--loss", where=where) if is_reference(loss) else loss
    for option, reference, value in (("--model", model, factory), ("--data", data, make_data)):
        if not callable(value):
            raise InputError(f"{reference} is a {type(value).__name__}, not a function", where=where, field=option,
                             fix="name a function defined in that module")
    try:
        losses.resolve(loss_value)
    except InputError as error:
        raise InputError(error.problem, where=where, field="--loss", fix=error.fix) from None
    try:
        train, val = split_data(_call(make_data, data, "--data", where), data, where=where)
    except InputError as error:
        if error.field == "--data":
            raise
        raise InputError(f"{data}() returned data that fit cannot take: {error.problem}", where=where, field="--data", fix=error.fix) from None
    first = _call(factory, model, "--model", where)
    if not isinstance(first, nn.Module):
        raise InputError(f"{model} returned a {type(first).__name__}, not a torch.nn.Module", where=where, field="--model",
                         fix="return the model (an nn.Module) from the factory")

    def make_model() -> nn.Module:
        torch.manual_seed(0)  # every loop starts from the same weights
        return factory()

    count = sum(p.numel() for p in first.parameters())
    target = BenchTarget(name=model.rpartition("/")[2].replace(".py:", ":"), make_model=make_model, train=train, val=val, loss=loss_value, batch_size=batch_size,
                         micro_batch=micro_batch, lr=lr, epochs=epochs, fit_options={"batch_size": batch_size, **(fit_options or {})},
                         args={"model": model, "data": data, "parameters": count})
    try:
        target.validate(where)
    except InputError as error:
        raise InputError(error.problem, where=where, field=_OPTION.get(error.field or "", f"--fit {error.field}"), fix=error.fix) from None
    return target


_OPTION = {"batch_size": "--batch-size", "micro_batch": "--micro-batch", "lr": "--lr", "epochs": "--epochs", "loss": "--loss", "fit_options": "--fit"}


def _call(fn: Callable[[], Any], reference: str, option: str, where: str) -> Any:
    try:
        return fn()
    except InputError:
        raise
    except Exception as error:  # the user's factory failing is bad input: one line naming the option
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise InputError(f"{reference}() raised {type(error).__name__}: {text}"[:300], where=where, field=option,
                         fix="call it in Python to see the full error, then fix the factory") from None
