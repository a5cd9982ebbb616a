"""Shared data, models and helpers of the engine tests (tiny: every test runs in seconds on 2 CPU cores)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpufill.errors import InputError

WEIGHTS = torch.tensor([0.8, -1.0, 0.3, 0.5])


def regression(n: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x (n, 4), y (n, 1) = a fixed linear map of x plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x @ WEIGHTS).unsqueeze(1) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


def classification(n: int = 192, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x (n, 4), labels (n,): the arg-max of a fixed linear map (linearly separable)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    mixing = torch.randn(4, classes, generator=torch.Generator().manual_seed(123))
    return x, (x @ mixing).argmax(dim=1)


def linear(inputs: int = 4, outputs: int = 1, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(inputs, outputs)


def mlp(inputs: int = 4, outputs: int = 1, hidden: int = 16, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, outputs))


def losses_of(result) -> list[float]:
    return [record.train_loss for record in result.history]


def assert_learned(result, ratio: float = 0.5) -> None:
    """The last epoch's training loss is below `ratio` x the first's."""
    losses = losses_of(result)
    assert len(losses) >= 2 and losses[-1] < ratio * losses[0], losses


def assert_same_weights(a: nn.Module | dict, b: nn.Module | dict, atol: float = 1e-5) -> None:
    sa = a if isinstance(a, dict) else a.state_dict()
    sb = b if isinstance(b, dict) else b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], atol=atol, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def input_error(fn, *args, field: str, contains: tuple[str, ...] = (), **kwargs) -> InputError:
    """`fn(*args, **kwargs)` raises an InputError: one line, naming `field`, with a fix and each of `contains`."""
    with pytest.raises(InputError) as caught:
        fn(*args, **kwargs)
    error = caught.value
    text = str(error)
    assert error.field == field, text
    assert "\n" not in text and f"{field}:" in text and "; fix: " in text, text
    for words in contains:
        assert words in text, text
    return error
