"""The plain for-loop a user writes instead of a campaign (run by bench/campaign_overhead.py).

One process, one training after the other, each a careful hand loop: resident tensors, index
batches, zero_grad(set_to_none=True), fused AdamW, no per-step sync; the test MAE at the end.
Prints one JSON line: {"trials": N, "mae": [...]}.

    python bench/_plain_trials.py PROJECTS LENGTH LOOKBACK HIDDEN EPOCHS THREADS(default|N)
"""

from __future__ import annotations

import json
import sys

import torch

from gpufill.forecasting.data import Split, load_projects, make_windows
from gpufill.forecasting.models import registry


def train_one(windows, hidden: int, epochs: int, seed: int = 0, batch: int = 128) -> float:
    torch.manual_seed(seed)
    model = registry.build("mlp", n_features=windows.n_features, lookback=windows.lookback, horizon=1, params={"hidden_size": hidden})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x, y = windows.x_train, windows.y_train
    for _ in range(epochs):
        model.train()
        order = torch.randperm(x.shape[0])
        for start in range(0, x.shape[0], batch):
            index = order[start:start + batch]
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x[index]), y[index]).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        prediction = windows.inverse_target(model(windows.x_test).numpy())
    return float(abs(prediction - windows.test_truth).mean())


def main() -> None:
    projects, length, lookback, hidden, epochs = (int(a) for a in sys.argv[1:6])
    if sys.argv[6] != "default":
        torch.set_num_threads(int(sys.argv[6]))
    data = load_projects("synthetic", n_projects=projects, length=length, seed=0)
    maes = [train_one(make_windows(project, lookback, 1, Split(val=0.1, test=0.2)), hidden, epochs) for project in data.values()]
    print(json.dumps({"trials": len(maes), "mae": maes}))


if __name__ == "__main__":
    main()
