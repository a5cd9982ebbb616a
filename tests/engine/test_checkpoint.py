"""Checkpoints: state dicts + JSON metadata, resumed exactly, loaded with weights_only=True, refused for
another model, optimizer or data, and every damaged or unsafe file a one-line error."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from gpufill.engine.checkpoint import FORMAT
from gpufill.engine.loop import fit
from gpufill.engine.result import FitCallback
from tests.engine.common import assert_same_weights, input_error
from tests.engine.equivalence import data, dict_loss, make_model

SETTINGS = dict(loss=dict_loss, epochs=4, batch_size=16, lr=0.01, weight_decay=0.1, schedule="warmup_cosine",
                checkpoint_every=1, seed=11, optimizer_kernel="for-loop")


class Stop(Exception):
    pass


class StopAfter(FitCallback):
    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_end(self, record):
        if record.epoch == self.epoch:
            raise Stop


def _interrupted(directory, stop_at: int = 2) -> None:
    with pytest.raises(Stop):
        fit(make_model(), data(), data(40), checkpoint_dir=directory, callbacks=[StopAfter(stop_at)], **SETTINGS)


def test_resuming_dict_batches_with_a_schedule_ends_where_an_uninterrupted_run_does(tmp_path):
    straight = fit(make_model(), data(), data(40), **SETTINGS)
    _interrupted(tmp_path)
    resumed = fit(make_model(seed=5), data(), data(40), checkpoint_dir=tmp_path, resume=True, **SETTINGS)
    assert "resumed after epoch 2" in " ".join(resumed.events)
    assert [r.lr for r in resumed.history] == pytest.approx([r.lr for r in straight.history])  # the schedule continued
    assert [r.train_loss for r in resumed.history] == pytest.approx([r.train_loss for r in straight.history], abs=1e-6)
    assert_same_weights(straight.model, resumed.model, atol=1e-6)


def test_the_checkpoint_is_tensors_and_json_that_load_with_weights_only(tmp_path):
    fit(make_model(), data(), checkpoint_dir=tmp_path, **{**SETTINGS, "epochs": 2})
    payload = torch.load(tmp_path / "last.pt", weights_only=True)
    meta = json.loads(payload["meta_json"])
    assert meta == json.loads((tmp_path / "meta.json").read_text())
    assert meta["format"] == FORMAT and meta["state"]["epoch"] == 2 and len(meta["state"]["history"]) == 2
    assert set(meta["identity"]) == {"model", "optimizer", "data", "settings"} and meta["identity"]["settings"]["seed"] == 11
    assert meta["plan"]["schedule"]["value"] == "warmup_cosine"
    assert set(payload) == {"model", "optimizer", "precision", "rng", "best_weights", "schedule", "meta_json"}
    assert sorted(os.listdir(tmp_path)) == [".gpufill-training.lock", "last.pt", "meta.json"]  # no temporary file left; the lock stays (flock)


@pytest.mark.parametrize(("change", "what"), [
    (dict(model=lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))), "another model"),
    (dict(optimizer="sgd"), "another optimizer"),
    (dict(train=lambda: data(91)), "other training data"),
])
def test_resuming_with_another_model_optimizer_or_data_is_refused(tmp_path, change, what):
    _interrupted(tmp_path, stop_at=1)
    before = (tmp_path / "last.pt").read_bytes()
    model = change.get("model", make_model)()
    train = change.get("train", data)()
    settings = {**SETTINGS, **{k: v for k, v in change.items() if k not in ("model", "train")}}
    input_error(fit, model, train, data(40), checkpoint_dir=tmp_path, resume=True, field="resume", contains=(what, "last.pt"), **settings)
    assert (tmp_path / "last.pt").read_bytes() == before  # nothing already computed is lost


def one_ulp_off(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same data as another CPU computes it: every value one ulp off."""
    return {key: torch.nextafter(value, torch.full_like(value, torch.inf)) for key, value in batch.items()}


def test_data_named_by_data_id_resumes_on_another_cpus_last_bits_and_is_refused_under_another_name(tmp_path):
    with pytest.raises(Stop):
        fit(make_model(), data(), data(40), checkpoint_dir=tmp_path, callbacks=[StopAfter(1)], data_id="sales-v1", **SETTINGS)
    before = (tmp_path / "last.pt").read_bytes()
    moved = one_ulp_off(data())
    assert not torch.equal(moved["x"], data()["x"])
    input_error(fit, make_model(), moved, data(40), checkpoint_dir=tmp_path, resume=True, data_id="sales-v2", field="resume",
                contains=("other training data", "last.pt"), **SETTINGS)
    input_error(fit, make_model(), data(91), data(40), checkpoint_dir=tmp_path, resume=True, data_id="sales-v1", field="resume",
                contains=("other training data",), **SETTINGS)  # a name never covers another size
    assert (tmp_path / "last.pt").read_bytes() == before
    resumed = fit(make_model(seed=5), moved, data(40), checkpoint_dir=tmp_path, resume=True, data_id="sales-v1", **SETTINGS)
    assert "resumed after epoch 1" in " ".join(resumed.events) and len(resumed.history) == SETTINGS["epochs"]


def test_unnamed_data_is_known_by_its_values():
    from gpufill.engine.inputs import as_source, fingerprint

    assert fingerprint(as_source(data(), "train")) == fingerprint(as_source(data(), "train"))
    assert fingerprint(as_source(one_ulp_off(data()), "train")) != fingerprint(as_source(data(), "train"))
    assert fingerprint(as_source(one_ulp_off(data()), "train"), "v1") == fingerprint(as_source(data(), "train"), "v1")


class _RunsCode:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_checkpoint_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"
    directory = tmp_path / "ckpt"
    directory.mkdir()
    torch.save({"meta_json": "{}", "evil": _RunsCode(str(marker))}, directory / "last.pt")
    input_error(fit, make_model(), data(), checkpoint_dir=directory, resume=True, field="checkpoint_dir",
                contains=("Python objects", "it was not run"), **SETTINGS)
    assert not marker.exists()


@pytest.mark.parametrize(("damage", "words"), [
    (lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]), "cannot load"),
    (lambda path: path.write_bytes(b"\x00garbage" * 50), "cannot load"),
    (lambda path: path.write_bytes(b""), "cannot load"),
    (lambda path: torch.save({"model": {}}, path), "no metadata"),
    (lambda path: torch.save({"meta_json": "{not json"}, path), "metadata is damaged"),
    (lambda path: torch.save({"meta_json": json.dumps({"format": 1})}, path), "format 1"),
])
def test_a_damaged_checkpoint_is_one_line(tmp_path, damage, words):
    _interrupted(tmp_path, stop_at=1)
    damage(tmp_path / "last.pt")
    input_error(fit, make_model(), data(), data(40), checkpoint_dir=tmp_path, resume=True, field="checkpoint_dir",
                contains=(words, str(tmp_path / "last.pt")), **SETTINGS)


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_training(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    input_error(fit, make_model(), data(), checkpoint_dir=path, field="checkpoint_dir", **SETTINGS)
