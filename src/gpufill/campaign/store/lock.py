"""One run per workdir: an OS-level lock the scheduler holds for the whole run.

`flock` on WORKDIR/gpufill.lock: the kernel releases it when the holder exits, however it
exits (kill -9 included), so a lock left by a killed scheduler is simply taken over; no
stale-pid guessing. The file also says who holds it (pid, host, command, start time), for
the one-line refusal a second `gpufill run` or a `--fresh` on a live workdir gets.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from pathlib import Path
from types import TracebackType

from gpufill.errors import InputError
from gpufill.files import cannot_write, make_folder, open_existing, open_lock

LOCK_NAME = "gpufill.lock"


class WorkdirLock:
    """`with WorkdirLock(workdir, command):` holds the workdir or raises InputError naming the holder."""

    def __init__(self, workdir: str | Path, command: str = "gpufill run"):
        self.path = Path(workdir) / LOCK_NAME
        self.command = command
        self._file: int | None = None
        self.taken_over: dict[str, object] | None = None
        """The record of a run that ended without releasing (killed): its lock is ours now."""

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        check_directory(self.path.parent)
        make_folder(self.path.parent, field="--workdir")
        descriptor = open_lock(self.path, field="--workdir")  # never through a link: one line instead
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = _read(descriptor)
            os.close(descriptor)
            raise _in_use(self.path.parent, record) from None
        previous = _read(descriptor)
        self.taken_over = previous if previous.get("pid") not in (None, os.getpid()) else None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command, "since": dt.datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(record).encode(), 0)
        self._file = descriptor

    def release(self) -> None:
        if self._file is None:
            return
        os.ftruncate(self._file, 0)  # nobody holds it: a later refusal never names a finished run
        fcntl.flock(self._file, fcntl.LOCK_UN)
        os.close(self._file)
        self._file = None


def check_directory(workdir: Path) -> None:
    """Refuse a workdir that is (or lies under) a file, or whose name the file system cannot hold (a long
    campaign name as the default workdir), before anything tries to create it."""
    for path in (workdir, *workdir.parents):
        try:
            found = path.exists()
        except OSError as error:  # ENAMETOOLONG: Path.exists() raises it (a long campaign name makes a long default workdir)
            refusal = cannot_write(error, workdir, field="--workdir")
            raise InputError(refusal.problem, where=refusal.where, field="--workdir",
                             fix=f"{refusal.fix} (without --workdir it is gpufill-NAME, from the campaign's name)") from None
        if found:
            if not path.is_dir():
                raise InputError(f"{path} is a file, not a directory", where=str(workdir), field="--workdir",
                                 fix="pass a directory (a new one is created), not a file")
            return


def check_free(workdir: str | Path) -> None:
    """Refuse (one line naming the holder) when a run holds `workdir`: e.g. before --fresh asks to delete it."""
    check_directory(Path(workdir))
    record = holder(workdir)
    if record is not None:
        raise _in_use(Path(workdir), record)


def _in_use(workdir: Path, record: dict[str, object]) -> InputError:
    return InputError(f"another gpufill run is using this workdir ({_describe(record)})", where=str(workdir), field="--workdir",
                      fix="wait for it to finish or stop it (Ctrl-C in its terminal), or pass another --workdir")


def holder(workdir: str | Path) -> dict[str, object] | None:
    """Who holds the workdir's lock now (None: nobody); reads only."""
    path = Path(workdir) / LOCK_NAME
    descriptor = open_existing(path, field="--workdir")  # a link there is refused, never followed
    if descriptor is None:
        return None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(descriptor)
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return None
    finally:
        os.close(descriptor)


def _read(descriptor: int) -> dict[str, object]:
    try:
        return json.loads(os.pread(descriptor, 4096, 0) or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}


def _describe(record: dict[str, object]) -> str:
    if not record.get("pid"):
        return "its holder did not say who it is"
    return f"pid {record['pid']} on {record.get('host', '?')}, {record.get('command', 'gpufill run')} since {record.get('since', '?')}"
