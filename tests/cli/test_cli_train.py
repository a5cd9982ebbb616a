"""`gpufill train`: JSON shape, every family beats naive, and every bad input exits 2 with one line."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from gpufill.forecasting.recipes import RECIPES
from tests.helpers import run_cli


@pytest.mark.parametrize("family", ["lstm", "gru", "tcn", "transformer", "mlp"])
@pytest.mark.slow
def test_every_family_beats_the_naive_forecast_in_five_epochs(capsys, family):
    code, out, _ = run_cli(capsys, "train", "--model", family, "--data", "synthetic", "--epochs", 5, "--json")
    assert code == 0
    result = json.loads(out)
    assert set(result["metrics"]["test"]) == {"mae", "rmse", "smape", "mase"}
    assert set(result["metrics"]["naive"]) == {"mae", "rmse", "smape", "mase"}
    assert result["metrics"]["test"]["mae"] < result["metrics"]["naive"]["mae"]
    assert result["plan"]["precision"] == {"value": "fp32", "reason": result["plan"]["precision"]["reason"]}
    assert all(set(choice) == {"value", "reason"} for choice in result["plan"].values())
    assert result["timings"]["samples_per_s"] > 0 and result["timings"]["epoch_s"] > 0
    assert len(result["history"]) == 5
    recipe = RECIPES[family]  # the campaign's recipe for the family: its scaling and loss, with the reasons
    assert (result["plan"]["scaling"]["value"], result["plan"]["loss"]["value"]) == (recipe.scaling, recipe.loss)
    assert result["plan"]["scaling"]["reason"] == recipe.why["scaling"]


def test_human_output_shows_plan_metrics_and_speed(capsys):
    code, out, _ = run_cli(capsys, "train", "--model", "mlp", "--epochs", 2, "--batch-size", 64)
    assert code == 0
    for text in ("Plan", "precision", "naive (last value)", "samples/s", "effective_batch"):
        assert text in out


@pytest.mark.slow
def test_console_script_entry_point_runs():
    done = subprocess.run([sys.executable, "-m", "gpufill.cli", "train", "--model", "mlp", "--epochs", "1", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"


def test_batch_search_on_the_command_line_measures_and_explains(capsys):
    code, out, _ = run_cli(capsys, "train", "--model", "mlp", "--epochs", 1, "--batch-size", 64, "--batch-search", "on", "--json")
    assert code == 0
    plan = json.loads(out)["plan"]
    assert plan["batch_search"] == {"value": True, "reason": "requested"}
    micro, accumulation = plan["micro_batch"]["value"], plan["accumulation"]["value"]
    assert micro in (4, 6, 8, 12, 16, 24, 32, 48, 64) and accumulation == -(-64 // micro)
    assert plan["effective_batch"]["value"] == 64 and "measured" in plan["micro_batch"]["reason"]


def write_csv(path, values, **extra):
    frame = pd.DataFrame({"target": values, **extra})
    frame.to_csv(path, index=False)
    return path


@pytest.fixture
def data_dir(tmp_path):
    t = np.arange(400)
    values = 100 + 10 * np.sin(2 * np.pi * t / 7)
    write_csv(tmp_path / "shop_part1.csv", values[:200])
    write_csv(tmp_path / "shop_part3.csv", values[200:])
    nan_values = values.copy()
    nan_values[[10, 50]] = np.nan
    write_csv(tmp_path / "gappy.csv", nan_values)
    write_csv(tmp_path / "short.csv", values[:40])
    return tmp_path


def bad_cases(d):
    return [
        (["--model", "resnet"], ["model", "resnet", "lstm"]),
        (["--model", "lstm", "--data", "s3://bucket/x.csv"], ["s3://bucket/x.csv", "synthetic"]),
        (["--model", "lstm", "--data", d / "missing.csv"], ["missing.csv"]),
        (["--model", "lstm", "--data", d / "shop_part*.csv"], ["shop_part2"]),
        (["--model", "lstm", "--data", d / "gappy.csv"], ["gappy.csv", "NaN", "fill"]),
        (["--model", "lstm", "--data", d / "short.csv", "--lookback", 30], ["short", "lookback"]),
        (["--model", "lstm", "--epochs", 0], ["epochs"]),
        (["--model", "lstm", "--batch-size", 0], ["--batch-size"]),
        (["--model", "lstm", "--batch-size", "many"], ["--batch-size"]),
        (["--model", "lstm", "--precision", "fp16"], ["precision", "fp16"]),
        (["--model", "lstm", "--param", "hidden_size"], ["--param", "KEY=VALUE"]),
        (["--model", "lstm", "--param", "width=3"], ["width", "hidden_size"]),
        (["--model", "lstm", "--val", "1.5"], ["--val"]),
        (["--model", "lstm", "--compile", "maybe"], ["--compile"]),
        (["--model", "lstm", "--batch-search", "sometimes"], ["--batch-search"]),
        (["--model", "lstm", "--nproc", 0], ["--nproc"]),
        (["--model", "lstm", "--scaling", "max"], ["--scaling", "'max'", "mean"]),
        (["--model", "mlp", "--loss", "smape"], ["--loss", "smape with scaling last", "scaling: mean"]),
        (["--model", "lstm", "--project", "nope"], ["nope"]),
        (["--model", "lstm", "--precision", "banana"], ["--precision", "banana", "bf16"]),
        (["--model", "lstm", "--lr", -1], ["--lr", "-1"]),
        (["--model", "lstm", "--patience", -1], ["--patience"]),
        (["--model", "lstm", "--checkpoint-dir", d / "short.csv"], ["--checkpoint-dir", "is a file"]),
        (["--model", "tests.custom_model_fixture:make_not_a_module"], ["model", "dict", "nn.Module"]),
        *([(["--model", "lstm", "--device", "cuda"], ["--device", "no CUDA GPU"])] if not torch.cuda.is_available() else []),
    ]


def test_every_bad_input_is_one_line_and_exit_code_2(capsys, data_dir):
    for args, must_mention in bad_cases(data_dir):
        code, out, err = run_cli(capsys, "train", *args, "--epochs" if "--epochs" not in args else "--seed", 1 if "--epochs" not in args else 0)
        assert code == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (args, err)
        assert lines[0].startswith("gpufill: error: ") and "fix:" in lines[0], lines[0]
        for text in must_mention:
            assert str(text) in lines[0], (text, lines[0])
        assert out == ""


def test_nan_fill_option_makes_the_same_file_usable(capsys, data_dir):
    code, out, _ = run_cli(capsys, "train", "--model", "mlp", "--data", data_dir / "gappy.csv", "--fill", "ffill", "--epochs", 2, "--json")
    assert code == 0
    assert json.loads(out)["project"] == "gappy"


def test_patience_0_turns_early_stopping_off(capsys):
    code, out, _ = run_cli(capsys, "train", "--model", "mlp", "--epochs", 6, "--patience", 0, "--json")
    record = json.loads(out)
    assert code == 0 and len(record["history"]) == 6 and record["status"] == "completed"
    assert not any(event.startswith("early stop") for event in record["events"])


@pytest.mark.slow
def test_a_checkpoint_of_synthetic_data_resumes_on_another_cpus_kernels(tmp_path):
    """The windows of a synthetic project differ in their last bits on another CPU; the checkpoint names them by the
    project's fingerprint and how they were cut and scaled, so it resumes there (issue 34)."""
    from tests.other_cpu import kernel_settings, run_python

    common = ["-m", "gpufill", "train", "--model", "mlp", "--data", "synthetic", "--checkpoint-dir", str(tmp_path), "--json"]
    first = json.loads(run_python(*common, "--epochs", "2", env={}).stdout)
    again = json.loads(run_python(*common, "--epochs", "3", "--resume", env=kernel_settings()["all baseline"]).stdout)
    assert len(first["history"]) == 2 and len(again["history"]) == 3
    assert any("resumed after epoch 2" in event for event in again["events"])
    assert [record["train_loss"] for record in again["history"][:2]] == [record["train_loss"] for record in first["history"]]


def test_json_keeps_the_result_on_stdout_and_says_its_progress_on_stderr_as_it_goes(capsys):
    code, out, err = run_cli(capsys, "train", "--model", "mlp", "--epochs", 3, "--patience", 0, "--batch-search", "on", "--json")
    assert code == 0
    result = json.loads(out)  # one object: nothing else on stdout
    assert set(result) == {"project", "family", "params", "status", "plan", "metrics", "timings", "history", "events"}
    lines = [json.loads(line) for line in err.splitlines()]
    assert lines[0] == {"event": "training mlp on p000"}
    searched = [line["event"] for line in lines if "event" in line and line["event"].startswith("batch search:")]
    assert searched == [event for event in result["events"] if event.startswith("batch search:")] and len(searched) == 1
    plan = next(line for line in lines if "plan" in line)
    assert plan["epochs"] == 3 and plan["plan"]["micro_batch"] == result["plan"]["micro_batch"]["value"]
    epochs = [line for line in lines if "epoch" in line]
    assert [line["epoch"] for line in epochs] == [1, 2, 3]
    assert [line["train_loss"] for line in epochs] == [record["train_loss"] for record in result["history"]]
    assert lines.index(plan) < lines.index(epochs[0])  # the plan is said before the first epoch ends


def test_forecasts_are_printed_only_when_asked_for(capsys):
    code, out, _ = run_cli(capsys, "train", "--model", "mlp", "--epochs", 1, "--json", "--forecasts")
    assert code == 0
    result = json.loads(out)
    test = result["forecasts"]["p000"]
    forecast, truth = np.asarray(test["forecast"]), np.asarray(test["truth"])
    assert forecast.shape == truth.shape == (len(test["origins"]), 1) and np.isfinite(forecast).all()  # one value per test window and step
    assert np.abs(forecast - truth).mean() == pytest.approx(result["metrics"]["test"]["mae"], rel=1e-4)  # the arrays the metric was scored on
    assert len(result["val_forecasts"]["p000"]["forecast"]) > 0
