"""Hostile input (issue 26, classes 5, 7 and 8): data that would reach a terminal or a spreadsheet as code, files
and sizes that would hang gpufill or eat the machine's memory, and inputs that used to end in a traceback.

Every refusal is one line (exit 2 from the command line, an InputError from Python) naming the field and the fix."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpufill.errors import InputError, visible
from tests.helpers import run_cli, run_cli_captured

ROOT = Path(__file__).resolve().parents[1]

# -- class 5: data reaching a terminal or a spreadsheet as code ------------------------------------------------

TITLE = "\x1b]0;pwned\x07title"  # sets the terminal window's title
CLEAR = "\x1b[2Jclear"  # clears the screen
FORMULAS = ('=HYPERLINK("http://x")', "+SUM(1)", "-2+3", "@cmd", "\tTAB", "\rCR")
DOLLARS = "$a^$ $\\frac{"  # mathtext that does not parse
NAMES = (TITLE, CLEAR, *FORMULAS, DOLLARS, "plain")
TAGS = ("$x$", "$\\frac{$", "plain")  # grid values of a user family's text parameter


def gpufill(*args: object, timeout: float = 600) -> subprocess.CompletedProcess[bytes]:
    """The real command in a fresh process, its output as bytes (what a terminal would receive)."""
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
    return subprocess.run([sys.executable, "-m", "gpufill.cli", *map(str, args)], capture_output=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A finished campaign whose project names hold terminal escapes, spreadsheet formulas and `$`, and whose
    user family has a text grid parameter with `$` (40 trials: 10 projects x (linear + 3 tags))."""
    base = tmp_path_factory.mktemp("hostile")
    t = np.arange(80)
    pd.concat([pd.DataFrame({"project": name, "t": t, "target": np.sin(t / 5 + i) + 0.1 * i}) for i, name in enumerate(NAMES)]).to_parquet(
        base / "data.parquet", index=False)  # parquet keeps every character (a CSV reader drops a leading CR)
    (base / "hostile.yaml").write_text(
        "name: hostile\ndata: {source: data.parquet, time_column: t}\ntask: {lookback: [8], horizon: 1}\nmodels:\n  linear: {}\n"
        f"  tests.campaign_models:tagged: {{tag: {json.dumps(list(TAGS))}}}\ntrain: {{epochs: 1, early_stopping: null}}\nseeds: [0]\n")
    code, _out, err = run_cli_captured("run", base / "hostile.yaml", "--workdir", base / "work", "--executor", "inline")  # inline: the tests read what the run stored
    assert code == 0, err[-3000:]
    return base / "work"


@pytest.mark.slow
def test_escape_sequences_in_names_are_printed_as_visible_text(hostile):
    """`results` (table and summary), `status` and `monitor --once` never send a raw control character to the terminal."""
    for command in (["results"], ["results", "--summary"], ["status"], ["monitor", "--once"]):
        done = gpufill(*command, "--workdir", hostile)
        assert done.returncode == 0, done.stderr
        for byte in (b"\x1b", b"\x07", b"\r", b"\t"):
            assert byte not in done.stdout and byte not in done.stderr, (command, byte)
    table = gpufill("results", "--workdir", hostile).stdout.decode()
    assert table.count("\\x1b]0;pwned\\x07title") == 4 and table.count("\\x1b[2Jclear") == 4  # each project's 4 trials
    assert "\\x09TAB" in table and "\\x0dCR" in table
    status = gpufill("status", "--workdir", hostile).stdout.decode()
    assert "40" in status and "cpu" in status


def test_the_live_views_show_running_names_as_visible_text():
    """`monitor` and `run`'s live table list the running trials: their names reach the terminal as escapes."""
    import io

    from rich.console import Console

    from gpufill.cli.campaign_tables import campaign_view
    from gpufill.cli import live

    trial = {"family": "linear", "project": TITLE, "worker": CLEAR, "seconds": 3.0}
    counts = {"done": 0, "total": 1, "failed": 0, "lanes": {"cpu": dict.fromkeys(("total", "done", "failed", "running", "pending", "skipped"), 0)}}
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    console.print(live.render({"campaign": "c", "counts": counts, "eta_s": None, "trials_per_min": 0.0, "series": {}, "running": [trial],
                               "alerts": [f"{CLEAR} stalled"]}))

    class Snapshot:
        elapsed_s, trials_per_min, lanes, running = 1.0, 0.0, {}, [trial]

    console.print(campaign_view(Snapshot(), title="c"))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert text.count("\\x1b]0;pwned\\x07title") == 2 and text.count("\\x1b[2Jclear") == 2


def test_an_error_line_quoting_a_name_shows_its_escapes(tmp_path, capsys):
    """An InputError quoting the user's text (here an unknown project) is one line with the escapes visible."""
    path = tmp_path / "c.yaml"
    path.write_text('name: c\ndata: {source: synthetic, projects: ["\\e]0;pwned\\a", "p000"], length: 300}\nmodels: {linear: {}}\n')
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2
    stderr = err.encode()  # the bytes a terminal would receive
    assert b"\x1b" not in stderr and b"\x07" not in stderr and err.count("\n") == 1
    assert "unknown project(s) '\\x1b]0;pwned\\x07'" in err
    assert visible("a\x1b[2Jb\u202ec\x9bd\x7f") == "a\\x1b[2Jb\\u202ec\\x9bd\\x7f" and visible("p000 ok") == "p000 ok"


def test_csv_cells_that_start_a_formula_are_neutralised_and_other_formats_keep_values(hostile, tmp_path, capsys):
    """OWASP: a text cell starting with = + - @ tab or CR gets a leading single quote, in CSV only."""
    shown = {"=HYPERLINK(\"http://x\")": "'=HYPERLINK(\"http://x\")", "+SUM(1)": "'+SUM(1)", "-2+3": "'-2+3", "@cmd": "'@cmd",
             "\tTAB": "'\tTAB", "\rCR": "'\rCR", TITLE: TITLE, CLEAR: CLEAR, DOLLARS: DOLLARS, "plain": "plain"}
    for extra in ([], ["--summary"]):
        code, _out, err = run_cli(capsys, "results", "--workdir", hostile, "--format", "csv", "--out", tmp_path / "r.csv", *extra)
        assert code == 0, err
        with open(tmp_path / "r.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == (40 if not extra else 20)  # 10 projects x 4 trials; x (linear, tagged) best
        projects = {row["project"] for row in rows}
        assert projects == {shown[name] for name in NAMES}
        assert all(row["mae"] and float(row["mae"]) >= 0 for row in rows)  # numbers stay numbers (no quote before them)
    code, out, _ = run_cli(capsys, "results", "--workdir", hostile, "--format", "json")
    assert code == 0 and {row["project"] for row in json.loads(out)} == set(NAMES)
    code, _out, _ = run_cli(capsys, "results", "--workdir", hostile, "--format", "parquet", "--out", tmp_path / "r.parquet")
    assert code == 0 and set(pd.read_parquet(tmp_path / "r.parquet")["project"]) == set(NAMES)


def test_csv_to_a_terminal_shows_control_characters_as_escapes():
    from gpufill.campaign.results.export import csv_safe

    frame = pd.DataFrame({"project": [CLEAR, "=1+1", "\tx", "ok"], "mae": [-1.0, 2.0, 3.0, 4.0]})
    assert list(csv_safe(frame)["project"]) == [CLEAR, "'=1+1", "'\tx", "ok"]
    assert list(csv_safe(frame, terminal=True)["project"]) == ["\\x1b[2Jclear", "'=1+1", "\\x09x", "ok"]
    assert list(csv_safe(frame)["mae"]) == [-1.0, 2.0, 3.0, 4.0]  # a negative number is a number, not a formula
    assert list(frame["project"]) == [CLEAR, "=1+1", "\tx", "ok"]  # the caller's frame is not changed


@pytest.mark.slow
def test_dollars_in_names_and_grid_values_are_drawn_literally(hostile, capsys, monkeypatch):
    """The report builds, and every text matplotlib draws shows the user's `$` as a `$` (no mathtext)."""
    from gpufill.report import plots

    drawn: list[tuple[str, object]] = []
    render = plots._render

    def keep_texts(fig, alt):
        plot = render(fig, alt)  # drawn: every tick label exists now
        for text in fig.findobj(lambda artist: hasattr(artist, "get_text") and hasattr(artist, "_preprocess_math")):
            if text.get_text() and text.get_visible():
                drawn.append(text._preprocess_math(text.get_text()))
        return plot

    monkeypatch.setattr(plots, "_render", keep_texts)
    code, out, err = run_cli(capsys, "report", "--workdir", hostile)
    assert code == 0, err
    page = Path(out.strip()).read_text()
    assert page.count("<img class='plot'") >= 4
    shown = [text for text, math in drawn]
    assert [text for text, math in drawn if math and "\\mathdefault{" not in text] == []  # TeX only in matplotlib's own log-axis ticks
    assert "tagged: tag" in shown and set(TAGS) <= set(shown)  # the grid values' bars
    titles = [text for text in shown if ": best project " in text or ": worst project " in text]
    assert len(titles) == 4 and all(text.split(" project ", 1)[1] in {visible(name) for name in NAMES} for text in titles)
    drawn.clear()
    kept = {"origins": np.arange(5), "truth": np.ones((5, 1)), "forecast": np.zeros((5, 1))}
    assert plots.forecasts([("pkg.mod:$f$", "best", DOLLARS, kept), ("pkg.mod:$f$", "worst", TITLE, kept)]) is not None
    assert {"$f$: best project $a^$ $\\frac{", "$f$: worst project \\x1b]0;pwned\\x07title"} <= {text for text, _math in drawn}


# -- class 8: hangs and runaway memory ----------------------------------------------------------------------------


def test_thousands_of_tiny_projects_are_left_out_in_linear_time_with_one_summary_warning(tmp_path, capsys):
    """3,000 one-row projects beside one real one: one warning for all of them, the real project's trial runs."""
    import time

    t = np.arange(300)
    tiny = pd.DataFrame({"project": [f"t{i:05d}" for i in range(3000)], "t": 0, "target": 1.0})
    pd.concat([tiny, pd.DataFrame({"project": "real", "t": t, "target": np.sin(t / 5)})]).to_csv(tmp_path / "data.csv", index=False)
    path = tmp_path / "many.yaml"
    path.write_text("name: many\ndata: {source: data.csv, time_column: t}\ntask: {lookback: [8, 16]}\nmodels: {linear: {}}\n")
    started = time.monotonic()
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--executor", "inline")
    elapsed = time.monotonic() - started
    assert code == 0, err[-2000:]
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: 3,000 projects left out at one or more lookbacks (6,000 trials)")
    assert "done 2, failed 0" in out  # the real project, at both lookbacks
    assert elapsed < 300  # was quadratic: 20,000 such projects took 9 minutes (a loaded 2-core box takes ~30 s for this)


def test_left_out_notes_name_a_few_projects_each_and_summarise_many_in_linear_time():
    import time
    from collections import Counter

    from gpufill.campaign.run.runner import LEFT_OUT_LISTED, _left_out_notes

    few = {("a", 30): "too short", ("a", 60): "too short", ("b", 60): "shorter"}
    assert _left_out_notes(few, Counter({"a": 4, "b": 2})) == ["project a left out at lookback 30, 60 (4 trials): too short",
                                                               "project b left out at lookback 60 (2 trials): shorter"]
    many = {(f"p{i:06d}", lookback): "too short" for i in range(100_000) for lookback in (30, 60)}
    started = time.monotonic()
    notes = _left_out_notes(many, Counter({f"p{i:06d}": 2 for i in range(100_000)}))
    assert time.monotonic() - started < 10  # linear: the per-project scans over all pairs took minutes
    assert len(notes) == 1 and notes[0].startswith("100,000 projects left out at one or more lookbacks (200,000 trials), too short for them; "
                                                   f"the first {LEFT_OUT_LISTED}: project p000000 left out at lookback 30, 60 (2 trials)")


def test_a_campaign_file_is_read_with_a_size_cap(tmp_path, capsys):
    """/dev/zero (endless) and a 5 MiB file: one line naming the cap, read no further than it."""
    big = tmp_path / "big.yaml"
    big.write_text("name: big\nmodels: {linear: {}}\n# " + "x" * (5 * 1024 * 1024) + "\n")
    for path in ("/dev/zero", big):
        code, _out, err = run_cli(capsys, "estimate", path)
        assert code == 2 and err.count("\n") == 1, err[-2000:]
        assert err == f"gpufill: error: {path}: the file is larger than the 4 MiB a campaign file may be; fix: point to the campaign's .yaml file " \
                      "(a campaign is a few KB; list projects with a glob, not one by one)\n"


@pytest.mark.parametrize(("data", "message"), [
    ("projects: 100000000", "data.projects: 100,000,000 projects is more than the 100,000 gpufill allows; fix: use at most 100,000 projects"),
    ("projects: 1e8", "data.projects: '1e8' is text to YAML (a pattern no synthetic name matches), not a count; fix: write the count in digits, "
                      "at most 100,000"),
    ("projects: [p000, p99999999]", "data.projects: naming project p99999999 generates 100,000,000 projects, more than the 100,000 gpufill allows"),
    ("projects: 50000, length: 5000", "data.projects: 50,000 projects x length 5,000 = 250,000,000 time steps is more than the 100,000,000 "
                                      "gpufill generates; fix: lower data.projects or data.length"),
    ("length: 10000000000", "data.length: 10,000,000,000 is more than the 10,000,000 gpufill allows (time steps of a synthetic series)"),
    ("length: 1e10", "data.length: '1e10' is text to YAML, not a count; fix: write the count in digits (10000000000)"),
])
def test_absurd_sizes_are_refused_up_front_naming_the_limit(tmp_path, capsys, data, message):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: c\ndata: {{source: synthetic, {data}}}\nmodels: {{linear: {{}}}}\n")
    code, _out, err = run_cli(capsys, "estimate", path)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"gpufill: error: {path}:2: {message}")


@pytest.mark.slow
def test_a_campaign_of_more_trials_than_the_limit_is_refused_before_any_is_listed(tmp_path, capsys):
    """A grid of ten million points (refused before any point is built), and 2,000,100 trials of a data file's projects."""
    import time

    axis = "[" + ", ".join(map(str, range(1, 11))) + "]"
    path = tmp_path / "grid.yaml"
    path.write_text("name: grid\ndata: {source: synthetic, projects: 2, length: 300}\nmodels:\n  mlp: {"
                    + ", ".join(f"{key}: {axis}" for key in ("hidden_size", "num_layers", "lr", "epochs", "batch_size", "weight_decay", "dropout")) + "}\n")
    started = time.monotonic()
    code, _out, err = run_cli(capsys, "estimate", path)
    assert code == 2 and err == (f"gpufill: error: {path}:3: models: the grids hold 10,000,000 points, more than the 2,000,000 trials gpufill runs "
                                 "in one campaign; fix: use fewer values per grid axis, or split the campaign into several files\n")
    assert time.monotonic() - started < 60
    t = np.arange(40)
    pd.concat([pd.DataFrame({"project": f"p{i:03d}", "t": t, "target": np.sin(t + i)}) for i in range(100)]).to_csv(tmp_path / "d.csv", index=False)
    path = tmp_path / "seeds.yaml"
    path.write_text(f"name: seeds\ndata: {{source: d.csv, time_column: t}}\ntask: {{lookback: [4]}}\nmodels: {{linear: {{}}}}\n"
                    f"seeds: [{', '.join(map(str, range(20_001)))}]\n")
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and err == (f"gpufill: error: {path}:4: models: 1 grid points x 1 lookbacks x 20001 seeds x 100 projects = 2,000,100 trials, "
                                 "more than the 2,000,000 gpufill runs in one campaign; fix: use fewer values per grid axis, lookbacks, seeds or "
                                 "projects, or split the campaign into several files\n")
    assert not (tmp_path / "work").exists()


def test_gpu_slots_past_the_limit_are_refused_before_any_worker_starts():
    from gpufill.campaign.policy.lanes import MAX_REQUESTED_GPU_SLOTS, plan_lanes

    for slots in (MAX_REQUESTED_GPU_SLOTS + 1, 10**9):
        with pytest.raises(InputError) as caught:
            plan_lanes(kinds=("neural",), cores=8, gpu_memory_bytes=80 << 30, gpu_slots=slots, cpu_slots="auto", where="c.yaml")
        assert caught.value.field == "resources.gpu_slots" and f"at most {MAX_REQUESTED_GPU_SLOTS}" in caught.value.fix
    lanes, _ = plan_lanes(kinds=("neural",), cores=8, gpu_memory_bytes=80 << 30, gpu_slots=MAX_REQUESTED_GPU_SLOTS, cpu_slots="auto")
    assert lanes[0].slots == MAX_REQUESTED_GPU_SLOTS


STDIN_FACTORY = '''"""A model module that reads stdin when imported (a script turned module, a debugging input())."""
import sys

ANSWER = sys.stdin.read()  # blocks until end-of-file

from tests.campaign_models import _Linear


def make(n_features, lookback, horizon):
    return _Linear(n_features, lookback, horizon)
'''


@pytest.mark.slow
def test_a_factory_that_reads_stdin_at_import_does_not_stall_the_inspection(tmp_path):
    """The inspection child (and every worker) reads /dev/null: end-of-file at once, though gpufill's own stdin is an open pipe."""
    import time

    (tmp_path / "reads_stdin.py").write_text(STDIN_FACTORY)
    path = tmp_path / "c.yaml"
    path.write_text("name: c\ndata: {source: synthetic, projects: 1, length: 300}\ntask: {lookback: [8]}\nmodels:\n  reads_stdin:make: {}\n"
                    "train: {epochs: 1, early_stopping: null}\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}{os.pathsep}{ROOT / 'src'}"}
    with open(tmp_path / "out.txt", "wb") as out, open(tmp_path / "err.txt", "wb") as err:
        process = subprocess.Popen([sys.executable, "-m", "gpufill.cli", "run", str(path), "--workdir", str(tmp_path / "work")], stdin=subprocess.PIPE,
                                   stdout=out, stderr=err, cwd=ROOT, env=env)
        started = time.monotonic()
        try:
            code = process.wait(timeout=240)  # the child waited for INSPECT_TIMEOUT_S (300 s), then took the factory as broken
        finally:
            process.kill()
            process.wait()
            assert process.stdin is not None
            process.stdin.close()
    assert code == 0, (tmp_path / "err.txt").read_text()[-2000:]
    text = (tmp_path / "out.txt").read_text()
    assert "done 1, failed 0" in text and "crashed" not in text and time.monotonic() - started < 240


@pytest.mark.slow
def test_doctor_says_when_the_script_caught_its_stop_and_ran_on(tmp_path):
    """A bare `except:` around the step swallows the stop: the report says so, with the steps it measured and how it ended."""
    script = str(ROOT / "tests" / "user_scripts" / "swallows_stop.py")
    for extra, code in (([], 0), (["raise"], 1)):
        command = [sys.executable, "-m", "gpufill", "doctor", "--steps", "5", "--json", "--", sys.executable, script, "40", *extra]
        run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
        report = json.loads(run.stdout)
        assert run.returncode == code and report["exit_code"] == code and not report["stopped_by_doctor"], run.stderr[-2000:]
        caught = ("the script caught gpufill's stop (a bare `except:` or `except BaseException:` around its step) and ran on to 40 optimizer "
                  "steps; measured: 3 warm-up and 5 steps; ")
        ended = "it ran to its end" if not extra else "the script raised RuntimeError after 40 steps"
        assert report["stop_reason"] == caught + ended
        assert report["verdict"] is not None and report["training"]["optimizer"] == "SGD"  # the 5 measured steps are diagnosed


# -- class 7: one line instead of a traceback ------------------------------------------------------------------------


TORN_WRITER = '''import sys, time
from pathlib import Path

import torch

out = Path(sys.argv[1])
time.sleep(1.5)  # the sampler has written a few rows
with open(out / "samples.jsonl", "a") as handle:
    handle.write('{"ts": 1.0, "source": "ho')  # torn: a kill or a full disk mid-line
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
time.sleep(1.5)
sys.exit(3)
'''


@pytest.mark.slow
def test_a_torn_line_in_a_watch_recording_is_left_out_in_one_line(tmp_path):
    from gpufill.script.launch import read_samples

    script = tmp_path / "tears.py"
    script.write_text(TORN_WRITER)
    folder = tmp_path / "rec"
    done = gpufill("watch", "--out", folder, "--interval", "0.2", "--", sys.executable, script, folder, timeout=300)
    err = done.stderr.decode()
    assert done.returncode == 3, err[-3000:]  # the script's exit code passes through
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if "not whole JSON" in line]
    assert len(warnings) == 1 and warnings[0].startswith("gpufill watch: warning: samples.jsonl: 1 line(s) not whole JSON (torn by a full disk or a kill)")
    record = json.loads((folder / "watch.json").read_text())
    assert record["exit_code"] == 3 and (folder / "report.html").stat().st_size > 1000
    torn = tmp_path / "t.jsonl"
    torn.write_text('{"ts": 1, "source": "host"}\n{"ts": 2, "sou\n[1, 2]\n{"ts": 3, "source": "host"}\n')
    problems: list[str] = []
    assert [row["ts"] for row in read_samples(torn, problems)] == [1, 3]
    assert problems == ["t.jsonl: 2 line(s) not whole JSON (torn by a full disk or a kill) left out: line 2, 3"]


@pytest.fixture
def damaged_copy(hostile, tmp_path):
    import shutil

    shutil.copytree(hostile, tmp_path / "work")
    return tmp_path / "work"


def _corrupt(work: Path, sql: str, *args: object) -> str:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(work / "gpufill.db")) as db, db:
        trial_id = db.execute("SELECT trial_id FROM trials WHERE family = 'linear' ORDER BY position LIMIT 1").fetchone()[0]
        db.execute(sql, (*args, trial_id))
    return trial_id


def test_a_trial_row_with_unreadable_json_is_one_line_in_every_command_that_reads_it(damaged_copy, capsys):
    work = damaged_copy
    before = (work / "gpufill.db").read_bytes()
    trial_id = _corrupt(work, "UPDATE trials SET params = ? WHERE trial_id = ?", '{"alpha": ')
    for command in (["results"], ["results", "--summary"], ["results", "--format", "json"], ["report"], ["results", "--ensemble", "median"]):
        code, _out, err = run_cli(capsys, *command, "--workdir", work)
        assert code == 2 and err.count("\n") == 1, (command, err)
        assert err == (f"gpufill: error: {work / 'gpufill.db'}: trials.params: the params of trial_id {trial_id} holds data gpufill cannot read "
                       "(the store was edited or damaged); nothing was changed; fix: restore gpufill.db from a backup, or delete that row (sqlite3 "
                       f"{work / 'gpufill.db'} \"DELETE FROM trials WHERE trial_id = '{trial_id}'\") and run the campaign again: it computes it anew\n")
    code, _out, _err = run_cli(capsys, "status", "--workdir", work)  # counts only: it reads no JSON
    assert code == 0
    assert (work / "gpufill.db").read_bytes() != before  # (the corruption itself)


def test_a_plan_that_is_not_an_object_is_refused_and_nan_metrics_are_not(damaged_copy, capsys):
    work = damaged_copy
    _corrupt(work, "UPDATE trials SET metrics = ? WHERE trial_id = ?", '{"test": {"mae": NaN}}')  # older stores wrote NaN: readable
    code, out, err = run_cli(capsys, "report", "--workdir", work)
    assert code == 0, err
    trial_id = _corrupt(work, "UPDATE trials SET plan = ? WHERE trial_id = ?", "[1, 2]")
    code, _out, err = run_cli(capsys, "report", "--workdir", work)
    assert code == 2 and f"trials.plan: the plan of trial_id {trial_id} holds data gpufill cannot read" in err and err.count("\n") == 1


@pytest.mark.parametrize("column", [pd.Series([[1.0, 2.0]] * 60), pd.Series([{"x": 1}] * 60)], ids=["list", "struct"])
def test_a_parquet_column_of_lists_or_structs_is_one_line(tmp_path, capsys, column):
    t = np.arange(60)
    pd.DataFrame({"project": "a", "t": t, "target": np.sin(t), "nested": column}).to_parquet(tmp_path / "d.parquet")
    path = tmp_path / "c.yaml"
    path.write_text("name: c\ndata: {source: d.parquet, time_column: t}\ntask: {lookback: [4]}\nmodels: {linear: {}}\n")
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    kind = "list<element: double>" if isinstance(column[0], list) else "struct<x: int64>"
    assert code == 2 and err == (f"gpufill: error: {tmp_path / 'd.parquet'}: nested: column 'nested' holds {kind} values, not one number or name per "
                                 "row; fix: flatten 'nested' into one column per element (or drop it) and write the file again\n")
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(("line", "field", "value"), [
    ("seeds: [0, 4294967296]", "seeds", "4,294,967,296"),
    ("seeds: [99999999999999999999999]", "seeds", "99,999,999,999,999,999,999,999"),  # past SQLite's 64-bit integers
    ("data: {source: synthetic, seed: 18446744073709551616}", "data.seed", "18,446,744,073,709,551,616"),
])
def test_seeds_past_32_bits_are_refused_at_load(tmp_path, capsys, line, field, value):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: c\nmodels: {{linear: {{}}}}\n{line}\n")
    code, _out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work")
    assert code == 2 and err == (f"gpufill: error: {path}:3: {field}: {value} is more than the 4,294,967,295 gpufill allows (seeds are unsigned "
                                 "32-bit integers); fix: use at most 4,294,967,295\n")


def test_fit_refuses_meta_models_meta_tensors_and_arrays_that_are_not_numbers():
    import torch
    from torch import nn

    import gpufill

    xy = (torch.randn(16, 2), torch.randn(16, 1))
    cases = [
        (dict(model=nn.Linear(2, 1, device="meta"), train=xy), "model", "the model's parameter 'weight' is on the meta device"),
        (dict(model=nn.Linear(2, 1), train=(torch.randn(16, 2, device="meta"), xy[1])), "train", "a tensor on the meta device"),
        (dict(model=nn.Linear(2, 1), train=(np.array([[1.0, 2.0]] * 16, dtype=object), xy[1])), "train",
         "a numpy array of dtype object (Python objects) is not numbers"),
        (dict(model=nn.Linear(2, 1), train=xy, val={"x": xy[0], "y": np.array([["a"]] * 16)}), "val", "a numpy array of dtype <U1 (strings)"),
        (dict(model=nn.Linear(2, 1), train=xy, seed=2**64), "seed", "seed 18446744073709551616 does not fit in 64 bits"),
    ]
    for kwargs, field, problem in cases:
        with pytest.raises(InputError) as caught:
            gpufill.fit(epochs=1, **kwargs)
        assert caught.value.field == field and caught.value.problem.startswith(problem), caught.value
    with pytest.raises(InputError) as caught:
        gpufill.fit_many(lambda: nn.Linear(2, 1, device="meta"), xy, variants=[{"seed": 0}, {"seed": 1}], epochs=1)
    assert caught.value.field == "make_model" and "to_empty(device='cpu')" in caught.value.fix
    reversed_view = np.random.default_rng(0).standard_normal((16, 2))[::-1]  # negative strides: copied, not refused
    assert gpufill.fit(nn.Linear(2, 1), (reversed_view, np.ones((16, 1))), epochs=1).history
