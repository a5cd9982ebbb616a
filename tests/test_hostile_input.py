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
from tests.helpers import run_cli

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
    done = gpufill("run", base / "hostile.yaml", "--workdir", base / "work")
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return base / "work"


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
    from gpufill.monitor import live

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


def test_an_error_line_quoting_a_name_shows_its_escapes(tmp_path):
    """An InputError quoting the user's text (here an unknown project) is one line with the escapes visible."""
    path = tmp_path / "c.yaml"
    path.write_text('name: c\ndata: {source: synthetic, projects: ["\\e]0;pwned\\a", "p000"], length: 300}\nmodels: {linear: {}}\n')
    done = gpufill("run", path, "--workdir", tmp_path / "work")
    assert done.returncode == 2
    err = done.stderr.decode()
    assert b"\x1b" not in done.stderr and b"\x07" not in done.stderr and err.count("\n") == 1
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
    from gpufill.campaign.export import csv_safe

    frame = pd.DataFrame({"project": [CLEAR, "=1+1", "\tx", "ok"], "mae": [-1.0, 2.0, 3.0, 4.0]})
    assert list(csv_safe(frame)["project"]) == [CLEAR, "'=1+1", "'\tx", "ok"]
    assert list(csv_safe(frame, terminal=True)["project"]) == ["\\x1b[2Jclear", "'=1+1", "\\x09x", "ok"]
    assert list(csv_safe(frame)["mae"]) == [-1.0, 2.0, 3.0, 4.0]  # a negative number is a number, not a formula
    assert list(frame["project"]) == [CLEAR, "=1+1", "\tx", "ok"]  # the caller's frame is not changed


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
