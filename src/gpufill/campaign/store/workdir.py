"""The files a campaign run writes in its workdir, and the only ones `--fresh` deletes.

A run writes (beside `gpufill.lock`, campaign/store/lock.py) the store `gpufill.db` with SQLite's
`-wal`, `-shm` and `-journal` files, `logs/run-<id>.log` (rotated to `.1` ... `.3`), the
measurement cache under `tune/` and, with --executor slurm, `slurm/`. None of them is ever
opened through a symbolic link: a link (or a file where a folder belongs) at one of these
names refuses the run in one line before anything is written, and so does a file there with other names
(a hard link: what the run writes would land in the file those names show). `--fresh` deletes the store
and the run logs, regular files only, and nothing else: no folder, and never a file of the
user's (`checkpoints/`, notes, data kept beside the store stay as they were).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import stat
from pathlib import Path
from typing import Any

from gpufill.campaign.store.store import DB_NAME
from gpufill.files import hard_link_refused, make_folder, not_a_folder, open_append, remove_file, symlink_refused

STORE_FILES = tuple(f"{DB_NAME}{suffix}" for suffix in ("", "-wal", "-shm", "-journal"))
"""The store and the files SQLite keeps beside it."""
FOLDERS = ("logs", "tune", "slurm")
"""Folders a run creates in the workdir (logs always; tune and slurm when their writers need them)."""
LOG_FOLDER = "logs"
RUN_LOG = re.compile(r"run-\d+\.log(\.\d+)?")
"""A run log and its rotated copies: the only names in logs/ that --fresh deletes."""


def check_paths(workdir: Path) -> None:
    """Refuse (one line) a workdir where a name the run writes is a symbolic link or a file with other names (a hard
    link), or a folder's name is a file. By name, early: the writers' own checks on the opened file stay the guarantee."""
    for name in (*STORE_FILES, *FOLDERS):
        path = workdir / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise symlink_refused(path, field="--workdir")
        if name in FOLDERS and not stat.S_ISDIR(info.st_mode):
            raise not_a_folder(path, field="--workdir")
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            raise hard_link_refused(path, info.st_nlink, field="--workdir")
    logs = workdir / LOG_FOLDER
    if logs.is_dir():  # this run's log name is known only once the store numbers the run: a link at any of them is refused now
        for entry in sorted(logs.iterdir(), key=lambda e: e.name):
            if not RUN_LOG.fullmatch(entry.name):
                continue
            info = os.lstat(entry)
            if stat.S_ISLNK(info.st_mode):
                raise symlink_refused(entry, field="--workdir")
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                raise hard_link_refused(entry, info.st_nlink, field="--workdir")


def delete_run_files(workdir: Path) -> list[str]:
    """What --fresh deletes: the store's files, and the run logs when there was a store (they describe its runs);
    regular files only. Returns the names deleted."""
    had_store = os.path.isfile(workdir / DB_NAME) and not os.path.islink(workdir / DB_NAME)
    deleted = [name for name in STORE_FILES if remove_file(workdir / name)]
    logs = workdir / LOG_FOLDER
    if had_store and logs.is_dir() and not logs.is_symlink():
        deleted += [f"{LOG_FOLDER}/{entry.name}" for entry in sorted(logs.iterdir(), key=lambda e: e.name)
                    if RUN_LOG.fullmatch(entry.name) and remove_file(entry)]
    return deleted


class RunLogHandler(logging.handlers.RotatingFileHandler):
    """A rotating run log opened without following links (rotation renames entries; it never writes through one).
    A write that fails (a full disk) stops the file logging quietly: the run's own error says what happened."""

    def __init__(self, path: Path, **settings: Any):
        self.failed = False
        super().__init__(path, delay=True, **settings)
        self.stream = self._open()  # opened now: a link or a non-regular file is refused before the run starts

    def _open(self) -> Any:
        return open_append(self.baseFilename, field="--workdir", encoding=self.encoding or "utf-8")

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self.failed = True


def open_run_log(workdir: Path, run_id: int, **settings: Any) -> RunLogHandler:
    folder = make_folder(workdir / LOG_FOLDER, field="--workdir", inside=workdir)
    return RunLogHandler(folder / f"run-{run_id}.log", **settings)
