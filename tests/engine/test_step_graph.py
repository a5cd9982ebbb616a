"""A single training's whole step as CUDA graphs: the static-buffer step that is captured (run eagerly on
the CPU here, against the eager step), the last short batch's own step, the optimizer state made before
capture, and, on a GPU, replays against eager steps and the fallbacks."""

from __future__ import annotations

import pytest
import torch

from gpufill.engine.batches import ResidentBatches
from gpufill.engine.config import FitConfig
from gpufill.engine.kit import build_kit
from gpufill.engine.loop import fit
from gpufill.engine.plan import DataFacts, make_plan
from gpufill.engine.losses import resolve as resolve_loss
from gpufill.engine.step import train_epoch, EpochTiming
from gpufill.engine.step_graph import GraphStep, capture, materialize_state
from tests.engine.common import assert_same_weights, mlp, regression
from tests.fakes import CPU

CPU_DEVICE = torch.device("cpu")


def kit_for(model, n, batch, *, cfg=None):
    cfg = cfg or FitConfig(batch_size=batch, lr=1e-2, grad_clip=1.0, probe=False)
    plan = make_plan(CPU, DataFacts(n_train=n, bytes_total=1), cfg, epochs=1)
    return build_kit(model, plan, cfg, resolve_loss("mse")[0], CPU_DEVICE), plan


def an_epoch(step, batches, kit, batch, seed):
    generator = torch.Generator().manual_seed(seed)
    train_epoch(step, batches, batch, generator, kit.totals, timing=EpochTiming())
    return kit.totals.read()


def test_the_static_buffer_step_equals_the_eager_step():
    x, y = regression(n=250)
    results = {}
    for static in (False, True):
        model = mlp(seed=3)
        kit, _ = kit_for(model, 250, 64)
        batches = ResidentBatches((x, y), CPU_DEVICE)
        step = GraphStep(kit.eager, batches, 64) if static else kit.eager
        means = [an_epoch(step, batches, kit, 64, seed)["loss"] for seed in range(3)]
        results[static] = (model.state_dict(), means, kit.totals.samples)
    assert_same_weights(results[True][0], results[False][0], atol=0.0)
    assert results[True][1] == results[False][1] and results[True][2] == results[False][2] == 250


def test_the_last_short_batch_has_its_own_static_step_and_other_shapes_go_eager():
    x, y = regression(n=250)
    kit, _ = kit_for(mlp(), 250, 64)
    batches = ResidentBatches((x, y), CPU_DEVICE)
    graph = GraphStep(kit.eager, batches, 64)
    assert sorted(graph.static) == [58, 64]  # 250 = 3 x 64 + 58, the same every epoch
    assert [s.index.shape[0] for s in graph.static.values()] == [64, 58]
    even = GraphStep(kit.eager, ResidentBatches((x[:192], y[:192]), CPU_DEVICE), 64)
    assert list(even.static) == [64]
    calls = []
    kit.eager.micro_batch = 64

    class Counting:
        def __call__(self, batch):
            calls.append(batch.rows)

    graph.eager = Counting()  # type: ignore[assignment]
    generator = torch.Generator().manual_seed(0)
    odd = next(iter(ResidentBatches((x[:40], y[:40]), CPU_DEVICE).epoch(40, generator)))
    graph(odd)  # 40 rows: no static step of that shape
    assert calls == [40]


def test_capturing_needs_a_gpu_and_says_so():
    x, y = regression(n=128)
    kit, plan = kit_for(mlp(), 128, 64)
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        kit.graph, _ = capture(kit.eager, ResidentBatches((x, y), CPU_DEVICE), plan.effective_batch.value)
    assert kit.graph is None


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd"])
def test_optimizer_state_made_before_capture_is_the_fresh_state(optimizer):
    """State made up front (zeros), then a step, equals a step from no state at all; weights unchanged by making it."""
    x, y = regression(n=64)
    cfg = FitConfig(optimizer=optimizer, weight_decay=0.1, lr=0.05, probe=False)
    made, fresh = mlp(seed=1), mlp(seed=1)
    kits = [kit_for(model, 64, 64, cfg=cfg)[0] for model in (made, fresh)]
    before = {k: v.clone() for k, v in made.state_dict().items()}
    materialize_state(kits[0].optimizer, made)
    assert all(kits[0].optimizer.state[p] for p in made.parameters())
    assert_same_weights(made.state_dict(), before, atol=0.0)
    assert all(p.grad is None for p in made.parameters())
    batches = ResidentBatches((x, y), CPU_DEVICE)
    for kit in kits:
        an_epoch(kit.eager, batches, kit, 32, seed=0)
    assert_same_weights(made, fresh, atol=1e-7)


# -- GPU --------------------------------------------------------------------------------------------


def lstm_forecaster():
    from gpufill.forecasting.models import registry

    torch.manual_seed(0)
    return registry.build("lstm", n_features=1, lookback=24, horizon=1, params={"hidden_size": 32})


def series_windows(n=1000):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 24, 1, generator=g), torch.randn(n, 1, generator=g)


@pytest.mark.gpu
@pytest.mark.parametrize(("precision", "atol"), [("fp32", 1e-5), ("bf16", 3e-2)])
@pytest.mark.parametrize("schedule", ["constant", "warmup_cosine"])
def test_graph_replayed_steps_equal_eager_steps_on_a_gpu(precision, atol, schedule):
    x, y = series_windows()  # 1000 = 7 x 128 + 104: both shapes replay
    runs = {}
    for graph in (False, True):
        runs[graph] = fit(lstm_forecaster(), (x, y), (x[:200], y[:200]), epochs=4, device="cuda", precision=precision, cuda_graph=graph,
                          compile=False, tf32=False, probe=False, schedule=schedule, grad_clip=1.0)
    assert runs[True].plan.step_graph.value, runs[True].plan.step_graph.reason
    assert "one graph per batch shape (128 and 104 samples)" in " ".join(runs[True].events)
    assert not runs[False].plan.step_graph.value
    assert_same_weights(runs[True].model, runs[False].model, atol=atol)
    assert [r.train_loss for r in runs[True].history] == pytest.approx([r.train_loss for r in runs[False].history], rel=atol)
    assert runs[True].history[-1].lr == pytest.approx(runs[False].history[-1].lr)


@pytest.mark.gpu
def test_a_step_that_cannot_be_captured_falls_back_to_eager_with_the_reason():
    x, y = series_windows()

    def reads_the_device(model, batch):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        if loss.item() > 1e9:  # a host read: not capturable
            raise RuntimeError("unreachable")
        return loss

    result = fit(lstm_forecaster(), (x, y), epochs=2, device="cuda", cuda_graph=True, probe=False, precision="fp32", loss=reads_the_device)
    assert not result.plan.step_graph.value and "could not be captured" in result.plan.step_graph.reason
    eager = fit(lstm_forecaster(), (x, y), epochs=2, device="cuda", cuda_graph=False, probe=False, precision="fp32", loss=reads_the_device)
    assert_same_weights(result.model, eager.model, atol=1e-6)


@pytest.mark.gpu
def test_the_probe_times_the_captured_step_on_a_gpu():
    x, y = series_windows(4000)
    result = fit(lstm_forecaster(), (x, y), epochs=20, device="cuda")
    plan = result.plan
    assert "eager steps" in plan.step_graph.reason or "captured step" in plan.step_graph.reason, plan.step_graph.reason
    assert "bf16" in plan.precision.reason and plan.probe.value > 0
