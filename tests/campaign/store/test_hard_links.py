"""A hard link where gpufill writes in place (issue 37, item 8).

A file with a second name outside the workdir (`ln ~/notes.txt WORKDIR/logs/run-1.log`) would receive what gpufill
appends, and the lock's truncation would empty it. Every in-place writer (run log, workdir lock, checkpoint lock,
appended timelines, the SQLite store and its -wal/-shm) refuses such a file in one line; the outside file stays
byte-identical. Writers that replace by rename (exports, report.html) leave the other name's file alone too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufill import files
from gpufill.campaign.store.lock import WorkdirLock
from gpufill.campaign.store.store import Store
from gpufill.campaign.store.workdir import open_run_log
from gpufill.engine.checkpoint import LOCK_NAME
from gpufill.engine.loop import fit
from gpufill.errors import InputError
from tests.engine.equivalence import data, dict_loss, make_model
from tests.helpers import run_cli, write_campaign

PRECIOUS = b"a file of the user's, outside the workdir\n"
SHARED = ("the file there has 2 names (hard links); gpufill does not write into a file that other names share "
          "(the file and its other names are left as they were); fix: remove that name (the file stays under its other names), "
          "or pass another {field}")
FIT = dict(loss=dict_loss, epochs=2, batch_size=16, lr=0.01, seed=11, optimizer_kernel="for-loop")


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(PRECIOUS)
    return path


def hard_link(at: Path, to: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    os.link(to, at)
    assert os.stat(at).st_nlink >= 2
    return at


def refusal(at: Path, field: str) -> str:
    return f"{at}: {field}: {SHARED.format(field=field)}"


# -- the writers themselves: the check is on the opened descriptor ----------------------------------------------
def test_the_workdir_lock_refuses_a_hard_link_and_does_not_truncate_it(tmp_path):
    target = victim(tmp_path)
    at = hard_link(tmp_path / "work" / "gpufill.lock", target)
    with pytest.raises(InputError) as caught:
        WorkdirLock(tmp_path / "work").acquire()
    assert caught.value.one_line() == refusal(at, "--workdir")
    assert target.read_bytes() == PRECIOUS and os.stat(target).st_nlink == 2  # not emptied, and the link left in place


def test_the_run_log_refuses_a_hard_link_when_it_opens_it(tmp_path):
    target = victim(tmp_path)
    at = hard_link(tmp_path / "work" / "logs" / "run-3.log", target)
    with pytest.raises(InputError) as caught:
        open_run_log(tmp_path / "work", 3, encoding="utf-8")
    assert caught.value.one_line() == refusal(at, "--workdir")
    assert target.read_bytes() == PRECIOUS


@pytest.mark.parametrize("opener", ["open_append", "append_whole", "open_lock"])
def test_every_in_place_opener_refuses_a_hard_link(tmp_path, opener):
    target = victim(tmp_path)
    at = hard_link(tmp_path / "samples.jsonl", target)
    with pytest.raises(InputError) as caught:
        if opener == "append_whole":
            files.append_whole(at, "{}\n", field="--out")
        else:
            getattr(files, opener)(at, field="--out")
    assert caught.value.one_line() == refusal(at, "--out")
    assert target.read_bytes() == PRECIOUS
    assert files.open_existing(at, field="--out") is not None  # reading a shared file is fine: nothing is written


def test_the_checkpoint_lock_refuses_a_hard_link_before_the_first_epoch(tmp_path):
    target = victim(tmp_path)
    at = hard_link(tmp_path / "ck" / LOCK_NAME, target)
    with pytest.raises(InputError) as caught:
        fit(make_model(), data(), checkpoint_dir=tmp_path / "ck", **FIT)
    assert caught.value.one_line() == refusal(at, "checkpoint_dir")
    assert target.read_bytes() == PRECIOUS


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_the_store_refuses_a_hard_link_at_any_of_its_files(tmp_path, suffix):
    target = victim(tmp_path)
    at = hard_link(tmp_path / "work" / f"gpufill.db{suffix}", target)
    with pytest.raises(InputError) as caught:
        Store.create(tmp_path / "work")
    assert caught.value.one_line() == refusal(at, "--workdir")
    assert target.read_bytes() == PRECIOUS


def test_a_reader_of_the_store_refuses_a_hard_link_at_the_files_sqlite_writes_in_place(tmp_path):
    Store.create(tmp_path / "work").close()
    target = victim(tmp_path)
    at = hard_link(tmp_path / "work" / "gpufill.db-shm", target)
    with pytest.raises(InputError) as caught:
        Store.open(tmp_path / "work")
    assert caught.value.one_line() == refusal(at, "--workdir")
    assert target.read_bytes() == PRECIOUS


# -- the command line: exit 2, one line, before anything is written ---------------------------------------------
@pytest.mark.parametrize("name", ["gpufill.lock", "logs/run-1.log", "gpufill.db", "gpufill.db-wal"])
def test_a_run_refuses_a_hard_link_in_its_workdir_and_the_outside_file_is_untouched(tmp_path, capsys, name):
    path = write_campaign(tmp_path, models="linear: {}")
    target = victim(tmp_path)
    work = tmp_path / "work"
    at = hard_link(work / name, target)
    code, _, err = run_cli(capsys, "run", path, "--workdir", work)
    assert code == 2 and err == f"gpufill: error: {refusal(at, '--workdir')}\n"
    assert target.read_bytes() == PRECIOUS and os.stat(target).st_nlink == 2
    assert not (work / "gpufill.db").exists() or name == "gpufill.db"  # refused before the store was created


def test_exports_replace_a_hard_linked_name_and_never_write_into_the_shared_file(tmp_path, capsys):
    """results --out and report write a new file and rename it over the name: the other name keeps the old bytes."""
    path = write_campaign(tmp_path, models="linear: {}")
    work = tmp_path / "work"
    code, _, err = run_cli(capsys, "run", path, "--workdir", work, "--executor", "inline")
    assert code == 0, err
    target = victim(tmp_path)
    out = hard_link(tmp_path / "results.csv", target)
    report = hard_link(work / "report.html", target)
    assert run_cli(capsys, "results", "--workdir", work, "--format", "csv", "--out", out)[0] == 0
    assert run_cli(capsys, "report", "--workdir", work)[0] == 0
    assert out.read_bytes().count(b"\r\n") == 3  # a header and the two trials
    assert report.read_text().startswith("<!DOCTYPE html>")
    assert target.read_bytes() == PRECIOUS and os.stat(target).st_nlink == 1  # both names now hold gpufill's own files
