"""gpufill bench and gpufill doctor on models nobody here wrote: references on the command line, any data and loss."""

from __future__ import annotations

import json

import pytest

from gpufill.bench import BenchSettings, BenchTarget, run_bench, target_from_references
from gpufill.bench.guides import SampleDataset, head, validation_loss
from gpufill.doctor import diagnose
from gpufill.errors import InputError
from tests.any_model_fixture import dict_loss, make_classifier, make_dict_dataset, make_labels
from tests.engine.common import classification
from tests.helpers import run_cli

FIXTURE = "tests.any_model_fixture"
QUICK = BenchSettings(repeats=1, device="cpu", ablation=False, hand_tuned=False, lightning=False)  # those two: test_bench_command.py


@pytest.mark.slow
def test_a_classifier_target_runs_every_loop_and_scores_them_with_its_loss():
    data = make_labels()
    target = BenchTarget(name="classifier", make_model=make_classifier, train=data["train"], val=data["val"], loss="cross_entropy",
                         batch_size=32, lr=0.01, epochs=2, fit_options={"batch_size": 32})
    report = run_bench(QUICK, target=target).to_dict()
    assert [row["loop"] for row in report["results"]] == ["before", "gpufill", "hand loop"]
    assert report["args"]["train_samples"] == 256 and report["args"]["loss"] == "cross_entropy" and report["args"]["batch_size"] == 32
    assert report["plan"]["loss"]["value"] == "cross_entropy" and report["plan"]["effective_batch"]["value"] == 32
    for row in report["results"]:  # every loop trained: below the untrained cross-entropy of 3 classes, ln 3 = 1.10
        assert 0 < row["val_loss"] < 1.0, row
    assert report["ratios"]["speedup"] > 0 and report["ratios"]["gpufill_over_hand_loop"] > 0


def test_a_dataset_of_dicts_with_a_loss_function_and_accumulation_in_the_before_loop():
    data = make_dict_dataset()
    target = BenchTarget(name="dicts", make_model=make_classifier, train=data["train"], val=data["val"], loss=dict_loss, batch_size=64,
                         micro_batch=16, lr=0.01, epochs=2)
    report = run_bench(QUICK, target=target).to_dict()
    assert [row["loop"] for row in report["results"]] == ["before", "gpufill"]  # no hand loop: the data is a Dataset
    assert report["args"]["hand_loop"] is False and report["args"]["loss"] == "dict_loss" and report["args"]["micro_batch"] == 16
    assert all(0 < row["val_loss"] < 1.1 for row in report["results"])


def test_the_guides_dataset_serves_any_structure_one_sample_at_a_time():
    x, labels = classification(n=10)
    dataset = SampleDataset({"x": x, "pair": (labels, labels * 2)})
    item = dataset[3]
    assert len(dataset) == 10 and item["x"].tolist() == x[3].tolist() and item["pair"][1].item() == 2 * labels[3].item()
    assert head((x, labels), 4)[0].shape == (4, 4)


def test_validation_loss_is_the_sample_weighted_mean_for_any_form():
    data = make_dict_dataset()
    model = make_classifier()
    as_dataset = validation_loss(model, data["val"], dict_loss)
    x, labels = data["val"].x, data["val"].y
    as_tensors = validation_loss(model, (x, labels), "cross_entropy")
    assert as_dataset == pytest.approx(as_tensors, abs=1e-6) and 0.5 < as_tensors < 2


def test_references_build_a_target_and_hold_out_a_tenth_when_no_val_is_given():
    target = target_from_references(f"{FIXTURE}:make_classifier", f"{FIXTURE}:make_labels_without_val", loss="cross_entropy", batch_size=16)
    assert target.name == "tests.any_model_fixture:make_classifier"
    assert target.train[0].shape[0] == 180 and target.val[0].shape[0] == 20
    assert target.fit_options == {"batch_size": 16} and target.args["parameters"] == 4 * 16 + 16 + 16 * 3 + 3


@pytest.mark.parametrize(("model", "data", "loss", "field", "words"), [
    ("lstm", f"{FIXTURE}:make_labels", "mse", "--model", "not a reference"),
    (f"{FIXTURE}:nope", f"{FIXTURE}:make_labels", "mse", "--model", "has no 'nope'"),
    (f"{FIXTURE}:NOT_A_FUNCTION", f"{FIXTURE}:make_labels", "mse", "--model", "not a function"),
    (f"{FIXTURE}:make_labels", f"{FIXTURE}:make_labels", "mse", "--model", "not a torch.nn.Module"),
    (f"{FIXTURE}:make_classifier", f"{FIXTURE}:make_nothing", "mse", "--data", "expected tensors"),
    (f"{FIXTURE}:make_classifier", f"{FIXTURE}:make_broken", "mse", "--data", "RuntimeError: the data server is down"),
    (f"{FIXTURE}:make_classifier", f"{FIXTURE}:make_labels", "hinge", "--loss", "unknown loss 'hinge'"),
    (f"{FIXTURE}:make_classifier", "no_such_module_xyz:make", "mse", "--data", "cannot import"),
])
def test_bad_references_are_one_line_naming_the_option(model, data, loss, field, words):
    with pytest.raises(InputError) as caught:
        target_from_references(model, data, loss=loss)
    text = str(caught.value)
    assert caught.value.field == field and words in text and "\n" not in text, text


@pytest.mark.slow
def test_gpufill_bench_on_a_referenced_model_writes_its_record(capsys, tmp_path):
    out = tmp_path / "bench.json"
    code, stdout, _ = run_cli(capsys, "bench", "--model", f"{FIXTURE}:make_classifier", "--data", f"{FIXTURE}:make_labels", "--loss",
                              "cross_entropy", "--batch-size", "32", "--lr", "0.01", "--epochs", "2", "--repeats", "1", "--device", "cpu",
                              "--fit", "weight_decay=0.01", "--out", out)
    assert code == 0
    record = json.loads(out.read_text())
    assert record["args"]["fit_options"] == {"batch_size": 32, "weight_decay": 0.01} and record["args"]["lr"] == 0.01
    assert record["plan"]["loss"]["value"] == "cross_entropy" and record["plan"]["effective_batch"]["value"] == 32
    assert "256 samples x 2" in stdout and "speed-up: gpufill trains" in stdout
    loops = [row["loop"] for row in record["results"]]
    assert loops[:3] == ["before", "gpufill", "hand loop"] and len(loops) > 3  # ablation rows follow


@pytest.mark.parametrize(("args", "words"), [
    (["--loss", "pkg_that_is_missing:fn"], "--loss"),
    (["--fit", "weight_decay"], "--fit: --fit 'weight_decay' is not KEY=VALUE"),
    (["--fit", "grad_clip=-1"], "--fit grad_clip: got -1"),
    (["--fit", "no_such_setting=1"], "no_such_setting"),
    (["--batch-size", "0"], "--batch-size"),
    (["--micro-batch", "64", "--batch-size", "32"], "--micro-batch"),
])
def test_gpufill_bench_bad_options_exit_2_in_one_line(capsys, args, words):
    code, _, err = run_cli(capsys, "bench", "--model", f"{FIXTURE}:make_classifier", "--data", f"{FIXTURE}:make_labels", "--repeats", "1", *args)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_doctor_diagnoses_dict_batches_with_a_loss_function():
    data = make_dict_dataset()
    report = diagnose(make_classifier(), data["train"], loss=dict_loss, batch_size=32, steps=4, device="cpu").to_dict()
    training = report["training"]
    assert training["batch_size"] == 32 and training["steps"] == 4
    assert "Sequential (131 parameters) on Dicts data, batch 32, loss dict_loss" in training["description"]
    assert training["flops_per_step"] > 0 and report["verdict"]["kind"]


def test_gpufill_doctor_on_referenced_model_data_and_loss(capsys):
    code, stdout, _ = run_cli(capsys, "doctor", "--model", f"{FIXTURE}:make_classifier", "--data", f"{FIXTURE}:make_dict_dataset", "--loss",
                              f"{FIXTURE}:dict_loss", "--steps", "3", "--batch-size", "16", "--device", "cpu", "--json")
    assert code == 0
    record = json.loads(stdout)
    assert record["training"]["batch_size"] == 16 and "loss dict_loss" in record["training"]["description"]


def test_gpufill_doctor_refuses_a_loss_for_a_forecaster(capsys):
    code, _, err = run_cli(capsys, "doctor", "--loss", "cross_entropy")
    assert code == 2 and "--loss" in err and "--data pkg.mod:make_data" in err
