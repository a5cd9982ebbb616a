"""`search:` campaigns: the space's forms and their refusals at their line, random and TPE runs on synthetic data,
and a search killed mid-run that resumes with the same proposals (campaign/trials/search.py, campaign/spec/search_spec.py)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufill.campaign.run.runner import Campaign, read_results
from gpufill.campaign.spec.search_spec import Range
from gpufill.campaign.spec.spec import load_campaign
from gpufill.campaign.store.store import Store
from gpufill.errors import InputError
from tests.helpers import run_cli

pytest.importorskip("optuna")

MODELS = "  mlp: {hidden_size: {low: 16, high: 64, step: 16}, lr: {low: 1.0e-4, high: 1.0e-2, log: true}, epochs: [2, 3]}\n  linear: {}\n"


def search_file(tmp_path: Path, *, search: str = "{sampler: tpe, trials: 6, batch: 3, seed: 7}", models: str = MODELS,
                split: str = "{val: 14, test: 14}", extra: str = "", name: str = "search", lookbacks: str = "[14, 28]") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n"
                    "data: {source: synthetic, projects: 3, length: 200, seed: 0}\n"
                    f"task: {{lookback: {lookbacks}, horizon: 7, split: {split}, mode: global}}\n"
                    f"search: {search}\n"
                    f"models:\n{models}"
                    "train: {epochs: 2, early_stopping: null}\n"
                    "seeds: [0]\n"
                    "resources: {retries: 0}\n" + extra)
    return path


def search_event(workdir: Path) -> str:
    """The run's one event saying how the search ended."""
    with sqlite3.connect(workdir / "gpufill.db") as con:
        (message,), = con.execute("SELECT message FROM events WHERE message LIKE 'search:%'").fetchall()
    return message


def refused(path: Path) -> InputError:
    with pytest.raises(InputError) as caught:
        load_campaign(path)
    return caught.value


def test_a_range_written_as_yaml_text_1e_4_is_the_number_it_reads_as(tmp_path):
    spec = load_campaign(search_file(tmp_path, models="  mlp: {lr: {low: 1e-4, high: 1e-2, log: true}}\n"))
    assert spec.models["mlp"]["lr"] == Range(low=1e-4, high=1e-2, log=True, integer=False)


def test_a_list_an_int_range_and_a_log_float_range_parse_as_the_space(tmp_path):
    spec = load_campaign(search_file(tmp_path))
    grid = spec.models["mlp"]
    assert grid["hidden_size"] == Range(low=16, high=64, step=16, integer=True)
    assert grid["lr"] == Range(low=1e-4, high=1e-2, log=True, integer=False)
    assert grid["epochs"] == [2, 3]
    assert (spec.search.sampler, spec.search.trials, spec.search.batch, spec.search.seed, spec.search_metric) == ("tpe", 6, 3, 7, "val_mae")


@pytest.mark.parametrize("models, line, field, words", [
    ("  mlp: {hidden_size: {low: 64, high: 16}}\n", 6, "models.mlp.hidden_size", "range low 64 is not below high 16"),
    ("  mlp: {lr: {low: 0.0, high: 1.0e-2, log: true}}\n", 6, "models.mlp.lr.low", "a log range needs low > 0"),
    ("  mlp: {lr: {low: 1.0e-4, high: 1.0e-2, log: true, step: 1.0e-4}}\n", 6, "models.mlp.lr", "a range takes step or log, not both"),
    ("  mlp: {lr: {low: small, high: 1.0e-2}}\n", 6, "models.mlp.lr.low", "range low must be a finite number, got 'small'"),
    ("  mlp: {lr: {low: 1.0e-4, high: .inf}}\n", 6, "models.mlp.lr.high", "range high must be a finite number, got inf"),
    ("  mlp: {hidden_size: {low: 16, high: 64, step: 0}}\n", 6, "models.mlp.hidden_size.step", "range step must be > 0"),
    ("  mlp: {lr: {low: -1.0, high: 1.0}}\n", 6, "models.mlp.lr", "expected a value > 0, got -1.0"),
    ("  mlp: {width: {low: 1, high: 4}}\n", 6, "models.mlp.width", "unknown parameter 'width'"),
])
def test_a_malformed_range_is_refused_at_its_line(tmp_path, models, line, field, words):
    error = refused(search_file(tmp_path, models=models))
    assert error.where == f"{tmp_path / 'search.yaml'}:{line}"
    assert error.field == field
    assert words in error.problem


def test_a_range_outside_a_search_is_refused_at_its_line(tmp_path):
    path = search_file(tmp_path)
    path.write_text(path.read_text().replace("search: {sampler: tpe, trials: 6, batch: 3, seed: 7}\n", ""))
    error = refused(path)
    assert (error.where, error.field) == (f"{path}:5", "models.mlp.hidden_size")
    assert "a range {low, high} is a search space, and this campaign has no search: section" in error.problem
    assert "add search:" in error.fix


@pytest.mark.parametrize("search, split, extra, field, words", [
    ("{trials: 5, metric: smape}", "{val: 14, test: 14}", "", "search.metric", "unknown search metric 'smape'"),
    ("{trials: 5, metric: val_smape}", "{val: 14, test: 14}", "", "search.metric", "search.metric val_smape and task.metric mae disagree"),
    ("{trials: 0}", "{val: 14, test: 14}", "", "search.trials", ""),
    ("{trials: 5, sampler: cmaes}", "{val: 14, test: 14}", "", "search.sampler", ""),
    ("{trials: 5, direction: maximize}", "{val: 14, test: 14}", "", "search.direction", ""),
    ("{trials: 5}", "{val: 0, test: 14}", "", "task.split.val", "scored on the validation window, and split.val is 0"),
    ("{trials: 5}", "{val: 14, test: 14}", "ensemble: {families: [mlp]}\n", "ensemble", "a declared ensemble combines a grid's trials"),
    ("{trials: 5, pruner: {kind: hyperband}}", "{val: 14, test: 14}", "", "search.pruner.kind", ""),
    ("{trials: 5, pruner: {kind: asha, reduction_factor: 1}}", "{val: 14, test: 14}", "", "search.pruner.reduction_factor", ""),
    ("{trials: 5, seed: -3}", "{val: 14, test: 14}", "", "search.seed", "expected a value >= 0, got -3"),  # numpy's SeedSequence raised
    ("{trials: 5, seed: 1.5}", "{val: 14, test: 14}", "", "search.seed", "expected an integer"),
    ("{trials: 20000, batch: 20000}", "{val: 14, test: 14}", "", "search.batch", "20,000 is more than the 256 gpufill allows"),
])
def test_a_search_the_file_cannot_hold_is_refused_in_one_line(tmp_path, search, split, extra, field, words):
    error = refused(search_file(tmp_path, search=search, split=split, extra=extra))
    assert error.field == field
    assert error.where.startswith(f"{tmp_path / 'search.yaml'}:")
    assert words in error.problem
    assert "\n" not in str(error)


def test_the_samplers_and_pruners_a_file_may_name_are_the_registries_and_each_builds(tmp_path):
    """One list each: the file's accepted names are SAMPLERS' and PRUNERS' (and none); an unknown one is refused at its
    line naming them all; every entry builds its Optuna object (no name falls through to another sampler)."""
    from typing import get_args

    from gpufill.campaign.spec.search_spec import PRUNERS, SAMPLERS, PrunerSpec, SearchSpec
    from gpufill.campaign.trials.search import optuna_module

    assert get_args(SearchSpec.model_fields["sampler"].annotation) == tuple(SAMPLERS) == ("random", "tpe", "grid")
    assert get_args(PrunerSpec.model_fields["kind"].annotation) == ("none", *PRUNERS) == ("none", "asha", "median")
    error = refused(search_file(tmp_path, search="{trials: 5, sampler: cmaes}"))
    assert error.where == f"{tmp_path / 'search.yaml'}:4" and all(name in error.fix for name in SAMPLERS)
    optuna = optuna_module()
    space = {"hidden_size": optuna.distributions.CategoricalDistribution([16, 32])}
    built = {name: type(kind.build(optuna, 0, space)).__name__ for name, kind in SAMPLERS.items()}
    assert built == {"random": "RandomSampler", "tpe": "TPESampler", "grid": "GridSampler"}
    pruners = {name: type(kind.build(optuna, {"min_epochs": 2, "reduction_factor": 3})).__name__ for name, kind in PRUNERS.items()}
    assert pruners == {"asha": "SuccessiveHalvingPruner", "median": "MedianPruner"}


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_search_trains_its_budget_of_distinct_configurations_inside_the_space(tmp_path, sampler):
    path = search_file(tmp_path, search=f"{{sampler: {sampler}, trials: 7, batch: 3, seed: 1}}")
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    results = read_results(tmp_path / "work")
    assert (outcome.done, outcome.failed) == (7, 0) and len(results) == 7
    assert (results["status"] == "done").all() and results["val_mae"].notna().all()
    configs = {(row.family, row.params, row.train, row.lookback) for row in results.itertuples()}
    assert len(configs) == 7  # every proposal a new configuration
    for row in results[results["family"] == "mlp"].itertuples():
        params, train = json.loads(row.params), json.loads(row.train)
        assert params["hidden_size"] in (16, 32, 48, 64)
        assert 1e-4 <= train["lr"] <= 1e-2 and train["epochs"] in (2, 3)
        assert row.lookback in (14, 28)
    assert set(results[results["family"] == "linear"]["params"]) <= {"{}"}
    assert search_event(tmp_path / "work") == "search: 7 of 7 configurations proposed in 3 rounds"


def test_a_small_space_ends_the_search_when_every_configuration_is_proposed(tmp_path):
    models = "  mlp: {hidden_size: [16, 32]}\n"
    path = search_file(tmp_path, search="{sampler: random, trials: 10, batch: 3}", models=models, lookbacks="[14]")
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    results = read_results(tmp_path / "work")
    assert outcome.done == 2 and sorted(json.loads(p)["hidden_size"] for p in results["params"]) == [16, 32]
    assert search_event(tmp_path / "work") == "search: 2 of 10 configurations proposed in 1 rounds (the space holds no other)"


def test_tpe_learns_from_earlier_rounds(tmp_path):
    """Told the scores, TPE proposes near the best region: its later rounds' mean validation score beats its first."""
    models = "  mlp: {hidden_size: [32], lr: {low: 1.0e-5, high: 3.0e-2, log: true}, epochs: [4]}\n"
    path = search_file(tmp_path, search="{sampler: tpe, trials: 16, batch: 4, seed: 3}", models=models, lookbacks="[14]")
    Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    results = read_results(tmp_path / "work")  # in proposal order
    assert len(results) == 16
    first, last = results["val_mae"].iloc[:4].mean(), results["val_mae"].iloc[-4:].mean()
    assert last < first, (first, last)


def ids_in_order(workdir: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(workdir / "gpufill.db") as con:
        return con.execute("SELECT trial_id, status FROM trials WHERE current = 1 ORDER BY position").fetchall()


PRUNED_SEARCH = "{sampler: random, trials: 12, batch: 4, seed: 2, pruner: {kind: asha, min_epochs: 1, reduction_factor: 3}}"


def test_asha_prunes_trials_that_are_recorded_with_their_epoch_and_score_and_never_ranked(tmp_path, capsys):
    models = "  mlp: {hidden_size: [32], lr: {low: 1.0e-5, high: 1.0e-1, log: true}, epochs: [9]}\n"
    path = search_file(tmp_path, search=PRUNED_SEARCH, models=models, lookbacks="[14]")
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    results = read_results(tmp_path / "work")
    pruned = results[results["status"] == "pruned"]
    assert outcome.pruned == len(pruned) and outcome.done + outcome.pruned == 12
    assert 1 <= len(pruned) <= 8  # the first round has no earlier trials to lose to: 4 run to the end
    assert pruned["mae"].isna().all() and pruned["val_mae"].notna().all()  # a validation score, no test score
    store = Store.open(tmp_path / "work")
    try:
        for trial_id in pruned["trial_id"]:
            details = store.trial_details(trial_id)
            epoch = len(details["history"])
            assert 1 <= epoch < 9
            assert any(event.startswith(f"pruned at epoch {epoch}: ASHA stopped it: validation val_mae ") for event in details["events"])
            rungs = details["metrics"]["rungs"]  # scored at ASHA's rungs only: epochs 1, 3, 9
            assert epoch in (1, 3) and list(rungs) == [str(e) for e in (1, 3) if e <= epoch]
            assert details["metrics"]["pruned"] == {"epoch": epoch, "val_mae": rungs[str(epoch)]}
            assert details["metrics"]["val"]["mae"] <= rungs[str(epoch)] + 1e-9  # the best epoch's weights, restored
        assert store.forecasts(list(pruned["trial_id"])) == {}
    finally:
        store.close()
    first_round = results.iloc[:4]
    assert (first_round["status"] == "done").all()
    code, out, _ = run_cli(capsys, "results", "--workdir", tmp_path / "work", "--best", "--format", "json")
    best = json.loads(out)
    done = results[results["status"] == "done"]
    assert code == 0 and best[0]["config_id"] in set(done["config_id"]) and best[0]["config_id"] not in set(pruned["config_id"])
    assert best[0]["val_mae"] == pytest.approx(done["val_mae"].min())  # the best finished configuration, on validation
    code, out, _ = run_cli(capsys, "status", "--workdir", tmp_path / "work", "--json")
    assert json.loads(out)["pruned"] == len(pruned)
    code, out, _ = run_cli(capsys, "monitor", "--workdir", tmp_path / "work", "--once")
    assert code == 0 and f": {outcome.done}/12 done, {len(pruned)} pruned, 0 failed" in out
    from gpufill.report.html import write_report

    page = write_report(tmp_path / "work", tmp_path / "report.html").read_text()
    assert f"Scatter of 12 trials&#x27; validation mae against cumulative training seconds, {len(pruned)} pruned" in page
    assert f"trials pruned (a search's pruner stopped them; never ranked)</td><td>{len(pruned)}" in page


@pytest.mark.slow
def test_a_pruned_search_killed_three_times_resumes_with_the_same_proposals_and_decisions_and_loses_nothing(tmp_path, capsys):
    # 10 epochs (ASHA's rungs at 2, 4 and 8): under the 100 optimizer steps that make a trial time its settings first, so
    # each run's fresh worker trains at once, with the same settings whatever the load (30 epochs timed them: ~2x slower).
    models = "  mlp: {hidden_size: {low: 16, high: 64, step: 16}, lr: {low: 1.0e-5, high: 1.0e-1, log: true}, epochs: [10]}\n  linear: {}\n"
    search = "{sampler: tpe, trials: 9, batch: 3, seed: 5, pruner: {kind: asha, min_epochs: 2, reduction_factor: 2}}"
    (tmp_path / "a").mkdir()
    whole = search_file(tmp_path / "a", search=search, models=models)
    Campaign.from_yaml(whole, tmp_path / "a" / "work").run(cpu_slots=1, executor="inline")  # the uninterrupted reference (inline: a local worker's metrics)
    expected = ids_in_order(tmp_path / "a" / "work")
    assert len(expected) == 9 and {status for _, status in expected} <= {"done", "pruned"}

    (tmp_path / "b").mkdir()
    path = search_file(tmp_path / "b", search=search, models=models)
    workdir = tmp_path / "b" / "work"
    args = ["run", str(path), "--workdir", str(workdir), "--cpu-slots", "1"]
    command = [sys.executable, "-m", "gpufill.cli", *args]
    done_before: dict[str, tuple[float, int]] = {}
    for kill_after in (2, 4, 7):  # kill -9 at three points (rounds one, two and three), then the resume
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 240  # sized for a loaded box
        done: dict[str, tuple[float, int]] = {}
        while time.monotonic() < deadline and len(done) < kill_after and process.poll() is None:
            time.sleep(0.01)  # read, then kill at once: trials of 10 epochs finish within tens of ms of each other
            if (workdir / "gpufill.db").exists():
                try:
                    with sqlite3.connect(f"file:{workdir / 'gpufill.db'}?mode=ro", uri=True) as con:
                        done = {tid: (mae, attempts) for tid, mae, attempts in con.execute(
                            "SELECT trial_id, mae, attempts FROM trials WHERE status IN ('done', 'pruned')")}
                except sqlite3.OperationalError:
                    pass
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=240)
        done_before.update(done)
    # The resume that finishes it needs no process of its own (nothing kills it): here, inline, as the reference ran.
    code, _out, err = run_cli(capsys, *args, "--executor", "inline")
    assert code == 0, err
    assert ids_in_order(workdir) == expected  # the same proposals, in the same order, pruned alike
    results = read_results(workdir)
    assert len(results) == 9 and results["trial_id"].is_unique
    after = {tid: (mae, attempts) for tid, mae, attempts in zip(results["trial_id"], results["mae"], results["attempts"])}
    def same(now: tuple, seen: tuple) -> bool:  # a pruned trial has no test mae: None in SQLite, NaN in the frame
        return now[1] == seen[1] and (now[0] == seen[0] or (seen[0] is None and now[0] != now[0]))

    assert len(done_before) >= 5 and all(same(after[tid], seen) for tid, seen in done_before.items())  # finished results unchanged, never trained again


def test_the_example_search_file_loads_with_its_space():
    spec = load_campaign(Path(__file__).resolve().parents[3] / "examples" / "search.yaml")
    assert (spec.search.sampler, spec.search.trials, spec.search.batch, spec.search.pruner.kind, spec.search_metric) == ("tpe", 24, 6, "asha", "val_smape")
    assert spec.models["mlp"]["hidden_size"] == Range(low=32, high=256, step=32, integer=True)
    assert spec.models["mlp"]["scaling"] == ["last", "standard"] and spec.models["lgbm"]["n_estimators"].integer


def test_results_rank_by_the_campaigns_task_metric_as_its_search_does(tmp_path, capsys):
    models = "  mlp: {hidden_size: [16, 64], lr: [1.0e-3, 3.0e-2]}\n"
    path = search_file(tmp_path, search="{sampler: grid, trials: 4, batch: 4}", models=models, lookbacks="[14]")
    path.write_text(path.read_text().replace("mode: global", "mode: global, metric: smape"))
    Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    results = read_results(tmp_path / "work")
    assert len(results) == 4 and (results["status"] == "done").all()
    code, out, _ = run_cli(capsys, "results", "--workdir", tmp_path / "work", "--best", "--format", "json")
    (best,) = json.loads(out)
    assert code == 0 and "smape" in best and "val_smape" in best and "val_mae" not in best
    assert best["val_smape"] == pytest.approx(results["val_smape"].min()) and best["chosen_on"] == "val"
    code, out, _ = run_cli(capsys, "results", "--workdir", tmp_path / "work", "--summary")
    header = next(line for line in out.splitlines() if line.startswith("project"))
    assert code == 0 and header.split()[:5] == ["project", "family", "params", "lb", "smape"] and "val smape" in header


def test_a_pruned_local_search_prunes_inside_fused_packs(tmp_path):
    """Local mode: a configuration's trials (one per project) train as one fused pack, and the pruner stops a member
    there while the rest of the pack goes on (masked, or re-formed without it where that measures faster)."""
    path = tmp_path / "local.yaml"
    path.write_text("name: local\n"
                    "data: {source: synthetic, projects: 4, length: 300, seed: 0}\n"
                    "task: {lookback: [14], horizon: 7, split: {val: 14, test: 14}, mode: local}\n"
                    "search: {sampler: random, trials: 8, batch: 4, seed: 1, pruner: {kind: asha, min_epochs: 1, reduction_factor: 3}}\n"
                    "models:\n  mlp: {hidden_size: [32], lr: {low: 1.0e-5, high: 1.0e-1, log: true}}\n"
                    "train: {epochs: 9, early_stopping: null}\n"
                    "resources: {pack_size: 4, retries: 0}\n")
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    results = read_results(tmp_path / "work")
    assert len(results) == 32 and outcome.done + outcome.pruned == 32 and outcome.pruned >= 1
    store = Store.open(tmp_path / "work")
    try:
        pruned = [store.trial_details(t) for t in results[results["status"] == "pruned"]["trial_id"]]
    finally:
        store.close()
    for details in pruned:
        assert details["timings"]["pack_size"] > 1  # stopped inside a fused pack
        assert any(e.startswith("pruned at epoch ") and e.endswith("masked, the rest of the pack went on") for e in details["events"])
        assert details["metrics"]["pruned"]["epoch"] in (1, 3)
    # Where members of a pack were pruned and others trained on, what the pack did next is recorded in every member's
    # events: re-formed from its survivors or kept masked, with the measured epochs where it measured.
    decisions = [e for details in pruned for e in details["events"] if e.startswith(("pack re-formed after epoch", "pack kept its 4 slots after epoch"))]
    assert decisions and all(" of the pack's 4 members still training" in e for e in decisions), decisions
    assert (results.iloc[:16]["status"] == "done").all()  # the first round has no earlier trials to lose to


@pytest.mark.slow
def test_estimate_times_a_search_from_its_first_round_scaled_to_its_budget(tmp_path):
    from gpufill.campaign.run.estimate import estimate

    path = search_file(tmp_path, search="{sampler: random, trials: 12, batch: 3, seed: 4}")
    path.write_text(path.read_text().replace("seeds: [0]", "seeds: [0, 1]"))
    found = estimate(Campaign.from_yaml(path, tmp_path / "work"))
    assert sum(shape.trials for shape in found.shapes) == 24  # 12 configurations x 2 seeds, from 3 sampled
    assert all("a search: its first round's configurations, x4 for its 12" in shape.how for shape in found.shapes)
    assert not (tmp_path / "work").exists()  # an estimate writes nothing


def test_the_median_rule_prunes_from_min_epochs_on(tmp_path):
    models = "  mlp: {hidden_size: [32], lr: {low: 1.0e-5, high: 1.0e-1, log: true}, epochs: [6]}\n"
    search = "{sampler: random, trials: 8, batch: 4, seed: 2, pruner: {kind: median, min_epochs: 2}}"
    path = search_file(tmp_path, search=search, models=models, lookbacks="[14]")
    outcome = Campaign.from_yaml(path, tmp_path / "work").run(executor="inline")
    results = read_results(tmp_path / "work")
    assert outcome.done + outcome.pruned == 8 and outcome.pruned >= 1 and (results.iloc[:4]["status"] == "done").all()
    store = Store.open(tmp_path / "work")
    try:
        for trial_id in results[results["status"] == "pruned"]["trial_id"]:
            details = store.trial_details(trial_id)
            epoch = details["metrics"]["pruned"]["epoch"]
            assert 2 <= epoch < 6 and list(details["metrics"]["rungs"]) == [str(e) for e in range(2, epoch + 1)]
            assert any(e.startswith(f"pruned at epoch {epoch}: the median rule stopped it") for e in details["events"])
    finally:
        store.close()


def test_gpufill_run_refuses_a_bad_search_in_one_line_with_exit_2_and_writes_nothing(tmp_path, capsys):
    path = search_file(tmp_path, models="  mlp: {hidden_size: {low: 64, high: 16}}\n")
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"gpufill: error: {path}:6: models.mlp.hidden_size: range low 64 is not below high 16")
    assert not (tmp_path / "work").exists()


def test_the_report_draws_a_search_beside_its_full_grid_and_says_what_it_saved(tmp_path, capsys):
    """`gpufill report --grid`: the search's course beside the grid's, and one line comparing their best finished
    validation scores and training seconds, computed from both stores."""
    models = "  mlp: {hidden_size: [16, 32], lr: [1.0e-4, 1.0e-3, 1.0e-2], epochs: [6]}\n"
    search = "{sampler: random, trials: 4, batch: 2, seed: 3, pruner: {kind: asha, min_epochs: 1, reduction_factor: 3}}"
    searched = search_file(tmp_path, search=search, models=models, lookbacks="[14]")
    grid = tmp_path / "grid.yaml"
    grid.write_text("\n".join(line for line in searched.read_text().splitlines() if not line.startswith("search:")).replace("name: search", "name: grid"))
    Campaign.from_yaml(searched, tmp_path / "search").run(executor="inline")
    Campaign.from_yaml(grid, tmp_path / "grid").run(executor="inline")
    code, _, err = run_cli(capsys, "report", "--workdir", tmp_path / "search", "--grid", tmp_path / "grid", "--out", tmp_path / "r.html")
    assert code == 0, err
    page = (tmp_path / "r.html").read_text()
    found, full = read_results(tmp_path / "search"), read_results(tmp_path / "grid")
    assert len(full) == 6 and (full["status"] == "done").all() and len(found) == 4
    score, grid_score = found[found["status"] == "done"]["val_mae"].min(), full["val_mae"].min()
    seconds, grid_seconds = found["duration_s"].sum(), full["duration_s"].sum()
    assert (f"the search's {score:.4g} ({score / grid_score:.3f}x the full grid's {grid_score:.4g}) with {seconds:.4g} training "
            f"seconds, {100 * seconds / grid_seconds:.1f} % of the grid's {grid_seconds:.4g}.") in page
    assert "beside the full grid&#x27;s best so far over 6 trials" in page  # the plot's text alternative
    for workdir, other, words in [(tmp_path / "grid", tmp_path / "grid", "is not a search"), (tmp_path / "search", tmp_path / "search", "is a search, not a full grid"),
                                  (tmp_path / "search", tmp_path / "missing", "no campaign store")]:
        code, out, err = run_cli(capsys, "report", "--workdir", workdir, "--grid", other, "--out", tmp_path / "x.html")
        assert code == 2 and "--grid" in err and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.html").exists()
