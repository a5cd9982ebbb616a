"""`results --best` and `--summary` as a reader takes them in: a search's sampled settings shown, to 3 significant digits."""

from __future__ import annotations

import io
import json

from rich.console import Console

from gpufill.cli.campaign_tables import results_table, winners_table


def rendered(table) -> str:  # noqa: ANN001 - a rich Table
    with Console(width=160, record=True, file=io.StringIO()) as console:
        console.print(table)
    return console.export_text()


def a_row(project: str, lr: float, dropout: float, smape: float) -> dict:
    return {"project": project, "family": "nbeats", "params": json.dumps({"dropout": dropout, "width": 256}),
            "train": json.dumps({"epochs": 50, "lr": lr, "scaling": "mean" if lr > 1e-3 else "standard"}), "lookback": 36, "smape": smape,
            "val_smape": smape, "vs_snaive": None, "vs_ets": 0.95, "seeds": 3, "chosen_on": "val", "config_id": "abc", "stale": False,
            "families": 2, "runner_up": "ets", "runner_up_by": 0.05, "runner_up_smape": smape * 1.05}


def test_a_searchs_sampled_settings_show_in_best_and_summary_to_3_significant_digits():
    rows = [a_row("p0", 0.0029082010120819336, 0.12345678, 9.1), a_row("p1", 0.00041234567, 0.2, 9.7)]
    best = rendered(winners_table(rows, "smape"))
    summary = rendered(results_table(rows, summary=True, metric="smape"))
    for text in (best, summary):
        assert "lr=0.00291, scaling=mean" in text and "lr=0.000412, scaling=standard" in text, text
        assert "dropout:0.123, width:256" in text and "0.0029082" not in text and "epochs" not in text  # the same everywhere: not repeated
