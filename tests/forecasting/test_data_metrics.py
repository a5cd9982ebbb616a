"""Forecast metrics on hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpufill.forecasting.data import forecast_metrics, mae, mase, rmse, smape
from gpufill.errors import InputError

Y = np.array([1.0, 2.0, 3.0, 4.0])
P = np.array([2.0, 2.0, 1.0, 4.0])  # errors 1, 0, 2, 0


def test_hand_computed_values():
    assert mae(Y, P) == pytest.approx(0.75)
    assert rmse(Y, P) == pytest.approx(math.sqrt(1.25))
    # sMAPE terms: 200*1/3, 0, 200*2/4, 0
    assert smape(Y, P) == pytest.approx((200 / 3 + 100) / 4)
    assert mase(Y, P, scale=0.5) == pytest.approx(1.5)


def test_smape_zero_over_zero_counts_as_zero():
    assert smape(np.array([0.0, 1.0]), np.array([0.0, 3.0])) == pytest.approx(50.0)  # terms 0 and 200*2/4
    assert smape(np.zeros(3), np.zeros(3)) == 0.0
    assert smape(np.array([1.0]), np.array([-1.0])) == pytest.approx(200.0)  # the upper bound


def test_two_dimensional_and_torch_inputs_give_plain_floats():
    y2, p2 = Y.reshape(2, 2), P.reshape(2, 2)
    expected = forecast_metrics(Y, P, mase_scale=0.5)
    assert set(expected) == {"mae", "rmse", "smape", "mase"}
    assert expected == pytest.approx({"mae": 0.75, "rmse": math.sqrt(1.25), "smape": (200 / 3 + 100) / 4, "mase": 1.5})
    for truth, pred in ((y2, p2), (torch.tensor(Y), torch.tensor(P, dtype=torch.float32)), (torch.tensor(Y), P)):
        got = forecast_metrics(truth, pred, mase_scale=0.5)
        assert got == pytest.approx(expected)
        assert all(type(value) is float for value in got.values())


def test_tensor_with_grad_is_accepted():
    pred = torch.tensor(P, requires_grad=True)
    assert mae(torch.tensor(Y), pred) == pytest.approx(0.75)


def test_shape_mismatch_error():
    with pytest.raises(InputError) as err:
        mae(Y, P[:3])
    message = str(err.value)
    assert message.startswith("metrics: y_pred: y_true has shape (4,) but y_pred has shape (3,)") and "fix:" in message


def test_empty_error():
    with pytest.raises(InputError, match=r"^metrics: y_true: no values to score; fix: pass at least one prediction$"):
        rmse(np.zeros(0), np.zeros(0))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_mase_scale(scale):
    with pytest.raises(InputError) as err:
        mase(Y, P, scale)
    message = str(err.value)
    assert message.startswith("metrics: mase_scale: scale must be a positive finite number")
    assert "fix: pass WindowedProject.mase_scale" in message
