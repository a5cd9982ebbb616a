"""A declared ensemble is never shown as more than it is (issue 37, items 4 and 5): its rows are tied to the member
trials they were combined from (stale when those are not the file's finished members now), a partial one says
"N of M members", `results --summary --format json|csv` hold the rows the table shows, and bad `ensemble.lookbacks`
or `ensemble.families` are refused at their line before anything runs."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from gpufill.campaign.spec.ensemble_spec import EnsembleSpec
from gpufill.campaign.results.ensembles import read_declared
from gpufill.campaign.results.reading import read_best
from gpufill.campaign.run.runner import Campaign
from gpufill.campaign.spec.spec import CHECKED, CampaignSpec, load_campaign
from gpufill.campaign.store.store import Store
from gpufill.errors import InputError
from tests.helpers import run_cli

# Classical members only: a run takes seconds.
YAML = """name: members
data: {source: synthetic, projects: 2, length: 200, seed: 1}
task: {lookback: [6], horizon: 1}
models:
  linear: {}
ensemble: {families: [linear], combine: median}
seeds: [0, 1]
resources: {retries: 0}
"""


class Stopped(Exception):
    """A re-run stopped after the store took the file's trials, before any trial finished."""


def _stop(*_args: object) -> None:
    raise Stopped


def _run(path, work, *, interrupted: bool = False):  # noqa: ANN202 - a RunOutcome
    if interrupted:
        with pytest.raises(Stopped):
            Campaign.from_yaml(path, work).run(on_start=_stop, executor="inline")
        return None
    return Campaign.from_yaml(path, work).run(executor="inline")


def _ensemble_rows(rows: list[dict]) -> list[dict]:
    return [row for row in rows if str(row["family"]).startswith("ensemble (")]


def _declared(work) -> tuple[list[dict], list[dict]]:
    store = Store.open(work)
    try:
        return read_declared(store), read_declared(store, include_stale=True)
    finally:
        store.close()


@pytest.fixture
def finished(tmp_path):
    """A finished campaign with a declared ensemble of two linear seeds per project."""
    path = tmp_path / "members.yaml"
    path.write_text(YAML)
    outcome = _run(path, tmp_path / "work")
    assert (outcome.done, outcome.failed) == (4, 0)
    current, _ = _declared(tmp_path / "work")
    assert [(row["project"], row["members"]) for row in current] == [("p000", 2), ("p001", 2)]
    return path, tmp_path / "work", current


@pytest.mark.parametrize(("change", "why"), [
    (("seed: 1}", "seed: 2}"), "the data changed"),
    (("seeds: [0, 1]", "seeds: [0]"), "a member trial is no longer in the file"),
    (("combine: median", "combine: mean"), "the ensemble is combined another way"),
])
def test_after_a_change_and_an_interrupted_rerun_the_old_ensemble_is_stale(finished, capsys, change, why):
    path, work, before = finished
    path.write_text(path.read_text().replace(*change))
    _run(path, work, interrupted=True)  # the store holds the file as it is now; no trial of it finished
    current, every = _declared(work)
    assert current == [], why
    assert [(row["project"], row["mae"], row["stale"]) for row in every] == [(row["project"], row["mae"], True) for row in before], why
    assert _ensemble_rows(read_best(work)) == []  # hidden, as stale trials are
    stale = _ensemble_rows(read_best(work, include_stale=True))
    assert [(row["project"], row["stale"], row["mae"]) for row in stale] == [(row["project"], True, row["mae"]) for row in before]
    code, out, _ = run_cli(capsys, "results", "--summary", "--workdir", work)
    assert code == 0 and "ensemble" not in out
    code, out, _ = run_cli(capsys, "results", "--summary", "--all", "--workdir", work, "--format", "json")
    shown = _ensemble_rows(json.loads(out))
    assert code == 0 and [(row["project"], row["stale"]) for row in shown] == [("p000", True), ("p001", True)]


def test_a_finished_rerun_makes_the_ensemble_current_again(finished):
    path, work, before = finished
    assert [(row["expected"], row["stale"], len(row["trial_ids"])) for row in before] == [(2, False, 2)] * 2  # tied to its 2 members
    path.write_text(path.read_text().replace("seed: 1}", "seed: 2}"))
    _run(path, work, interrupted=True)
    assert _declared(work)[0] == []
    _run(path, work)  # the new data's members finish: the ensemble is theirs
    current, every = _declared(work)
    assert [(row["project"], row["members"], row["stale"]) for row in current] == [("p000", 2, False), ("p001", 2, False)]
    assert {row["mae"] for row in current}.isdisjoint({row["mae"] for row in before}) and len(every) == 2


def test_members_added_to_the_file_and_not_run_yet_make_the_ensemble_partial(finished, capsys):
    path, work, before = finished
    path.write_text(path.read_text().replace("seeds: [0, 1]", "seeds: [0, 1, 2]"))
    _run(path, work, interrupted=True)  # seed 2 is pending: the kept rows combine 2 of the 3 members
    rows = _ensemble_rows(read_best(work))
    assert [(row["family"], row["seeds"], row["mae"]) for row in rows] == [("ensemble (median; 2 of 3 members)", 2, row["mae"]) for row in before]
    code, out, _ = run_cli(capsys, "results", "--summary", "--workdir", work)
    assert code == 0 and out.count("2 of 3 members") == 2
    current, _ = _declared(work)
    assert [(row["project"], row["members"], row["expected"], row["stale"]) for row in current] == [("p000", 2, 3, False), ("p001", 2, 3, False)]


@pytest.mark.slow
def test_an_ensemble_whose_members_partly_failed_says_how_many_of_them_it_holds(tmp_path, capsys):
    path = tmp_path / "failing.yaml"
    path.write_text(YAML.replace("linear: {}", "linear: {}\n  tests.campaign_models:always_raises: {}")
                    .replace("families: [linear]", "families: [linear, 'tests.campaign_models:always_raises']")
                    + "train: {epochs: 1, early_stopping: null}\n")
    outcome = _run(path, tmp_path / "work")
    assert (outcome.done, outcome.failed) == (4, 4)  # per project: 2 linear seeds done, 2 failing members failed
    rows = _ensemble_rows(read_best(tmp_path / "work"))
    assert [row["family"] for row in rows] == ["ensemble (median; 2 of 4 members)"] * 2
    code, out, _ = run_cli(capsys, "results", "--summary", "--workdir", tmp_path / "work")
    assert code == 0 and out.count("2 of 4 members") == 2 and "ensemble (median)" not in out
    current, _ = _declared(tmp_path / "work")
    assert [(row["project"], row["members"], row["expected"], row["families"]) for row in current] == [("p000", 2, 4, ["linear"]),
                                                                                                        ("p001", 2, 4, ["linear"])]
    code, out, _ = run_cli(capsys, "report", "--workdir", tmp_path / "work")
    page = (tmp_path / "work" / "report.html").read_text()
    assert code == 0 and page[page.index("id='ensemble'"):].split("</table>")[0].count("2 of 4 members") == 2


@pytest.mark.parametrize("all_", [False, True])
def test_the_json_and_csv_summaries_hold_the_rows_the_table_shows(finished, capsys, all_):
    _path, work, before = finished
    table = read_best(work, include_stale=all_)  # what the table view prints
    assert len(_ensemble_rows(table)) == 2
    extra = ["--all"] if all_ else []
    code, out, _ = run_cli(capsys, "results", "--summary", "--workdir", work, "--format", "json", *extra)
    as_json = json.loads(out)
    code_csv, out_csv, _ = run_cli(capsys, "results", "--summary", "--workdir", work, "--format", "csv", *extra)
    as_csv = pd.read_csv(io.StringIO(out_csv)).to_dict("records")
    assert code == code_csv == 0
    for shown in (as_json, as_csv):
        assert [(row["project"], row["family"]) for row in shown] == [(row["project"], row["family"]) for row in table]
        assert [row["mae"] for row in shown] == pytest.approx([row["mae"] for row in table], rel=1e-9)
        assert [row["project"] for row in _ensemble_rows(shown)] == [row["project"] for row in before]
        assert [row["mae"] for row in _ensemble_rows(shown)] == pytest.approx([row["mae"] for row in before], rel=1e-9)
        assert [row["seeds"] for row in _ensemble_rows(shown)] == [2, 2]
        assert ("stale" in shown[0]) is all_


# --- item 5: ensemble.lookbacks and ensemble.families ----------------------------------------------------------------

BAD = """name: bad
data: {source: synthetic, projects: 2, length: 200, seed: 1}
task: {lookback: [6], horizon: 3, split: {val: 20, test: 20}}
models:
  mlp: {hidden_size: 8}
  linear: {}
ensemble:
  families: [mlp, linear]
  lookbacks:
    - 2
    - VALUE
train: {epochs: 2, early_stopping: null}
seeds: [0, 1]
"""


@pytest.mark.parametrize(("value", "problem", "fix"), [
    ("1.0e9", "'1.0e9' is text to YAML, not a number", "in digits without quotes (1000000000)"),
    ('"4"', "'4' is text to YAML, not a number", "in digits without quotes (4)"),
    ("-2", "-2 is not a multiple >= 1 of task.horizon", "multiples of task.horizon in digits"),
    ("0", "0 is not a multiple >= 1 of task.horizon", "multiples of task.horizon in digits"),
    ("true", "true is not a number", "multiples of task.horizon in digits"),
    ("1.5", "1.5 x task.horizon 3 = 4.5 steps, no whole lookback (it would be rounded to another one)", "a whole number of steps"),
    ("2.5", "2.5 x task.horizon 3 = 7.5 steps, no whole lookback (it would be rounded to another one)", "a whole number of steps"),
])
def test_a_bad_lookback_multiple_is_refused_at_its_line_before_anything_runs(tmp_path, capsys, value, problem, fix):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD.replace("VALUE", value))
    with pytest.raises(InputError) as error:
        load_campaign(path)
    assert (error.value.where, error.value.field, error.value.problem) == (f"{path}:11", "ensemble.lookbacks", problem)
    assert fix in error.value.fix
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and out == "" and err.strip().splitlines() == [f"gpufill: error: {error.value.one_line()}"]
    assert not (tmp_path / "work").exists()  # nothing ran, nothing was written


@pytest.mark.parametrize("value", ["[]", "[1.5, 2.5]", "4"])
def test_a_lookbacks_value_that_is_not_a_list_of_multiples_is_refused(tmp_path, value):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD.replace("  lookbacks:\n    - 2\n    - VALUE\n", f"  lookbacks: {value}\n"))
    with pytest.raises(InputError) as error:
        load_campaign(path)
    assert (error.value.where, error.value.field) == (f"{path}:9", "ensemble.lookbacks")
    assert error.value.problem == {"[]": "expected a list of multiples of task.horizon, got []",
                                   "[1.5, 2.5]": "1.5 x task.horizon 3 = 4.5 steps, no whole lookback (it would be rounded to another one)",
                                   "4": "expected a list of multiples of task.horizon, got 4"}[value]


def test_a_fractional_multiple_that_makes_whole_steps_is_a_lookback(tmp_path):
    """The docs' recipe takes 1.5 horizons: with an even horizon it is a whole lookback, kept as written (1.5), and the
    scheduler and a worker read the same lookbacks."""
    path = tmp_path / "half.yaml"
    path.write_text(BAD.replace("horizon: 3", "horizon: 4").replace("    - VALUE\n", "    - 1.5\n"))
    spec = load_campaign(path)
    assert spec.ensemble.lookbacks == [2, 1.5] and spec.every_lookback == [6, 8]  # 1.5 x 4 = 6, task.lookback's 6 already
    assert spec.lookbacks("mlp") == [6, 8]
    worker = CampaignSpec.model_validate(json.loads(spec.model_dump_json()), context=CHECKED)
    assert worker.model_dump() == spec.model_dump() and worker.every_lookback == [6, 8]


@pytest.mark.parametrize("families", ["[]", "[ ]"])
def test_an_empty_families_list_is_refused(tmp_path, capsys, families):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD.replace("families: [mlp, linear]", f"families: {families}").replace("    - VALUE\n", ""))
    with pytest.raises(InputError) as error:
        load_campaign(path)
    assert (error.value.where, error.value.field, error.value.problem) == (f"{path}:8", "ensemble.families", "an empty list names no member family")
    assert "leave families out" in error.value.fix
    code, _, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "ensemble.families" in err


def test_the_scheduler_and_the_workers_check_the_same_ensemble_the_same_way(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(BAD.replace("VALUE", "4.0"))  # a whole float is a whole multiple: kept as 4, never rounded
    spec = load_campaign(path)
    assert spec.ensemble.lookbacks == [2, 4] and spec.task.lookback == [6] and spec.every_lookback == [6, 12]
    worker = CampaignSpec.model_validate(json.loads(spec.model_dump_json()), context=CHECKED)  # what a worker validates
    assert worker.model_dump() == spec.model_dump()
    for bad, problem in ((["4"], "'4' is text to YAML, not a number"), ([True], "true is not a number"), ([-2], "-2 is not a multiple >= 1"),
                         ([0.5], "0.5 is not a multiple >= 1")):
        with pytest.raises(ValueError, match=problem):  # the spec model itself runs the one check (a worker's spec too)
            EnsembleSpec.model_validate({"lookbacks": bad})
    with pytest.raises(ValueError, match="an empty list names no member family"):
        EnsembleSpec.model_validate({"families": []})
