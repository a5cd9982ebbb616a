"""Files the user gives gpufill to read (issue 37, items 11 and 12).

A FIFO as the campaign file or as a data file is refused at once (no writer would ever come: the old open waited
forever), and a campaign nested deeper than the YAML reader can follow is one line, not a RecursionError. Those
that could wait forever (a FIFO, an endless device) run in a fresh process with a timeout, so a regression fails the
test instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufill.campaign.spec.spec import load_campaign
from gpufill.errors import InputError
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[3]
PIPE_FIX = "a pipe (FIFO) or socket, not a regular file: reading it would wait for a writer; fix: pass a regular file as the {field} " \
           "(save what the pipe carries to a file first)"
DEEP = "nesting too deep: values nested more levels deep than the YAML reader can follow; " \
       "fix: flatten the file: a campaign nests a few levels (models: family: parameter: [values])"


def gpufill(*args: object, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real command in a fresh process; a hang is a TimeoutExpired (a failure), never a stuck suite."""
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
    return subprocess.run([sys.executable, "-m", "gpufill", *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


@pytest.mark.parametrize("command", ["run", "estimate"])
@pytest.mark.slow
def test_a_fifo_as_the_campaign_file_is_refused_at_once(tmp_path, command):
    os.mkfifo(tmp_path / "c.yaml")  # nobody writes it: a blocking open waits forever
    done = gpufill(command, "c.yaml", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr == f"gpufill: error: c.yaml: campaign file: {PIPE_FIX.format(field='campaign file')}\n"
    assert sorted(os.listdir(tmp_path)) == ["c.yaml"]  # no workdir made


@pytest.mark.slow
def test_a_fifo_as_the_data_file_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "data.csv")
    (tmp_path / "c.yaml").write_text("name: c\ndata: {source: data.csv}\nmodels: {linear: {}}\n")
    done = gpufill("estimate", "c.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == "gpufill: error: data.csv: source: not a regular file (a device, pipe or socket); fix: give source the name of a regular file\n"


@pytest.mark.slow
def test_a_device_as_the_campaign_file_is_still_read_up_to_the_cap(tmp_path):
    """The pipe check opens non-blocking; /dev/zero (endless, never blocking) still meets the size cap."""
    done = gpufill("estimate", "/dev/zero", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("gpufill: error: /dev/zero: the file is larger than the 4 MiB a campaign file may be;")


@pytest.mark.parametrize(("opening", "closing"), [("[", "]"), ("{a: ", "}")])
@pytest.mark.parametrize("levels", [1_000, 50_000])
def test_a_campaign_nested_too_deep_is_one_line(tmp_path, opening, closing, levels):
    path = tmp_path / "deep.yaml"
    path.write_text(f"name: deep\nmodels:\n  linear: {{a: {opening * levels}1{closing * levels}}}\n")
    with pytest.raises(InputError) as caught:
        load_campaign(path)
    assert caught.value.one_line() == f"{path}: {DEEP}"


def test_how_deep_a_campaign_may_nest_does_not_depend_on_the_recursion_limit(tmp_path):
    """Some imports raise Python's recursion limit (1,000 levels loaded after one did, and the suite's order decided
    which test saw it); the limit is counted on the tokens: 101 levels are refused at any recursion limit, 100 load
    as far as the spec's own check."""
    path = tmp_path / "deep.yaml"
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        path.write_text("name: deep\nmodels:\n  linear: {a: " + "[" * 98 + "1" + "]" * 98 + "}\n")  # 3 + 98 levels
        with pytest.raises(InputError) as caught:
            load_campaign(path)
        assert caught.value.one_line() == f"{path}: {DEEP}"
        path.write_text("name: deep\nmodels:\n  linear: {a: " + "[" * 97 + "1" + "]" * 97 + "}\n")  # 100 levels: read, then checked
        with pytest.raises(InputError, match=r"unknown parameter 'a' for model family 'linear'"):
            load_campaign(path)
    finally:
        sys.setrecursionlimit(before)


def test_a_campaign_nested_too_deep_exits_2_on_the_command_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "deep.yaml").write_text("name: deep\nmodels: {linear: {}}\nseeds: " + "[" * 50_000 + "]" * 50_000 + "\n")
    monkeypatch.chdir(tmp_path)  # in this process: a deep file is refused, it cannot hang (the FIFOs above can)
    code, _out, err = run_cli(capsys, "run", "deep.yaml")
    assert code == 2 and err == f"gpufill: error: deep.yaml: {DEEP}\n"


def test_a_campaign_nested_a_few_levels_still_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("name: ok\nmodels:\n  linear: {}\nseeds: [0, 1]\n")
    assert load_campaign(path).seeds == [0, 1]
