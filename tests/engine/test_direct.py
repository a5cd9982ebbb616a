"""packs/direct.py: which models run without vmap, and their stacked forward equals each model's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpufill.engine.packs.direct import direct_forward
from gpufill.engine.packs.stacked import StackedModule


class ResidualOnInput(nn.Module):
    """A convolution's output added to the raw input: two layouts in one sum, which the direct path leaves to vmap."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 3, 3, padding=1)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)) + x)


class ResidualInsideConvs(nn.Module):
    """A residual between two convolutions' outputs (one layout): direct."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv1d(3, 4, 3, padding=1), nn.Conv1d(4, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8, 2)
        self.flatten = nn.Flatten()

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.head(self.flatten(h + torch.tanh(self.b(h))))


class ReluTwice(nn.Module):
    """A layer's output read by a ReLU and by a sum after it: the ReLU must not overwrite it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 7), nn.Linear(7, 2)

    def forward(self, x):
        h = self.a(x)
        return self.b(torch.relu(h) + h)


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(16 * 16, 10))


def _conv_then_linear_per_position() -> nn.Module:
    return nn.Sequential(nn.Conv1d(3, 5, 3, stride=2, dilation=1), nn.SiLU(), nn.Linear(3, 2))  # Linear over the length axis


@pytest.mark.parametrize(("make", "shape", "convolves"), [
    (_cnn, (6, 1, 8, 8), True),
    (ResidualInsideConvs, (6, 3, 8), True),
    (_conv_then_linear_per_position, (6, 3, 8), True),
    (lambda: nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 2)), (6, 5), False),
    (lambda: nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 7), nn.ReLU(), nn.Linear(7, 2)), (6, 5), False),
    (ReluTwice, (6, 5), False),
    (lambda: nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2)), (6, 3, 5), False),
], ids=["cnn2d", "residual_inside", "linear_after_conv", "mlp_gelu", "mlp_relu", "relu_read_twice", "mlp_relu_3d"])
def test_the_direct_forward_of_a_pack_is_each_models_own(make, shape, convolves):
    torch.manual_seed(0)
    models = [make() for _ in range(4)]
    stacked = StackedModule.from_models(models)
    assert stacked.direct is not None and stacked.direct.convolves is convolves
    x = torch.randn(4, *shape)
    out = stacked(x)
    mine = torch.stack([m(x[i]) for i, m in enumerate(models)])
    assert out.shape == mine.shape
    assert torch.allclose(out, mine, atol=1e-6, rtol=1e-5)
    # The gradients too: a ReLU that overwrites a layer's output in place must leave autograd's saved values intact.
    out.square().sum().backward()
    sum(m(x[i]).square().sum() for i, m in enumerate(models)).backward()
    for name, p in zip(stacked.param_names, stacked.weights, strict=True):
        theirs = torch.stack([dict(m.named_parameters())[name].grad for m in models])
        assert torch.allclose(p.grad, theirs, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("model", [
    ResidualOnInput(),
    nn.Sequential(nn.Conv2d(1, 2, 3, groups=1, padding_mode="reflect", padding=1), nn.Flatten(), nn.Linear(2 * 16, 1)),
    nn.Sequential(nn.Conv1d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4 * 6, 1)),
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2 * 4, 1)),
], ids=["input_residual", "reflect_padding", "grouped_conv", "batchnorm"])
def test_what_the_direct_path_does_not_recognise_is_left_to_vmap(model):
    assert direct_forward(model) is None
