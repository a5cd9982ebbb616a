"""The instrumentation in-process: what it counts on a known loop, and that `remove()` leaves the
process as it found it (the `gpufill doctor|watch|bench -- COMMAND` tests run it in a child)."""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpufill.script.instrument import WHOLE_RUN, install


def _train(steps: int) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16 * steps, 8), torch.randn(16 * steps, 1))
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(data, batch_size=16):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()
        loss.item()


def test_a_whole_run_in_process_counts_every_step_sync_and_flop_and_remove_puts_everything_back(tmp_path):
    before = {name: getattr(torch.Tensor, name) for name in ("backward", "item", "tolist", "cpu", "numpy", "to")}
    loader_init, excepthook = DataLoader.__init__, sys.excepthook
    installed = install(tmp_path, steps=WHOLE_RUN, warmup=2, bucket_s=60.0)
    assert installed is not None
    try:
        _train(12)
    finally:
        installed.remove()
    recorder = installed.recorder
    recorder.write()  # digests the steps, writes the report and the timeline's last interval
    assert (recorder.step_count, recorder.measured) == (12, 10)  # steps 3 to 12 measured (2 warm-up)
    # Each line's reads from the end of the warm-up on: after steps 2 to 12 (one per step and line).
    assert recorder.syncs == {"item() at tests/script/test_instrument.py:26": 11, "item() at tests/script/test_instrument.py:27": 11}
    assert recorder.flops == 2 * 16 * 8 + 2 * 16 * 8  # one step: the forward matmul and the weight's gradient (the input needs none)
    assert recorder.matmul_dtypes == {"float32": 2}
    # The lines a fix would edit: where the optimizer was built (fused=True) and the backward (autocast before it).
    report = json.loads(next(tmp_path.glob("report-*.json")).read_text())
    assert (report["optimizers"][0]["at"], report["backward_at"]) == ("tests/script/test_instrument.py:20", "tests/script/test_instrument.py:24")
    assert recorder.loaders[0]["batch_size"] == 16 and recorder.loaders[0]["created"] == 1 and recorder.batch_size == 16
    assert recorder.totals[0] >= sum(recorder.totals[1:5]) > 0  # the step holds its phases
    # Put back: the methods, the DataLoader, the excepthook, the optimizer hooks and the atexit writer.
    assert {name: getattr(torch.Tensor, name) for name in before} == before
    assert (DataLoader.__init__, sys.excepthook) == (loader_init, excepthook)
    _train(3)
    assert recorder.step_count == 12 and recorder.syncs["item() at tests/script/test_instrument.py:26"] == 11
    # One timeline interval (60 s long): every step after the first is in it.
    (timeline,) = [json.loads(line) for line in next(tmp_path.glob("steps-*.jsonl")).read_text().splitlines()]
    assert timeline["steps"] == 11 and timeline["step_s"] > sum(record[0] for record in recorder.records) > 0  # 11 steps > the 10 measured
    assert report["measured_steps"] == 10 and len(report["records"]) == 10 and report["flops_per_step"] == 512


def _hand_updated(steps: int, lr: float = 0.1) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    for _ in range(steps):
        model.zero_grad()
        nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1)).backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
    return model


def test_parameters_updated_by_hand_make_each_backward_a_step(tmp_path):
    installed = install(tmp_path, steps=WHOLE_RUN, warmup=2, bucket_s=60.0)
    try:
        _hand_updated(10)
    finally:
        installed.remove()
    recorder = installed.recorder
    recorder.write()
    report = json.loads(next(tmp_path.glob("report-*.json")).read_text())
    # Seen at the second backward (the values changed with no optimizer step): steps end at backwards 2 to 10.
    assert report["stepped_by"] == "backward (parameters updated by hand)" and recorder.step_count == 9
    assert report["optimizers"] == [{"class": "by hand (no optimizer)", "parameters": 8 * 16 + 16 + 16 + 1, "tensors": 4, "lr": None,
                                     "foreach": None, "fused": None, "at": None}]
    assert report["measured_steps"] == 7 and all(r["step_s"] >= r["backward_s"] > 0 and r["optimizer_s"] == 0 for r in report["records"])
    assert report["devices"] == ["cpu"] and report["flops_per_step"] > 0


def test_gradient_accumulation_is_not_mistaken_for_a_hand_update(tmp_path):
    installed = install(tmp_path, steps=WHOLE_RUN, warmup=1, bucket_s=60.0)
    try:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            for _ in range(4):  # four micro-batches per optimizer step: the parameters do not change between their backwards
                nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        installed.remove()
    recorder = installed.recorder
    recorder.write()
    report = json.loads(next(tmp_path.glob("report-*.json")).read_text())
    assert report["stepped_by"] == "optimizer" and recorder.step_count == 5 and report["optimizers"][0]["class"] == "SGD"
    assert recorder.hand.decided is False and recorder.hand.checks == 3  # three unchanged comparisons, then the optimizer stepped


def test_a_sites_reads_are_counted_with_the_steps_they_fall_in(tmp_path):
    installed = install(tmp_path, steps=WHOLE_RUN, warmup=0, bucket_s=60.0)
    try:
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            loss = nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                accuracy = model(torch.randn(4, 8)).mean()
            accuracy.item()  # a per-step read (under no_grad or not): one in every step
        with torch.no_grad():
            for _ in range(30):
                model(torch.randn(4, 8)).sum().item()  # an evaluation loop: 30 reads, all between the same two steps
    finally:
        installed.remove()
    recorder = installed.recorder
    per_step, evaluation = sorted(recorder.syncs, key=lambda site: recorder.syncs[site])
    assert (recorder.syncs[per_step], recorder.sync_steps[per_step]) == (4, 4)
    assert (recorder.syncs[evaluation], recorder.sync_steps[evaluation]) == (30, 1)
