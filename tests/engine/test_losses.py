"""Named losses (values, metrics, shape messages in the task's own terms) and user loss functions."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gpufill.engine import losses
from gpufill.engine.loop import fit
from tests.engine.common import classification, input_error, linear, mlp, regression


def _call(name_or_loss, output: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    fn, _ = losses.resolve(name_or_loss)
    return fn(lambda _inputs: output, (None, targets))


def test_cross_entropy_matches_torch_and_counts_accuracy():
    scores = torch.tensor([[2.0, 0.1, -1.0], [0.0, 3.0, 0.5], [0.2, 0.1, 0.0], [1.0, 1.5, 4.0]])
    labels = torch.tensor([0, 1, 2, 2])
    out = _call("cross_entropy", scores, labels)
    assert out["loss"].item() == pytest.approx(F.cross_entropy(scores, labels).item(), abs=1e-6)
    assert out["accuracy"].item() == pytest.approx(0.75)  # sample 3's arg-max is class 0


def test_cross_entropy_over_a_language_models_positions_with_ignore_index():
    """(batch, positions, vocabulary) scores against (batch, positions) ids; -1 positions are not counted."""
    torch.manual_seed(0)
    scores = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    ids[1, 3:] = -1
    out = _call(losses.CrossEntropy(ignore_index=-1), scores, ids)
    expected = F.cross_entropy(scores.reshape(-1, 7), ids.reshape(-1), ignore_index=-1)
    assert out["loss"].item() == pytest.approx(expected.item(), abs=1e-6)
    counted = ids.reshape(-1) != -1
    hits = (scores.reshape(-1, 7).argmax(-1) == ids.reshape(-1)) & counted
    assert out["accuracy"].item() == pytest.approx(hits.sum().item() / 8)


def test_cross_entropy_label_smoothing_and_torch_layout():
    torch.manual_seed(1)
    scores = torch.randn(3, 4, 6)  # torch's own layout: (batch, classes, positions)
    labels = torch.randint(0, 4, (3, 6))
    out = _call(losses.CrossEntropy(label_smoothing=0.1), scores, labels)
    assert out["loss"].item() == pytest.approx(F.cross_entropy(scores, labels, label_smoothing=0.1).item(), abs=1e-6)
    assert losses.resolve(losses.CrossEntropy(label_smoothing=0.1))[1].value == "cross_entropy(label_smoothing=0.1)"
    assert out["accuracy"].item() == pytest.approx((scores.argmax(1) == labels).float().mean().item())


def test_top1_hits_equal_argmax_except_at_ties_which_are_never_hits():
    """The accuracy's vectorised top-1 (scatter, max) against argmax on a language model's logits, one model and a
    stacked pack of 3; a tied top score counts wrong, so a model that outputs constants scores 0, not 1/classes."""
    torch.manual_seed(2)
    scores, labels = torch.randn(512, 256), torch.randint(0, 256, (512,))
    scores[::2, :].scatter_add_(1, labels[::2, None], torch.full((256, 1), 3.0))  # half the rows lean to their label
    labels[::7] = -100
    counted = labels != -100
    hits = losses.top1_hits(scores, labels, counted, dim=-1)
    assert torch.equal(hits, (scores.argmax(-1) == labels) & counted) and 0 < int(hits.sum()) < 512
    stacked = torch.randn(3, 64, 9, 11)
    ids = torch.randint(0, 11, (3, 64, 9))
    out = losses.CrossEntropy().compute_stacked(stacked, ids, shared=False)
    assert out["accuracy"].tolist() == pytest.approx([(stacked[i].argmax(-1) == ids[i]).float().mean().item() for i in range(3)])
    flat = _call("cross_entropy", torch.zeros(6, 4), torch.tensor([0, 1, 2, 3, 0, 0]))
    assert flat["accuracy"].item() == 0.0  # argmax would call the three label-0 rows right
    tie = torch.tensor([[1.0, 3.0, 3.0], [1.0, 3.0, 2.0]])
    assert losses.top1_hits(tie, torch.tensor([1, 1]), torch.tensor([True, True]), dim=-1).tolist() == [False, True]


def test_top1_hits_in_place_puts_every_score_back_and_leaves_backward_as_it_was():
    """The in-place pick (`.data`, no copy of the logits) leaves the scores bit for bit, a saved output (an exp's)
    valid for backward with the gradient of the loss alone, and an expanded view (rows sharing memory) counted right."""
    torch.manual_seed(3)
    weight = torch.randn(16, 32, requires_grad=True)
    inputs, labels = torch.randn(64, 16), torch.randint(0, 32, (64,))
    logits = torch.exp(inputs @ weight / 4)  # exp saves its output for backward: a version bump would break it
    before = logits.detach().clone()
    out = losses.CrossEntropy().compute(logits, labels)
    assert torch.equal(logits.detach(), before) and logits._version == 0
    out["loss"].backward()
    alone = torch.autograd.grad(F.cross_entropy(torch.exp(inputs @ weight / 4), labels), weight)[0]
    assert torch.equal(weight.grad, alone)
    assert out["accuracy"].item() == pytest.approx((before.argmax(-1) == labels).float().mean().item())
    row = torch.randn(1, 32)
    shared = row.expand(8, 32)  # one row's memory seen 8 times: writing into it would change the other rows
    picks = torch.arange(8)
    hits = losses.top1_hits(shared, picks, torch.ones(8, dtype=torch.bool), dim=-1)
    assert hits.tolist() == (row.argmax(-1) == picks).tolist() and torch.equal(shared, row.expand(8, 32))


def test_bce_with_logits_takes_one_logit_per_label_as_batch_or_batch_by_one():
    logits = torch.tensor([[2.0], [-1.0], [0.5], [-3.0]])
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0])
    out = _call("bce_with_logits", logits, labels)
    assert out["loss"].item() == pytest.approx(F.binary_cross_entropy_with_logits(logits.squeeze(1), labels).item(), abs=1e-6)
    assert out["accuracy"].item() == pytest.approx(0.75)
    weighted = _call(losses.BCEWithLogits(pos_weight=3.0), logits.squeeze(1), labels.long())
    expected = F.binary_cross_entropy_with_logits(logits.squeeze(1), labels, pos_weight=torch.tensor(3.0))
    assert weighted["loss"].item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("kind", ["mse", "mae", "huber"])
def test_regression_losses_match_torch(kind):
    output, targets = torch.tensor([[0.0, 2.0], [1.0, -3.0]]), torch.tensor([[0.5, 1.0], [1.0, 0.0]])
    reference = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": F.huber_loss}[kind](output, targets)
    assert _call(kind, output, targets)["loss"].item() == pytest.approx(reference.item(), abs=1e-6)


def test_a_classifiers_shape_message_speaks_of_classes():
    error = input_error(_call, "cross_entropy", torch.zeros(8, 10), torch.zeros(8, 3, dtype=torch.long), field="model")
    assert "10 classes" in str(error) and "horizon" not in str(error)


def test_a_regressions_shape_message_speaks_of_targets_and_horizons():
    error = input_error(_call, "mse", torch.zeros(64, 10), torch.zeros(64), field="model", contains=("(64, 10)", "(64,)"))
    assert "horizon" in str(error) and "classes" not in str(error)


def test_float_labels_for_cross_entropy_are_refused_with_the_cast():
    input_error(_call, "cross_entropy", torch.zeros(4, 3), torch.zeros(4), field="loss", contains=("float32", "y.long()"))


def test_a_model_returning_a_tuple_under_a_named_loss_is_told_to_pass_a_function():
    """nanoGPT's forward returns (logits, loss): a named loss says to pick the loss with a function."""
    def model(_x):
        return torch.zeros(2, 3), torch.tensor(1.0)
    error = input_error(losses.resolve("cross_entropy")[0], model, (torch.zeros(2), torch.zeros(2, dtype=torch.long)), field="loss")
    assert "tuple of 2" in str(error) and "model(x, y)[1]" in str(error)


def test_a_named_loss_on_dict_batches_names_the_keys():
    error = input_error(losses.resolve("mse")[0], lambda x: x, {"b": torch.zeros(1), "a": torch.zeros(1)}, field="loss")
    assert "['a', 'b']" in str(error)


def test_unknown_loss_lists_the_names():
    input_error(losses.resolve, "cross_entropy_loss", field="loss", contains=("mse, mae, huber, smape, mape, quantile, cross_entropy, bce_with_logits",))
    input_error(losses.resolve, 3, field="loss", contains=("int",))


def test_the_quantile_loss_is_each_quantiles_pinball_side_by_side_per_step():
    """Two steps, five quantiles each (step-major); pinball at tau: tau (y - f) above, (1 - tau) (f - y) below."""
    assert losses.QUANTILES == (0.025, 0.1, 0.5, 0.9, 0.975) and losses.outputs_per_target("quantile") == 5
    targets = torch.tensor([[1.0, -2.0]])
    output = torch.tensor([[0.0, 0.5, 1.0, 2.0, 3.0, -2.0, -2.0, -2.0, -2.0, -2.0]])
    by_hand = [max(t * (1.0 - f), (t - 1) * (1.0 - f)) for t, f in zip(losses.QUANTILES, [0.0, 0.5, 1.0, 2.0, 3.0], strict=True)]
    assert _call("quantile", output, targets)["loss"].item() == pytest.approx(sum(by_hand) / 10, abs=1e-6)  # step 2 exact: 0
    per_sample = losses.per_sample_regression("quantile", torch.stack([output, output + 1]), torch.stack([targets, targets]))
    assert per_sample.shape == (2, 1) and per_sample[0, 0].item() == pytest.approx(sum(by_hand) / 10, abs=1e-6)
    stacked = losses.NAMED["quantile"].compute_stacked(torch.stack([output, output + 1]), targets, shared=True)["loss"]
    assert stacked.tolist() == pytest.approx(per_sample[:, 0].tolist())
    error = input_error(_call, "quantile", torch.zeros(8, 2), torch.zeros(8, 2), field="model", contains=("(8, 2)", "5 outputs per target"))
    assert "horizon x 5" in str(error)


def test_the_quantile_loss_is_minimised_at_the_datas_quantiles():
    """One free output per quantile fitted to 1,000 draws of an exponential: each lands on the draws' own quantile
    (the share of the draws below it is its level)."""
    torch.manual_seed(0)
    draws = torch.distributions.Exponential(1.0).sample((1000, 1))
    free = torch.zeros(1, 5, requires_grad=True)
    optimizer = torch.optim.Adam([free], lr=0.05)
    for step in range(500):
        if step == 400:  # a piecewise-constant gradient: Adam circles the minimum by about its lr, so end on a smaller one
            optimizer.param_groups[0]["lr"] = 0.005
        optimizer.zero_grad()
        losses.quantile_loss(free.expand(1000, 5), draws).backward()
        optimizer.step()
    below = (draws < free.detach()).float().mean(dim=0)  # the share of the draws under each fitted value
    assert below.tolist() == pytest.approx(list(losses.QUANTILES), abs=0.006)


def test_smape_is_scale_free_and_zero_where_both_are_zero():
    smape, _choice = losses.resolve("smape")
    output, target = torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    value = smape.compute(output, target)["loss"]
    assert value.item() == pytest.approx((0.0 + 2 * 2 / 4 + 0.0) / 3)
    assert smape.compute(output * 1000, target * 1000)["loss"].item() == pytest.approx(value.item())
    per_sample = losses.per_sample_regression("smape", torch.stack([output, output * 2]), torch.stack([target, target]))
    assert per_sample.shape == (2, 1) and per_sample[0, 0].item() == pytest.approx(value.item())


def test_mape_is_scale_free_zero_where_the_target_is_zero_and_weights_each_error_by_its_target():
    mape, _choice = losses.resolve("mape")
    output = torch.tensor([[1.5, 0.5, 2.0]], requires_grad=True)
    target = torch.tensor([[1.0, 2.0, 0.0]])
    value = mape.compute(output, target)["loss"]
    assert value.item() == pytest.approx((0.5 / 1.0 + 1.5 / 2.0 + 0.0) / 3)
    assert mape.compute(output * 1000, target * 1000)["loss"].item() == pytest.approx(value.item())
    value.backward()
    # d/df of |f - y| / |y|: sign(f - y) / |y| per value, over the 3 values; nothing where y is 0 (no inf, no nan)
    assert output.grad.flatten().tolist() == pytest.approx([1 / 3, -1 / 6, 0.0])
    per_sample = losses.per_sample_regression("mape", torch.stack([output.detach(), output.detach() * 2]), torch.stack([target, target]))
    assert per_sample.shape == (2, 1) and per_sample[0, 0].item() == pytest.approx(value.item())


@pytest.mark.parametrize(("returned", "words"), [
    (lambda loss: loss.expand(3), "shape (3,)"),
    (lambda loss: {"mae": loss}, "without a loss"),
    (lambda loss: {"loss": loss, "count": 3}, "metric 'count' as int"),
    (lambda loss: loss.item(), "float"),
])
def test_a_loss_function_with_the_wrong_output_is_one_line(returned, words):
    x, y = regression(32)

    def my_loss(model, batch):
        return returned(F.mse_loss(model(batch[0]), batch[1]))

    input_error(fit, linear(), (x, y), loss=my_loss, epochs=1, batch_size=16, field="loss", contains=(words, "my_loss"))


def test_fit_classifies_with_cross_entropy_and_reports_accuracy_for_train_and_val():
    x, labels = classification(n=384)
    result = fit(mlp(outputs=3), (x[:256], labels[:256]), (x[256:], labels[256:]), loss="cross_entropy", epochs=15, lr=0.02, batch_size=32)
    assert result.plan.loss.value == "cross_entropy" and "accuracy" in result.plan.loss.reason
    assert result.metrics["val_accuracy"] >= 0.9
    assert 0 < result.metrics["train_accuracy"] <= 1
    assert set(result.history[-1].val_metrics) == {"accuracy"}


def test_validation_loss_is_the_sample_weighted_mean_over_the_whole_set():
    """The issue's bug: the val loss divided by the target's element count. Here it equals cross-entropy over all
    validation samples at once (batches 64, 64, 2 weighted by their sizes), for the returned model."""
    x, labels = classification(n=322)
    result = fit(mlp(outputs=3), (x[:192], labels[:192]), (x[192:], labels[192:]), loss="cross_entropy", epochs=2, batch_size=64,
                 restore_best=False, precision="fp32")
    with torch.no_grad():
        expected = F.cross_entropy(result.model(x[192:]), labels[192:]).item()
        accuracy = (result.model(x[192:]).argmax(1) == labels[192:]).float().mean().item()
    assert result.history[-1].val_loss == pytest.approx(expected, abs=1e-5)
    assert result.history[-1].val_metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6)


def test_a_loss_function_gets_the_prepared_model_and_its_metrics_are_reported():
    x, y = regression(96)
    seen: list[type] = []

    def loss(model, batch):
        seen.append(type(model))
        error = model(batch[0]) - batch[1]
        return {"loss": error.pow(2).mean(), "max_error": error.abs().max()}

    result = fit(linear(), (x, y), (x, y), loss=loss, epochs=3, batch_size=32, lr=0.05)
    assert result.metrics["train_max_error"] > 0 and result.metrics["val_max_error"] > 0 and set(result.history[0].train_metrics) == {"max_error"}
    assert len(seen) >= 9 and all(issubclass(t, nn.Module) for t in seen)
    assert result.plan.loss.value.endswith("loss") and "prepared model" in result.plan.loss.reason


ADDED_LOSS = """
import sys
from typing import get_args

from gpufill.engine import losses


def log_cosh(output, targets, reduction="mean"):
    import torch

    error = torch.log(torch.cosh(output - targets))
    return error.mean() if reduction == "mean" else error


# The one edit adding a loss: its function and its entry in the registry (engine/losses.py).
losses.REGRESSION["log_cosh"] = log_cosh
losses.NAMED["log_cosh"] = losses.Regression("log_cosh")

from typer.testing import CliRunner

from gpufill.campaign.spec.train_spec import TrainSpec
from gpufill.cli import app
from gpufill.engine.config import NAMED_LOSSES, REGRESSION_LOSSES
from gpufill.forecasting.recipes import LOSSES

assert "log_cosh" in NAMED_LOSSES and "log_cosh" in REGRESSION_LOSSES and "log_cosh" in LOSSES
assert "log_cosh" in get_args(TrainSpec.model_fields["loss"].annotation)
assert TrainSpec(loss="log_cosh").loss == "log_cosh"
for command in ("train", "bench", "doctor"):
    assert "log_cosh" in CliRunner().invoke(app, [command, "--help"], terminal_width=400).output, command

import torch

from gpufill.engine.loop import fit

torch.manual_seed(0)
x = torch.randn(256, 4)
y = x @ torch.randn(4, 1)
model = torch.nn.Linear(4, 1)
fitted = fit(model, (x, y), epochs=3, loss="log_cosh", batch_size=32, seed=0)
assert fitted.plan.loss.value == "log_cosh", fitted.plan.loss
print(fitted.history[0].train_loss, fitted.history[-1].train_loss)
"""


def test_a_loss_added_to_the_registry_alone_is_known_everywhere(tmp_path):
    """Adding a loss touches engine/losses.py alone: fit trains with it by name, and the campaign file's `loss:`, the
    CLI's help and the forecasting recipes list it, with no other file edited (a fresh process, the loss registered
    before anything reads the names)."""
    import subprocess
    import sys

    script = tmp_path / "added.py"
    script.write_text(ADDED_LOSS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    first, last = map(float, done.stdout.split())
    assert last < first  # it trained: the loss went down
