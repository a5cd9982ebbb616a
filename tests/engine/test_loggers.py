"""fit(..., loggers=[...]) and fit_many: TensorBoard event files and MLflow runs read back equal the FitResult."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from gpufill import fit, fit_many
from gpufill.errors import InputError

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def data():
    torch.manual_seed(0)
    x = torch.randn(400, 6)
    y = x[:, :2].sum(1, keepdim=True)
    return (x[:320], y[:320]), (x[320:], y[320:])


def model():
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def events(folder):
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return accumulator


def text(accumulator, tag):
    """The tag's last text (the plan is written again at the end where a choice changed while training)."""
    return accumulator.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


@pytest.mark.slow
def test_tensorboard_and_mlflow_hold_each_epoch_the_plan_and_the_result_as_fit_returned_them(tmp_path, monkeypatch):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # MLflow's default artifact place is ./mlruns: nothing may land here
    train, val = data()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = fit(model(), train, val, epochs=4, batch_size=32, loggers=[f"tensorboard:{tmp_path / 'tb'}", f"mlflow:{uri}"])
    board = events(tmp_path / "tb")
    for tag, field in (("epoch/train_loss", "train_loss"), ("epoch/val_loss", "val_loss"), ("epoch/lr", "lr")):
        written = board.Scalars(tag)
        assert [e.step for e in written] == [1, 2, 3, 4]
        assert [e.value for e in written] == pytest.approx([getattr(r, field) for r in result.history], rel=1e-6)
    assert [e.value for e in board.Scalars("epoch/samples_per_s")] == pytest.approx([r.samples / r.seconds for r in result.history], rel=1e-6)
    assert board.Scalars("result/best_epoch")[0].value == result.metrics["best_epoch"]
    plan = text(board, "plan/text_summary")
    assert f"| precision | {result.plan.precision.value} | {result.plan.precision.reason.replace('|', '/')} |" in plan
    assert text(board, "status/text_summary") == result.status == "completed"

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("gpufill").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["gpufill.status"] == "completed"
    history = client.get_metric_history(run.info.run_id, "epoch_val_loss")
    assert [m.step for m in history] == [1, 2, 3, 4] and [m.value for m in history] == pytest.approx([r.val_loss for r in result.history], rel=1e-9)
    assert run.data.params["plan.precision"] == str(result.plan.precision.value) and run.data.params["plan.threads"] == str(result.plan.threads.value)
    assert run.data.metrics["result_val_loss"] == pytest.approx(result.metrics["val_loss"], rel=1e-9)
    reasons = client.download_artifacts(run.info.run_id, "plan.txt", str(tmp_path))
    assert f"precision: {result.plan.precision.value!r} - {result.plan.precision.reason}" in open(reasons).read()
    assert list((tmp_path / "cwd").iterdir()) == [] and list((tmp_path / "mlartifacts").rglob("plan.txt"))  # beside the store it was given


@pytest.mark.slow
def test_a_choice_changed_while_training_is_logged_as_it_ran(tmp_path, monkeypatch):
    """The live trial (or the thread watch) may change threads or precision after the plan was first written: a
    loaded clean-clone CI showed TensorBoard and MLflow keeping the start's plan while the training ran at 1 thread."""
    from types import SimpleNamespace

    from gpufill.engine.loggers import MlflowLogger, TensorBoardLogger

    class Plan:
        def __init__(self, threads):
            self.threads = threads

        def to_dict(self):
            return {"threads": {"value": self.threads, "reason": f"{self.threads}: measured"}}

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    board_logger, mlflow_logger = TensorBoardLogger(tmp_path / "tb", None), MlflowLogger(uri, "run")
    for logger in (board_logger, mlflow_logger):
        logger.on_fit_start(Plan(2), 1)
        logger.close(SimpleNamespace(plan=Plan(1), metrics={"val_loss": 0.5}, timings={}, history=[object()], status="completed"))
    written = [t.tensor_proto.string_val[0].decode() for t in events(tmp_path / "tb").Tensors("plan/text_summary")]
    assert len(written) == 2 and "| threads | 2 | 2: measured |" in written[0] and "| threads | 1 | 1: measured |" in written[1]
    run = MlflowClient(uri).get_run(mlflow_logger.run_id)
    assert run.data.params == {"plan.threads": "1"} and run.info.status == "FINISHED"
    assert "threads: 1 - 1: measured" in open(MlflowClient(uri).download_artifacts(run.info.run_id, "plan.txt", str(tmp_path))).read()


@pytest.mark.slow
def test_fit_many_writes_one_run_per_variant(tmp_path):
    train, val = data()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    variants = [{"lr": 1e-3, "seed": 0}, {"lr": 1e-2, "seed": 1}, {"lr": 3e-3, "seed": 2}]
    results = fit_many(model, train, val, variants=variants, epochs=3, batch_size=32, loggers=[f"tensorboard:{tmp_path / 'tb'}", f"mlflow:{uri}"])
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("gpufill").experiment_id])}
    assert set(runs) == {"variant-0", "variant-1", "variant-2"}
    for index, result in enumerate(results):
        board = events(tmp_path / "tb" / f"variant-{index}")
        assert [e.value for e in board.Scalars("epoch/train_loss")] == pytest.approx([r.train_loss for r in result.history], rel=1e-6)
        assert runs[f"variant-{index}"].data.metrics["epoch_lr"] == pytest.approx(variants[index]["lr"], rel=1e-6)


def test_a_logger_is_refused_in_one_line_before_training_and_one_failing_midway_leaves_the_training_going(tmp_path, monkeypatch):
    train, val = data()
    net = model()
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(InputError) as bad:
        fit(net, train, val, epochs=2, loggers=["wandb:project"])
    assert bad.value.field == "loggers" and "tensorboard:DIR or mlflow:URI" in bad.value.one_line()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(InputError) as missing:
        fit(net, train, val, epochs=2, loggers=[f"tensorboard:{tmp_path / 'tb'}"])
    assert "pip install 'gpufill[tensorboard]'" in missing.value.one_line()
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True)) and not (tmp_path / "tb").exists()  # nothing trained
    monkeypatch.undo()

    from torch.utils.tensorboard import SummaryWriter

    calls = []

    def full_disk(self, tag, value, step):
        calls.append(step)
        if step == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_scalar", full_disk)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(model(), train, val, epochs=4, batch_size=32, loggers=[f"tensorboard:{tmp_path / 'tb2'}"])
    assert result.status == "completed" and len(result.history) == 4
    assert max(calls) == 2  # turned off at the failure, never asked again
    assert [str(w.message) for w in caught if "the tensorboard logger stopped (OSError" in str(w.message)]


def test_an_mlflow_server_that_does_not_answer_is_one_line_in_seconds_before_anything_trains(tmp_path):
    """bd3c8d8: `mlflow:http://127.0.0.1:9` held fit 273 s (MLflow's retries) and then raised MlflowException;
    `mlflow:junk://x` was a traceback."""
    import time

    train, val = data()
    net = model()
    before = [p.detach().clone() for p in net.parameters()]
    started = time.monotonic()
    with pytest.raises(InputError) as silent:
        fit(net, train, val, epochs=2, loggers=["mlflow:http://127.0.0.1:9"])  # nothing listens on port 9
    assert time.monotonic() - started < 60  # 1-2 s here: no retries, a 5 s request timeout
    line = silent.value.one_line()
    assert line.startswith("loggers: MLflow at http://127.0.0.1:9 did not take the run") and "leave this logger out" in line and "\n" not in line
    with pytest.raises(InputError, match="MLflow has no tracking store for the scheme 'junk'"):
        fit(net, train, val, epochs=2, loggers=["mlflow:junk://x"])
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))  # nothing trained
