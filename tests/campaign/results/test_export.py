"""Results exported as JSON keep every float exactly (what MLflow and a reader's script compare against)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from gpufill.campaign.results.export import write_frame


def test_json_keeps_every_float_exactly_and_writes_nan_and_inf_as_null(tmp_path, capsys):
    values = [0.00505422299465863, 1.2345678901234567e-20, 123456789.12345679, np.inf, math.nan]
    frame = pd.DataFrame({"duration_s": values, "project": ["a", None, "é", "d", "e"], "seed": [0, 1, 2, 3, 4]})
    write_frame(frame, "json", None)
    printed = json.loads(capsys.readouterr().out)
    write_frame(frame, "json", tmp_path / "rows.json")
    written = json.loads((tmp_path / "rows.json").read_text(encoding="utf-8"))
    for rows in (printed, written):
        assert [row["duration_s"] for row in rows] == [*values[:3], None, None]
        assert [row["project"] for row in rows] == ["a", None, "é", "d", "e"]
        assert [row["seed"] for row in rows] == [0, 1, 2, 3, 4]
