"""Optimizers (the no-decay group, factories scaled by the plan) and schedules (values, no device reads)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gpufill.engine.config import FitConfig
from gpufill.engine.loop import fit
from gpufill.engine.optim import Multiplier, load_optimizer_state, make_optimizer, make_schedule
from tests.engine.common import input_error, linear, regression


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8)
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 1, bias=False)

    def forward(self, ids):
        return self.head(self.norm(self.proj(self.embed(ids)).relu())).mean(1)


def test_adamw_keeps_weight_decay_off_biases_and_norm_weights_and_says_so():
    model = Tiny()
    optimizer, choice = make_optimizer(model, FitConfig(weight_decay=0.1), lr=1e-3, kernel="for-loop")
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {id(p) for p in decayed["params"]} == {id(model.embed.weight), id(model.proj.weight), id(model.head.weight)}
    assert {id(p) for p in plain["params"]} == {id(model.proj.bias), id(model.norm.weight), id(model.norm.bias)}
    assert choice.value == "adamw"
    assert "weight decay 0.1 on 3 weight matrices and embeddings (152 values), none on 3 biases and norm weights (24 values)" in choice.reason


def test_sgd_and_adam_decay_every_parameter():
    for name in ("sgd", "adam"):
        optimizer, choice = make_optimizer(Tiny(), FitConfig(optimizer=name, weight_decay=0.01), lr=0.1, kernel="foreach")
        assert len(optimizer.param_groups) == 1 and optimizer.param_groups[0]["weight_decay"] == 0.01
        assert choice.value == name and "every parameter" in choice.reason


def test_a_factory_is_used_as_given_with_the_plans_lr_scale():
    def two_groups(params):
        params = list(params)
        return torch.optim.SGD([{"params": params[:1], "lr": 0.5}, {"params": params[1:]}], lr=0.1)

    optimizer, choice = make_optimizer(Tiny(), FitConfig(optimizer=two_groups, lr=0.01), lr=0.02, kernel="fused")
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1.0, 0.2])  # lr scale 0.02 / 0.01 = 2
    assert choice.value == "SGD" and "2 parameter group(s)" in choice.reason and "x 2" in choice.reason


def test_a_factory_returning_something_else_is_one_line():
    input_error(make_optimizer, Tiny(), FitConfig(optimizer=lambda params: list(params)), 1e-3, "fused",
                field="optimizer", contains=("list", "torch.optim.Optimizer"))


def test_fit_with_a_factory_trains_and_records_it():
    x, y = regression(64)
    result = fit(linear(), (x, y), optimizer=lambda params: torch.optim.SGD(params, lr=0.1), epochs=4, batch_size=16)
    assert result.plan.optimizer.value == "SGD" and "your factory" in result.plan.optimizer.reason
    assert result.history[-1].train_loss < 0.5 * result.history[0].train_loss


def test_warmup_cosine_rises_then_falls_to_the_floor():
    multiplier = Multiplier("warmup_cosine", warmup=4, total=20, min_ratio=0.1)
    assert [multiplier(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert multiplier(4) == pytest.approx(1.0)
    assert multiplier(12) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert multiplier(20) == pytest.approx(0.1) and multiplier(50) == pytest.approx(0.1)
    linear_decay = Multiplier("linear", warmup=2, total=12, min_ratio=0.0)
    assert linear_decay(7) == pytest.approx(0.5)


def test_auto_warmup_is_five_percent_of_all_steps():
    optimizer = torch.optim.SGD(linear().parameters(), lr=1.0)
    scheduler, choice = make_schedule(optimizer, FitConfig(schedule="warmup_cosine", min_lr_ratio=0.0), total_steps=200)
    assert scheduler.lr_lambdas[0].warmup == 10
    assert "linear warm-up over 10 steps (5% of 200 steps), then cosine decay to 0 x lr at step 200" == choice.reason


def test_fit_follows_the_schedule_step_by_step():
    """3 epochs x 4 steps: the lr recorded at each epoch's end is the base lr times the multiplier of the steps taken."""
    x, y = regression(64)
    result = fit(linear(), (x, y), schedule="linear", warmup_steps=2, min_lr_ratio=0.0, lr=0.1, epochs=3, batch_size=16)
    expected = Multiplier("linear", warmup=2, total=12, min_ratio=0.0)
    assert [r.lr for r in result.history] == pytest.approx([0.1 * expected(s) for s in (4, 8, 12)])
    assert result.plan.schedule.value == "linear"


def test_a_schedule_function_of_the_step():
    x, y = regression(64)
    result = fit(linear(), (x, y), schedule=lambda step: 0.5 ** step, lr=0.1, epochs=2, batch_size=32)
    assert [r.lr for r in result.history] == pytest.approx([0.1 * 0.25, 0.1 * 0.5 ** 4])


def test_warmup_longer_than_the_training_is_refused():
    x, y = regression(64)
    input_error(fit, linear(), (x, y), schedule="warmup_cosine", warmup_steps=100, epochs=2, batch_size=16,
                field="warmup_steps", contains=("100", "8 optimizer steps"))


def test_a_schedule_on_an_iterable_of_unknown_length_asks_for_steps_per_epoch():
    x, y = regression(64)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(zip(x, y))

    input_error(fit, linear(), Stream(), schedule="warmup_cosine", epochs=2, batch_size=16, field="schedule", contains=("steps_per_epoch",))


@pytest.mark.parametrize(("name", "capturable"), [("adam", True), ("adamw", True), ("sgd", None)])
def test_an_optimizer_whose_step_is_captured_keeps_its_step_count_on_the_device(name, capturable):
    # torch refuses to record Adam's step in a CUDA graph unless capturable (seen on an H100 with torch 2.11: every
    # whole-step graph fell back to eager steps); SGD has no step count and no such flag.
    model = nn.Linear(4, 2)
    cfg = FitConfig(optimizer=name, weight_decay=0.01)
    captured, _ = make_optimizer(model, cfg, 1e-3, "for-loop", captured=True)
    plain, _ = make_optimizer(model, cfg, 1e-3, "for-loop")
    assert {g.get("capturable") for g in captured.param_groups} == {capturable}
    assert {g.get("capturable") for g in plain.param_groups} == ({False} if capturable else {None})


# -- the eager optimizers (engine/optim_eager.py) ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("kernel", [{"fused": True}, {"foreach": True}, {"foreach": False}])
def test_an_eager_optimizer_steps_as_torchs_own_bit_for_bit(kind, kernel):
    from gpufill.engine.optim_eager import eager_class

    extra = {"momentum": 0.9} if kind is torch.optim.SGD else {}
    weights = []
    for cls in (kind, eager_class(kind)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        optimizer = cls(model.parameters(), lr=1e-2, weight_decay=0.01, **extra, **kernel)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        x, y = torch.randn(64, 6, generator=torch.Generator().manual_seed(1)), torch.randn(64, 1, generator=torch.Generator().manual_seed(2))
        for start in range(0, 64, 8):
            loss = nn.functional.mse_loss(model(x[start:start + 8]), y[start:start + 8])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        assert isinstance(optimizer, kind)
        assert all(p.grad is not None for p in model.parameters())
        weights.append([p.detach().clone() for p in model.parameters()])
        state = optimizer.state_dict()["state"]
        assert len(state) == 4  # every parameter has its state, as torch's own keeps it
    for ours, theirs in zip(weights[1], weights[0], strict=True):
        assert torch.equal(ours, theirs)
    if kind is not torch.optim.SGD:  # fused Adam and AdamW took the listed step from the second step on
        listing = optimizer._listing
        assert (listing.groups is not None) == ("fused" in kernel) and listing.given_up == ("fused" not in kernel)


def _side_by_side(kind, steps, edit=None, **extra):
    """torch's class and gpufill's eager one trained alike for `steps` steps, `edit(optimizer, model, step)` after
    each step's update; (weights, state of each, and per step whether the listed step ran) for gpufill's."""
    from gpufill.engine import optim_listed
    from gpufill.engine.optim_eager import eager_class

    ran: list[bool] = []
    original = optim_listed.Listing.step

    def recorded(self, optimizer):
        took = original(self, optimizer)
        ran.append(took)
        return took

    out = []
    for cls in (kind, eager_class(kind)):
        ran.clear()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        groups = [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.05}, {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0}]
        optimizer = cls(groups, lr=1e-2, fused=True, **extra)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        generator = torch.Generator().manual_seed(1)
        optim_listed.Listing.step = recorded
        try:
            for step in range(steps):
                x, y = torch.randn(8, 6, generator=generator), torch.randn(8, 1, generator=generator)
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if edit is not None:
                    edit(optimizer, model, step, before=True)
                optimizer.step()
                schedule.step()
                if edit is not None:
                    edit(optimizer, model, step, before=False)
        finally:
            optim_listed.Listing.step = original
        # each model parameter's state as the optimizer holds it (a state_dict refuses a parameter swapped out of a group)
        state = [dict(optimizer.state.get(p, {})) for p in model.parameters()]
        out.append(([p.detach().clone() for p in model.parameters()], state, list(ran)))
    (theirs, their_state, _), (ours, our_state, listed) = out
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    for mine, torchs in zip(our_state, their_state, strict=True):
        assert mine.keys() == torchs.keys() and all(torch.equal(mine[name], value) for name, value in torchs.items())
    return listed


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW])
def test_a_listed_fused_step_follows_torchs_through_groups_missing_grads_new_state_and_amsgrad(kind):
    """The listed fused step (engine/optim_listed.py) against torch's own class, bit for bit: two groups of their own
    weight decay, a scheduler, a parameter without a gradient for two steps (torch's step, then lists without it, then
    torch's step when it has one again), the state loaded from a checkpoint (new tensors: torch's step, then new
    lists), maximize; and amsgrad, which torch's step always takes."""

    def edit(optimizer, model, step, *, before):
        if before and step in (4, 5):
            model[2].bias.grad = None  # torch's step skips it (and keeps its state as it was)
        if not before and step == 7:
            optimizer.load_state_dict(optimizer.state_dict())

    expected = [False, True, True, True, False, True, False, True, False, True, True, True]  # the first: no state yet
    assert _side_by_side(kind, 12, edit) == expected
    assert _side_by_side(kind, 12, edit, maximize=True) == expected
    assert _side_by_side(kind, 12, edit, amsgrad=True) == [False] * 12  # given up at the first step


@pytest.mark.parametrize("change", ["step count replaced", "a later layer's state deleted", "a later moment replaced", "fused switched off",
                                    "a parameter swapped in the group", "a tensor lr"])
def test_a_listed_step_takes_torchs_whenever_the_optimizer_was_changed_by_hand(change):
    """What a user may do to an optimizer between steps, found by the next step's checks: gpufill's eager AdamW stays
    bit for bit on torch's path (the reviewer's cases of the first listed version, each of which it got wrong)."""
    spare = nn.Parameter(torch.zeros(16))

    def edit(optimizer, model, step, *, before):
        if before or step != 3:
            return
        group, state = optimizer.param_groups[0], optimizer.state
        if change == "step count replaced":
            for p in group["params"]:
                state[p]["step"] = torch.tensor(0.0)  # a bias-correction restart
        elif change == "a later layer's state deleted":
            del state[group["params"][1]]
        elif change == "a later moment replaced":
            state[group["params"][1]]["exp_avg"] = torch.zeros_like(group["params"][1])
        elif change == "fused switched off":
            group["fused"] = False
        elif change == "a parameter swapped in the group":
            second = optimizer.param_groups[1]
            second["params"][0] = spare  # the first layer's bias is no longer stepped; spare is (it never has a grad)
        else:
            group["lr"] = torch.tensor(group["lr"])

    listed = _side_by_side(torch.optim.AdamW, 8, edit)
    assert listed[:4] == [False, True, True, True] and listed[4] is False  # the step after the change is torch's
def test_an_eager_optimizers_parameters_carry_no_autograd_graph():
    from gpufill.engine.optim_eager import eager_class

    param = nn.Parameter(torch.ones(3))
    optimizer = eager_class(torch.optim.AdamW)([param], lr=0.1, weight_decay=0.0)
    (param * 2).sum().backward()
    optimizer.step()
    assert param.grad_fn is None and not optimizer.state[param]["exp_avg"].requires_grad
    assert torch.allclose(param.detach(), torch.full((3,), 0.9), atol=1e-6)  # Adam's first step moves each weight by lr
    optimizer.zero_grad()
    assert param.grad is None


@pytest.mark.slow
def test_an_eager_fit_never_imports_torch_dynamo_and_a_compiled_plan_uses_torchs_class(tmp_path):
    import subprocess
    import sys

    script = ("import sys, torch\n"
              "from torch import nn\n"
              "import gpufill\n"
              "torch.manual_seed(0)\n"
              "x, y = torch.randn(512, 8), torch.randn(512, 1)\n"
              "r = gpufill.fit(nn.Linear(8, 1), (x, y), (x[:64], y[:64]), epochs=2, batch_size=64, verbose=False, device='cpu',\n"
              "                schedule='warmup_cosine')\n"
              "print(len(r.history), 'torch._dynamo' in sys.modules)\n"
              # a 4-variant fit_many packs them (each variant's optimizer as fit builds it) and a checkpointed fit
              # fingerprints its optimizer: neither compiles, neither imports torch._dynamo
              "m = gpufill.fit_many(lambda: nn.Linear(8, 1), (x, y), (x[:64], y[:64]), variants=[{'seed': i} for i in range(4)],\n"
              "                     epochs=2, batch_size=64, verbose=False, device='cpu', schedule='warmup_cosine')\n"
              # a campaign worker's first act on a new shape: sizing its packs against one model and torch's AdamW
              "from gpufill.engine.packs.size import measure_pack_size\n"
              "measure_pack_size(lambda: nn.Linear(8, 1), (x, y), batch=64, device='cpu', candidates=(1, 2))\n"
              f"c = gpufill.fit(nn.Linear(8, 1), (x, y), epochs=1, verbose=False, device='cpu', checkpoint_dir={str(tmp_path / 'ck')!r})\n"
              "print(len(m), len(c.history), 'torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["2", "False", "4", "1", "False"]
    from gpufill.engine.plan import Plan  # noqa: F401 - the compiled side: build_kit picks torch's own class
    cfg = FitConfig(lr=1e-3)
    compiled, _ = make_optimizer(nn.Linear(2, 1), cfg, 1e-3, "fused", eager=False)
    eager, _ = make_optimizer(nn.Linear(2, 1), cfg, 1e-3, "fused", eager=True)
    assert type(compiled) is torch.optim.AdamW
    assert type(eager) is not torch.optim.AdamW and isinstance(eager, torch.optim.AdamW)


def test_a_checkpoint_of_eager_steps_loads_into_a_captured_steps_optimizer_as_it_steps():
    """A run saved from eager steps (a float lr) resumed where the plan captures the step: the lr stays the device
    tensor the captured step reads, holding the saved value, and the group stays `capturable`; the moments load."""
    model = Tiny()
    saved_from, _ = make_optimizer(model, FitConfig(), lr=1e-3, kernel="for-loop")
    model(torch.randint(0, 10, (4, 3))).sum().backward()
    saved_from.step()
    for group in saved_from.param_groups:
        group["lr"] = 4e-4  # where a schedule had brought it
    saved = saved_from.state_dict()
    optimizer, _ = make_optimizer(model, FitConfig(), lr=1e-3, kernel="for-loop", lr_on=torch.device("cpu"), captured=True)
    tensors = [group["lr"] for group in optimizer.param_groups]
    load_optimizer_state(optimizer, saved)
    for group, tensor in zip(optimizer.param_groups, tensors, strict=True):
        assert group["lr"] is tensor and float(tensor) == pytest.approx(4e-4) and group["capturable"] is True
    first = optimizer.param_groups[0]["params"][0]
    assert torch.equal(optimizer.state[first]["exp_avg"], saved_from.state[saved_from.param_groups[0]["params"][0]]["exp_avg"])
