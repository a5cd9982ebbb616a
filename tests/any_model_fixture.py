"""Models, data and losses nobody here wrote, named by reference in the bench and doctor tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from tests.engine.common import classification


def make_classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def make_labels() -> dict:
    x, labels = classification(n=320)
    return {"train": (x[:256], labels[:256]), "val": (x[256:], labels[256:])}


def make_labels_without_val():
    return classification(n=200)


class Dicts(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"features": self.x[i], "label": self.y[i]}


def make_dict_dataset() -> dict:
    x, labels = classification(n=256)
    return {"train": Dicts(x[:192], labels[:192]), "val": Dicts(x[192:], labels[192:])}


def dict_loss(model, batch):
    scores = model(batch["features"])
    return {"loss": nn.functional.cross_entropy(scores, batch["label"]), "accuracy": (scores.argmax(1) == batch["label"]).float().mean()}


def make_nothing():
    return "not data"


def make_broken():
    raise RuntimeError("the data server is down")


NOT_A_FUNCTION = 3
