"""Files gpufill writes (issue 26, classes 4, 6 and the output-path part of 7).

- class 4: a symbolic link where gpufill writes a file (the workdir's lock, store, run logs, tune folder, a
  report, an --out file, a checkpoint) is refused in one line with exit 2; the file it points at is
  byte-identical afterwards. Temporary files are new files with random names: a link at the old fixed
  `.tmp` names is never followed.
- class 6: `--fresh` deletes the store and its run logs only, never a folder or a file of the user's,
  and nothing at all (and asks nothing) where there is no store; a second SIGTERM/SIGHUP while `watch`
  writes its report does not lose it.
- class 7: every output path that cannot be written is one line with exit 2, checked before the work
  where it can be (a read-only --checkpoint-dir before the first epoch); a full disk during a checkpoint
  keeps the previous one; a full disk under `watch` still passes the script's exit code through.

Read-only and full disks are real where the machine allows it: a tmpfs mounted in a private mount namespace
(`unshare -rm`, no root needed where user namespaces are on); those tests skip elsewhere. Each class also has
variants that need no mount.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from gpufill import files
from gpufill.campaign.store.workdir import delete_run_files
from gpufill.engine.checkpoint import LOCK_NAME, held_directory
from gpufill.engine.loop import fit
from gpufill.engine.result import FitCallback
from gpufill.errors import InputError
from gpufill.script.launch import SignalForwarder
from tests.engine.equivalence import data, dict_loss, make_model
from tests.helpers import run_cli, run_cli_captured, write_campaign

GPUFILL = [sys.executable, "-m", "gpufill"]
SCRIPTS = Path(__file__).parent / "user_scripts"
PRECIOUS = b"a file of the user's, outside the workdir\n"
LINK = ("a symbolic link is there; gpufill does not write through links (the link and what it points at are left as they were); "
        "fix: remove the link, or pass a {field} without links in it")
FIT = dict(loss=dict_loss, epochs=3, batch_size=16, lr=0.01, seed=11, optimizer_kernel="for-loop")


def without_progress(err: str) -> str:
    """stderr without `gpufill train --json`'s progress (one JSON object a line, as the training goes)."""
    return "\n".join(line for line in err.splitlines() if not line.startswith("{"))


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("gpufill: error: ") and "; fix: " in lines[0], lines[0]
    return lines[0]


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(PRECIOUS)
    return path


def link(at: Path, to: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(to)
    return at


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """(campaign file, workdir) of a finished two-trial campaign; tests work on copies of the workdir."""
    base = tmp_path_factory.mktemp("finished")
    path = write_campaign(base, models="linear: {}", projects=2)
    code, _, err = run_cli_captured("run", path, "--workdir", base / "work", "--executor", "inline")  # inline: these tests read the workdir, not the workers
    assert code == 0, err
    return path, base / "work"


def copy_of(finished: tuple[Path, Path], tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(finished[1], work, symlinks=True)
    return work


def store_rows(work: Path) -> tuple[int, int]:
    """(runs, done trials) in the store."""
    with sqlite3.connect(f"file:{work / 'gpufill.db'}?mode=ro", uri=True) as db:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0], db.execute("SELECT count(*) FROM trials WHERE status = 'done'").fetchone()[0]


@functools.cache
def can_mount() -> bool:
    """A tmpfs can be mounted in a private mount namespace here (user namespaces on, or root)."""
    if shutil.which("unshare") is None:
        return False
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpufill-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k none {shlex.quote(str(probe))}"],
                              capture_output=True, timeout=240).returncode == 0
    finally:
        probe.rmdir()


needs_mount = pytest.mark.skipif("not can_mount()", reason="needs a private mount namespace (unshare -rm) for a real read-only or full disk")


def on_tmpfs(directory: Path, options: str, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the shell `script` where `directory` is a fresh tmpfs mounted with `options` (gone when the script ends)."""
    directory.mkdir(parents=True, exist_ok=True)
    command = f"mount -t tmpfs -o {options} none {shlex.quote(str(directory))} && {script}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, timeout=timeout)


def sh(*args: object) -> str:
    return " ".join(shlex.quote(str(arg)) for arg in args)


# -- class 4: links -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpufill.lock", "gpufill.db", "gpufill.db-wal", "logs/run-1.log", "tune"])
def test_a_link_where_a_new_run_writes_is_refused_and_what_it_points_at_is_untouched(tmp_path, capsys, name):
    path = write_campaign(tmp_path, models="linear: {}")
    target = victim(tmp_path)
    work = tmp_path / "work"
    at = link(work / name, target.parent if name == "tune" else target)
    code, out, err = run_cli(capsys, "run", path, "--workdir", work)
    assert code == 2 and one_line(err) == f"gpufill: error: {at}: --workdir: {LINK.format(field='--workdir')}"
    assert target.read_bytes() == PRECIOUS and os.listdir(target.parent) == ["victim.txt"]
    assert at.is_symlink() and sorted(os.listdir(work)) == sorted({"gpufill.lock", name.split("/")[0]})  # refused before anything was written


def test_a_link_at_the_next_run_log_is_refused_before_the_store_is_touched(tmp_path, capsys, finished):
    work = copy_of(finished, tmp_path)
    target = victim(tmp_path)
    before = store_rows(work)
    at = link(work / "logs" / "run-2.log", target)  # the name the next run's log gets
    code, _, err = run_cli(capsys, "run", finished[0], "--workdir", work)
    assert code == 2 and one_line(err) == f"gpufill: error: {at}: --workdir: {LINK.format(field='--workdir')}"
    assert target.read_bytes() == PRECIOUS and store_rows(work) == before == (1, 2)


@pytest.mark.parametrize("command", [
    ("report",),  # WORKDIR/report.html
    ("report", "--out", "{out}/page.html"),
    ("results", "--format", "csv", "--out", "{out}/results.csv"),
    ("results", "--format", "parquet", "--out", "{out}/results.parquet"),
])
def test_a_link_at_an_output_file_is_refused_and_what_it_points_at_is_untouched(tmp_path, capsys, finished, command):
    work = copy_of(finished, tmp_path)
    target = victim(tmp_path)
    args = [part.format(out=tmp_path) for part in command]
    at = Path(args[-1]) if "--out" in args else work / "report.html"
    link(at, target)
    code, out, err = run_cli(capsys, *args, "--workdir", work)
    assert code == 2 and one_line(err) == f"gpufill: error: {at}: --out: {LINK.format(field='--out')}"
    assert target.read_bytes() == PRECIOUS and at.is_symlink()


def test_temporary_files_are_new_files_a_link_at_the_old_tmp_names_is_never_followed(tmp_path, capsys, finished):
    work = copy_of(finished, tmp_path)
    target = victim(tmp_path)
    old_names = [link(work / "report.html.tmp", target), link(tmp_path / "results.csv.tmp", target)]
    names = lambda: sorted(name for name in os.listdir(work) if not name.startswith("gpufill.db"))  # noqa: E731 - SQLite's -wal/-shm come and go
    before = names()
    assert run_cli(capsys, "report", "--workdir", work)[0] == 0
    assert run_cli(capsys, "results", "--workdir", work, "--format", "csv", "--out", tmp_path / "results.csv")[0] == 0
    assert (work / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "results.csv").read_bytes().count(b"\r\n") == 3  # a header and the two trials
    assert target.read_bytes() == PRECIOUS and all(path.is_symlink() for path in old_names)
    assert names() == sorted([*before, "report.html"])  # no temporary file left
    # Checkpoints likewise: links at the names the old code wrote through (last.tmp, meta.json.tmp).
    folder = tmp_path / "ck"
    links = [link(folder / "last.tmp", target), link(folder / "meta.json.tmp", target)]
    result = fit(make_model(), data(), checkpoint_dir=folder, **FIT)
    assert result.metrics["epochs_run"] == 3 and target.read_bytes() == PRECIOUS and all(path.is_symlink() for path in links)
    assert sorted(os.listdir(folder)) == [LOCK_NAME, "last.pt", "last.tmp", "meta.json", "meta.json.tmp"]


class CountEpochs(FitCallback):
    def __init__(self) -> None:
        self.epochs = 0

    def on_epoch_end(self, record) -> None:
        self.epochs += 1


@pytest.mark.parametrize("name", ["last.pt", "meta.json", LOCK_NAME])
def test_a_link_in_the_checkpoint_dir_is_refused_before_the_first_epoch(tmp_path, name):
    target = victim(tmp_path)
    at = link(tmp_path / "ck" / name, target)
    counter = CountEpochs()
    with pytest.raises(InputError) as caught:
        fit(make_model(), data(), checkpoint_dir=tmp_path / "ck", callbacks=[counter], **FIT)
    assert caught.value.one_line() == f"{at}: checkpoint_dir: {LINK.format(field='checkpoint_dir')}"
    assert counter.epochs == 0 and target.read_bytes() == PRECIOUS and at.is_symlink()


def test_appended_files_are_never_opened_through_a_link_and_a_pipe_is_refused_at_once(tmp_path):
    target = victim(tmp_path)
    at = link(tmp_path / "steps.jsonl", target)
    with pytest.raises(InputError) as caught:
        files.append_whole(at, "{}\n", field="--out")
    assert caught.value.one_line() == f"{at}: --out: {LINK.format(field='--out')}"
    pipe = tmp_path / "samples.jsonl"
    os.mkfifo(pipe)  # nobody reads it: a blocking open would hang
    with pytest.raises(InputError) as caught:
        files.append_whole(pipe, "{}\n", field="--out")
    assert caught.value.one_line() == (f"{pipe}: --out: not a regular file (a device, pipe or socket); "
                                       "fix: give --out the name of a regular file")
    assert target.read_bytes() == PRECIOUS


@pytest.mark.slow
def test_watch_refuses_a_link_in_its_folder_before_the_command_runs(tmp_path):
    target = victim(tmp_path)
    out = tmp_path / "rec"
    link(out / "report.html", target)
    marker = tmp_path / "ran"
    run = subprocess.run([*GPUFILL, "watch", "--out", str(out), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--out" in one_line(run.stderr)
    assert not marker.exists() and target.read_bytes() == PRECIOUS and sorted(os.listdir(out)) == ["report.html"]


# -- class 6: --fresh deletes only what gpufill wrote; watch keeps its report through a second signal ----------------
def _user_files(work: Path) -> dict[str, bytes]:
    made = {"checkpoints/model.pt": b"weights", "checkpoints/sub/notes.txt": b"mine", "logs/notes.txt": b"my notes",
            "logs/run-1.log.keep": b"a copy I made", "notes.md": b"# results", "report.html": b"<html>my own page</html>"}
    for name, content in made.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(content)
    return made


def test_fresh_deletes_the_store_and_its_run_logs_and_nothing_of_the_users(tmp_path, capsys, finished):
    work = copy_of(finished, tmp_path)
    made = _user_files(work)
    with open(work / "logs" / "run-1.log", "a") as log:
        log.write("a line of the run --fresh starts over from\n")
    code, _, err = run_cli(capsys, "run", finished[0], "--workdir", work, "--fresh", "--yes", "--executor", "inline")
    assert code == 0, err
    assert {name: (work / name).read_bytes() for name in made} == made  # checkpoints/, notes, a report: untouched
    assert store_rows(work) == (1, 2)  # a new store: one run, both trials trained again
    assert "a line of the run --fresh starts over from" not in (work / "logs" / "run-1.log").read_text()
    assert sorted(os.listdir(work / "logs")) == ["notes.txt", "run-1.log", "run-1.log.keep"]


def test_fresh_without_a_store_deletes_nothing_and_asks_nothing(tmp_path, capsys):
    path = write_campaign(tmp_path, models="linear: {}")
    work = tmp_path / "work"
    work.mkdir()
    made = _user_files(work)
    (work / "logs" / "run-7.log").write_bytes(b"named like a run log, but there is no store: not gpufill's to delete")
    made["logs/run-7.log"] = (work / "logs" / "run-7.log").read_bytes()
    code, _, err = run_cli(capsys, "run", path, "--workdir", work, "--fresh", "--executor", "inline")  # no --yes, and stdin is not a terminal
    assert code == 0, err
    assert {name: (work / name).read_bytes() for name in made} == made and store_rows(work) == (1, 2)


def test_what_fresh_deletes_is_regular_files_of_the_stores_names(tmp_path):
    (tmp_path / "gpufill.db").write_bytes(b"store")
    (tmp_path / "gpufill.db-shm").write_bytes(b"shm")
    (tmp_path / "logs").mkdir()
    for name in ("run-1.log", "run-1.log.1", "run-12.log", "run-x.log", "my-run-1.log"):
        (tmp_path / "logs" / name).write_text(name)
    target = victim(tmp_path)
    link(tmp_path / "logs" / "run-2.log", target)
    assert delete_run_files(tmp_path) == ["gpufill.db", "gpufill.db-shm", "logs/run-1.log", "logs/run-1.log.1", "logs/run-12.log"]
    assert sorted(os.listdir(tmp_path / "logs")) == ["my-run-1.log", "run-2.log", "run-x.log"] and target.read_bytes() == PRECIOUS


def _default_hangup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a test runner started under nohup would pass SIGHUP on ignored


@pytest.mark.parametrize("second, when", [(signal.SIGTERM, "the command ended"), (signal.SIGHUP, "the command ended"),
                                          (signal.SIGTERM, "watch.json is written")])
@pytest.mark.slow
def test_a_second_signal_while_watch_writes_its_report_does_not_lose_it(tmp_path, second, when):
    out = tmp_path / "stopped"
    command = [*GPUFILL, "watch", "--out", str(out), "--", sys.executable, str(SCRIPTS / "steady_training.py"), "50", "0.02"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_default_hangup)
    watcher = psutil.Process(process.pid)
    deadline = time.monotonic() + 120
    while not list(out.glob("steps-0-*.jsonl")) and time.monotonic() < deadline:  # the training is under way
        time.sleep(0.05)
    children = watcher.children()
    assert children, "the command did not start"
    process.send_signal(signal.SIGTERM)
    psutil.wait_procs(children, timeout=120)  # the command is gone: watch is reading and writing what it left
    while when == "watch.json is written" and not (out / "watch.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # then it builds report.html (pandas, matplotlib): seconds
    process.send_signal(second)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr  # the command's own exit code, not the second signal's
    record = json.loads((out / "watch.json").read_text())
    assert record["exit_code"] == 143 and record["stop_reason"].startswith("the script was stopped by SIGTERM after ")
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_a_signal_before_the_command_exists_is_passed_on_and_one_after_it_ended_is_noted():
    forwarder = SignalForwarder()
    forwarder(signal.SIGTERM, None)  # while the command is being started
    assert forwarder.held == [signal.SIGTERM]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    forwarder.attach(child)
    assert child.wait(timeout=240) == -signal.SIGTERM
    forwarder(signal.SIGHUP, None)  # the command has ended: nothing to pass it to, and gpufill goes on writing
    assert forwarder.after_end == [signal.SIGHUP]


# -- class 7: output paths ------------------------------------------------------------------------------------
DIRECTORY = "a directory is there, not a file; fix: give --out the name of a file (one inside that directory, for instance)"


@pytest.mark.parametrize("args, where, problem", [
    (("report", "--out", "{tmp}"), "{tmp}", DIRECTORY),
    (("report", "--out", "/"), "/", DIRECTORY),
    (("results", "--format", "csv", "--out", "{tmp}"), "{tmp}", DIRECTORY),
    (("results", "--format", "json", "--out", "/"), "/", DIRECTORY),
    (("results", "--format", "parquet", "--out", "/dev/null"), "/dev/null",
     "not a regular file (a device, pipe or socket); fix: give --out the name of a regular file"),
])
def test_an_output_path_that_is_not_a_file_is_one_line(tmp_path, capsys, finished, args, where, problem):
    code, out, err = run_cli(capsys, *(a.format(tmp=tmp_path) for a in args), "--workdir", finished[1])
    assert code == 2 and one_line(err) == f"gpufill: error: {where.format(tmp=tmp_path)}: --out: {problem}"
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_a_long_campaign_name_as_the_default_workdir_is_one_line(tmp_path, capsys, monkeypatch):
    path = write_campaign(tmp_path, name="long", models="linear: {}")
    path.write_text(path.read_text().replace("name: long", "name: " + "n" * 300))
    monkeypatch.chdir(tmp_path)  # the default workdir is made where the command runs
    code, _, err = run_cli(capsys, "run", path)
    line = one_line(err)
    assert code == 2 and line.endswith(": --workdir: the path is too long for the file system (308 bytes, its longest name 308 bytes); "
                                       "fix: pass a shorter --workdir (without --workdir it is gpufill-NAME, from the campaign's name)")
    assert os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("folder", ["logs", "tune"])
def test_a_file_where_the_workdir_needs_a_folder_is_one_line_before_anything_is_written(tmp_path, capsys, folder):
    path = write_campaign(tmp_path, models="linear: {}")
    work = tmp_path / "work"
    work.mkdir()
    (work / folder).write_text("mine")
    code, _, err = run_cli(capsys, "run", path, "--workdir", work)
    assert code == 2 and one_line(err) == (f"gpufill: error: {work / folder}: --workdir: a file is there, not a folder; "
                                           "fix: move that file away, or pass another --workdir")
    assert sorted(os.listdir(work)) == ["gpufill.lock", folder] and (work / folder).read_text() == "mine"


def test_bench_refuses_an_out_that_is_a_directory_before_it_measures(tmp_path, capsys):
    marker = tmp_path / "ran"
    code, _, err = run_cli(capsys, "bench", "--out", tmp_path, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert code == 2 and one_line(err) == f"gpufill: error: {tmp_path}: --out: {DIRECTORY}" and not marker.exists()


def refusing_creation(folder: Path, error_number: int):
    """os.open failing with `error_number` when it would create a file in `folder` (a read-only or forbidden folder's answer)."""
    real_open = os.open

    def opener(path, flags, *args, **kwargs):
        if Path(path).parent == folder and flags & os.O_CREAT:
            raise OSError(error_number, os.strerror(error_number), str(path))
        return real_open(path, flags, *args, **kwargs)
    return opener


@pytest.mark.parametrize("error_number, problem", [
    (errno.EROFS, "the file system is read-only; fix: pass a checkpoint_dir on a writable disk"),
    (errno.EACCES, "this user may not write there; fix: pass a checkpoint_dir this user can write to"),
])
def test_a_checkpoint_dir_that_cannot_be_written_is_one_line_before_the_first_epoch(tmp_path, monkeypatch, error_number, problem):
    folder = tmp_path / "ck"
    folder.mkdir()
    monkeypatch.setattr(files.os, "open", refusing_creation(folder, error_number))
    counter = CountEpochs()
    with pytest.raises(InputError) as caught:
        fit(make_model(), data(), checkpoint_dir=folder, callbacks=[counter], **FIT)
    assert caught.value.one_line() == f"{folder / LOCK_NAME}: checkpoint_dir: {problem}" and counter.epochs == 0


@needs_mount
@pytest.mark.slow
def test_a_read_only_checkpoint_dir_and_out_are_one_line_on_a_real_read_only_disk(tmp_path, finished):
    mount = tmp_path / "ro"
    work = copy_of(finished, tmp_path)
    script = " ; ".join([
        sh(*GPUFILL, "train", "--model", "mlp", "--epochs", "3", "--checkpoint-dir", mount / "ck", "--json") + " ; echo rc=$?",
        sh(*GPUFILL, "report", "--workdir", work, "--out", mount / "r.html") + " ; echo rc=$?",
        sh(*GPUFILL, "results", "--workdir", work, "--format", "csv", "--out", mount / "r.csv") + " ; echo rc=$?",
    ])
    done = on_tmpfs(mount, "ro,size=64k", script)
    assert done.stdout.split() == ["rc=2", "rc=2", "rc=2"], done.stderr
    assert without_progress(done.stderr).strip().splitlines() == [
        f"gpufill: error: {mount / 'ck'}: --checkpoint-dir: the file system is read-only; fix: pass a --checkpoint-dir on a writable disk",
        f"gpufill: error: {mount / 'r.html'}: --out: the file system is read-only; fix: pass a --out on a writable disk",
        f"gpufill: error: {mount / 'r.csv'}: --out: the file system is read-only; fix: pass a --out on a writable disk",
    ]


@needs_mount
@pytest.mark.slow
def test_report_and_results_on_a_full_disk_are_one_line_and_leave_no_partial_file(tmp_path, finished):
    mount = tmp_path / "full"
    work = copy_of(finished, tmp_path)
    script = " ; ".join([
        f"(head -c 100000000 /dev/zero > {sh(mount / 'filler')} 2> /dev/null; true)",
        sh(*GPUFILL, "report", "--workdir", work, "--out", mount / "r.html") + " ; echo rc=$?",
        sh(*GPUFILL, "results", "--workdir", work, "--format", "parquet", "--out", mount / "r.parquet") + " ; echo rc=$?",
        f"ls -A {sh(mount)}",
    ])
    done = on_tmpfs(mount, "size=64k", script)
    assert done.stdout.split() == ["rc=2", "rc=2", "filler"], done.stderr  # no temporary file left behind
    full = "--out: the disk is full; fix: free space there, or pass a --out on another disk"
    assert done.stderr.strip().splitlines() == [f"gpufill: error: {mount / 'r.html'}: {full}", f"gpufill: error: {mount / 'r.parquet'}: {full}"]


@pytest.mark.slow
def test_two_trainings_in_one_checkpoint_dir_the_second_is_one_line(tmp_path):
    folder = tmp_path / "ck"
    with held_directory(folder):  # a training holds it (here: this process)
        with pytest.raises(InputError) as caught:
            fit(make_model(), data(), checkpoint_dir=folder, **FIT)
        assert caught.value.one_line() == (
            f"{folder}: checkpoint_dir: another training (pid {os.getpid()}) is writing its checkpoints here; two trainings in one "
            "folder would overwrite each other's; fix: give each training its own checkpoint_dir, or wait for the other one to finish")
        run = subprocess.run([*GPUFILL, "train", "--model", "mlp", "--epochs", "2", "--checkpoint-dir", str(folder)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 2 and one_line(run.stderr).startswith(
            f"gpufill: error: {folder}: --checkpoint-dir: another training (pid {os.getpid()}) is writing its checkpoints here")
    assert not (folder / "last.pt").exists()
    assert fit(make_model(), data(), checkpoint_dir=folder, **FIT).metrics["epochs_run"] == 3  # free again


def test_a_full_disk_during_a_checkpoint_keeps_the_one_before_and_resuming_continues_from_it(tmp_path, monkeypatch):
    folder = tmp_path / "ck"
    real_save = torch.save

    def save_until_the_disk_fills(payload, handle, *args, **kwargs):
        if json.loads(payload["meta_json"])["state"]["epoch"] == 2:
            handle.write(b"x" * 1000)  # part of it reached the disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(payload, handle, *args, **kwargs)

    monkeypatch.setattr("gpufill.engine.checkpoint.torch.save", save_until_the_disk_fills)
    with pytest.raises(InputError) as caught:
        fit(make_model(), data(), checkpoint_dir=folder, **FIT)
    assert caught.value.one_line() == (
        f"{folder / 'last.pt'}: checkpoint_dir: the disk is full: the checkpoint after epoch 2 was not written; the one before it is kept "
        "as it was; fix: free space there, or pass a checkpoint_dir on another disk, then resume (resume=True, or --resume)")
    assert sorted(os.listdir(folder)) == [LOCK_NAME, "last.pt", "meta.json"]  # the partial temporary file is gone
    assert json.loads((folder / "meta.json").read_text())["state"]["epoch"] == 1
    monkeypatch.setattr("gpufill.engine.checkpoint.torch.save", real_save)
    resumed = fit(make_model(), data(), checkpoint_dir=folder, resume=True, **FIT)
    assert "resumed after epoch 1" in " ".join(resumed.events) and [r.epoch for r in resumed.history] == [1, 2, 3]


@needs_mount
@pytest.mark.slow
def test_a_real_full_disk_during_a_checkpoint_is_one_line_and_the_one_before_loads(tmp_path):
    mount = tmp_path / "full"
    check = (f"{sh(sys.executable)} -c " + shlex.quote(
        f"import json, torch; print('epoch', json.loads(torch.load({str(mount / 'ck' / 'last.pt')!r}, weights_only=True)['meta_json'])['state']['epoch'])"))
    # An mlp checkpoint is ~470 kB: the first fits in 700 kB, the second cannot be written beside it.
    done = on_tmpfs(mount, "size=700k", sh(*GPUFILL, "train", "--model", "mlp", "--epochs", "3", "--checkpoint-dir", mount / "ck", "--json")
                    + f" > /dev/null; echo rc=$?; ls -A {sh(mount / 'ck')}; {check}")
    assert done.stdout.split() == ["rc=2", LOCK_NAME, "last.pt", "meta.json", "epoch", "1"], done.stderr
    assert one_line(without_progress(done.stderr)) == (
        f"gpufill: error: {mount / 'ck' / 'last.pt'}: --checkpoint-dir: the disk is full: the checkpoint after epoch 2 was not written; "
        "the one before it is kept as it was; fix: free space there, or pass a --checkpoint-dir on another disk, then resume "
        "(resume=True, or --resume)")


@needs_mount
@pytest.mark.parametrize("exit_code", [0, 3])
@pytest.mark.slow
def test_a_full_disk_under_watch_passes_the_scripts_exit_code_through(tmp_path, exit_code):
    mount = tmp_path / "full"
    script = tmp_path / "script.py"
    script.write_text(f"import sys\nprint('the script ran')\nsys.exit({exit_code})\n")
    out = mount / "rec"
    fill = f"mkdir {sh(out)} && (head -c 100000000 /dev/zero > {sh(mount / 'filler')} 2> /dev/null; true)"  # the disk is full from the start
    done = on_tmpfs(mount, "size=64k", f"{fill} && " + sh(*GPUFILL, "watch", "--out", out, "--", sys.executable, script) + "; echo rc=$?")
    assert done.stdout.split("\n")[0] == "the script ran" and done.stdout.split()[-1] == f"rc={exit_code}", done.stderr
    full = "--out: the disk is full; fix: free space there, or pass a --out on another disk"
    assert f"gpufill watch: warning: the GPU and host samples stopped: {out / 'samples.jsonl'}: {full}" in done.stderr.splitlines()
    assert f"gpufill watch: warning: the record was not written: {out / 'watch.json'}: {full}" in done.stderr.splitlines()
    assert "Traceback" not in done.stderr and "Logging error" not in done.stderr


@pytest.mark.slow
def test_a_full_disk_while_watch_writes_its_record_costs_the_record_not_the_exit_code(tmp_path, monkeypatch, capsys):
    from gpufill.script import watch

    def full(path, *args, **kwargs):
        raise files.cannot_write(OSError(errno.ENOSPC, "No space left on device"), path, field="--out")

    monkeypatch.setattr(watch, "write_atomically", full)
    out = tmp_path / "rec"
    code, _, err = run_cli(capsys, "watch", "--out", out, "--", sys.executable, "-c", "import sys; sys.exit(5)")
    assert code == 5
    assert (f"gpufill watch: warning: the record was not written: {out / 'watch.json'}: --out: the disk is full; "
            "fix: free space there, or pass a --out on another disk") in err.splitlines()
    assert "Traceback" not in err and not (out / "watch.json").exists()


def test_a_full_disk_cuts_an_appended_file_back_to_its_last_whole_line(tmp_path, monkeypatch):
    path = tmp_path / "samples.jsonl"
    files.append_whole(path, '{"ts":1}\n', field="--out")
    real_write = os.write

    def half_then_full(descriptor, data):
        if len(data) > 4:
            return real_write(descriptor, bytes(data[:4]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "write", half_then_full)
    with pytest.raises(InputError) as caught:
        files.append_whole(path, '{"ts":2}\n', field="--out")
    assert "the disk is full" in caught.value.one_line() and path.read_text() == '{"ts":1}\n'
