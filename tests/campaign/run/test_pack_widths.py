"""Projects with other covariates train networks of another input width: the policy packs only equal widths together
(campaign/policy/queue.py), every pack is of the size the policy sent and each trial's numbers are its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.store.store import Store


def campaign(folder: Path, pack_size: int) -> Path:
    rng = np.random.default_rng(0)
    data = folder / "data"
    data.mkdir(exist_ok=True)
    for name in ("a", "b", "c", "d"):  # a and c have a covariate (width 2); b and d have none (width 1)
        t = np.arange(160)
        frame = pd.DataFrame({"y": np.sin(t / 6) + 0.1 * rng.standard_normal(t.size)})
        if name in ("a", "c"):
            frame["temp"] = np.cos(t / 6)
        frame.to_csv(data / f"{name}.csv", index=False)
    path = folder / f"widths{pack_size}.yaml"
    path.write_text("name: widths\ndata: {source: data/*.csv, target: y}\ntask: {lookback: [8], horizon: 1}\n"
                    "models:\n  mlp: {hidden_size: 8}\ntrain: {epochs: 3, early_stopping: null}\nseeds: [0, 1]\n"
                    f"resources: {{retries: 0, pack_size: {pack_size}}}\n")
    return path


@pytest.mark.slow
def test_only_equal_input_widths_train_in_one_pack_and_each_pack_is_the_size_sent(tmp_path):
    packed = Campaign.from_yaml(campaign(tmp_path, 4), tmp_path / "packed")
    outcome = packed.run(cpu_slots=1, executor="inline")
    assert (outcome.done, outcome.failed) == (8, 0)
    results = packed.results().set_index(["project", "seed"]).sort_index()
    store = Store.open(tmp_path / "packed")
    try:
        sizes = [store.trial_details(trial_id)["plan"]["pack_size"]["value"] for trial_id in results["trial_id"]]
    finally:
        store.close()
    assert sizes == [4] * 8  # (a, c) x 2 seeds, then (b, d) x 2 seeds: two packs of 4, none split by the worker
    alone = Campaign.from_yaml(campaign(tmp_path, 1), tmp_path / "alone")
    assert alone.run(cpu_slots=1, executor="inline").done == 8
    unpacked = alone.results().set_index(["project", "seed"]).sort_index()
    np.testing.assert_allclose(results["mae"], unpacked["mae"], rtol=1e-4)  # a member trains what it trains alone
