"""Every file gpufill writes goes through here: never through a symbolic link, never half-written,
and one line (an InputError naming the path, the option and the fix) when it cannot be written.

- `write_atomically(path, data)`: a new temporary file beside the target (a fresh random name,
  created with O_EXCL|O_NOFOLLOW, so nothing already there is opened), written, then renamed over
  the target (`os.replace` replaces the directory entry; it never writes into what a link points at).
- `atomic_path(path)`: the same for writers that need a file name (torch.save, pandas.to_parquet).
- `append_whole(path, text)` / `open_append(path)` / `open_lock(path)`: an existing regular file or a new
  one, opened with O_NOFOLLOW (sample and step timelines, run logs, the workdir lock); `append_whole`
  cuts a failed append back, so a reader never meets half a line.
- `make_folder(path)`: a folder gpufill creates, refused when a file or a link is in its place.
- `open_input(path)`: a file the user gave gpufill to read (the campaign file), refused at once when it is a pipe.
- `check_in_place(path)`: the same refusals, by name, for a file a library opens itself (SQLite's store files).

The rule for a path that is already something else: a symbolic link, a directory, a device or a
pipe where gpufill writes a file is refused in one line (exit 2 in the CLI); the link, and the
file it points at, are left as they were. So is a file with more than one name (a hard link) that
gpufill would write in place (append to, truncate): its other names would see the writes. The check is
on the opened descriptor (fstat), and nothing is truncated before it. A temporary file whose write
fails (a full disk) is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from gpufill.errors import InputError

# No symbolic link is followed in the last component of a path gpufill opens for writing.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
FULL_DISK = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG)


def cannot_write(error: OSError, path: str | os.PathLike[str], *, field: str) -> InputError:
    """An OSError met while writing `path` as one line: what happened in words, and what to do."""
    path = Path(path)
    code = error.errno
    if code in FULL_DISK:
        problem, fix = "the disk is full", f"free space there, or pass a {field} on another disk"
    elif code == errno.EROFS:
        problem, fix = "the file system is read-only", f"pass a {field} on a writable disk"
    elif code in (errno.EACCES, errno.EPERM):
        problem, fix = "this user may not write there", f"pass a {field} this user can write to"
    elif code == errno.ENAMETOOLONG:
        longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
        problem = f"the path is too long for the file system ({len(os.fsencode(str(path)))} bytes, its longest name {longest} bytes)"
        fix = f"pass a shorter {field}"
    elif code == errno.ELOOP:
        return symlink_refused(path, field=field)
    elif code == errno.EISDIR:
        problem, fix = "a directory is there, not a file", f"give {field} the name of a file (one inside that directory, for instance)"
    elif code in (errno.ENOTDIR, errno.EEXIST):
        problem, fix = "a file is in the way: a part of the path is not a directory", f"move that file away, or pass another {field}"
    else:
        problem, fix = f"cannot write it ({error.strerror or error})", f"check the path, or pass another {field}"
    return InputError(problem, where=_shorten(path), field=field, fix=fix)


def symlink_refused(path: str | os.PathLike[str], *, field: str) -> InputError:
    return InputError("a symbolic link is there; gpufill does not write through links (the link and what it points at are left as they were)",
                      where=_shorten(Path(path)), field=field, fix=f"remove the link, or pass a {field} without links in it")


def not_regular(path: str | os.PathLike[str], *, field: str) -> InputError:
    return InputError("not a regular file (a device, pipe or socket)", where=_shorten(Path(path)), field=field,
                      fix=f"give {field} the name of a regular file")


def hard_link_refused(path: str | os.PathLike[str], names: int, *, field: str) -> InputError:
    return InputError(f"the file there has {names} names (hard links); gpufill does not write into a file that other names share "
                      "(the file and its other names are left as they were)", where=_shorten(Path(path)), field=field,
                      fix=f"remove that name (the file stays under its other names), or pass another {field}")


def not_a_folder(path: str | os.PathLike[str], *, field: str) -> InputError:
    return InputError("a file is there, not a folder", where=_shorten(Path(path)), field=field, fix=f"move that file away, or pass another {field}")


def _existing(path: str | os.PathLike[str], *, field: str) -> os.stat_result | None:
    """What is at `path`, not following a link (None: nothing): a link is refused, an unreadable path is one line."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise cannot_write(error, path, field=field) from None
    if stat.S_ISLNK(info.st_mode):
        raise symlink_refused(path, field=field)
    return info


def check_target(path: str | os.PathLike[str], *, field: str) -> None:
    """Refuse, in one line, a path gpufill is about to write a file to that is a link, a directory, a device or a pipe.
    Nothing there (or a regular file, which is replaced) passes."""
    path = Path(path)
    info = _existing(path, field=field)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        raise cannot_write(OSError(errno.EISDIR, "Is a directory"), path, field=field)
    if not stat.S_ISREG(info.st_mode):
        raise not_regular(path, field=field)


def make_folder(path: str | os.PathLike[str], *, field: str, inside: str | os.PathLike[str] | None = None) -> Path:
    """Create the folder `path` (and its parents). The part below `inside` (a folder the user gave, such as the
    workdir) is gpufill's own: a link or a file in its place is refused. Returns `path`."""
    path = Path(path)
    if inside is not None:
        base = Path(inside)
        for part in [path, *path.parents]:
            if part == base or base not in part.parents:
                break
            info = _existing(part, field=field)
            if info is not None and not stat.S_ISDIR(info.st_mode):
                raise not_a_folder(part, field=field)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise not_a_folder(path, field=field) from None
    except OSError as error:
        raise cannot_write(error, path, field=field) from None
    return path


def _new_temporary(path: Path, *, field: str) -> tuple[int, Path]:
    """A new file beside `path` with a random name, created exclusively (never an existing file or link)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name[:200]}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as error:
            raise cannot_write(error, path, field=field) from None
    raise InputError("no free temporary name beside it", where=_shorten(path), field=field, fix="remove the stale .tmp files there")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, field: str) -> Iterator[Path]:
    """Yield a new temporary file's path beside `path`; when the block ends without an error it replaces `path`,
    otherwise it is removed. An OSError inside the block (a full disk) becomes one line naming `path`."""
    path = Path(path)
    check_target(path, field=field)
    make_folder(path.parent, field=field)
    descriptor, tmp = _new_temporary(path, field=field)
    os.close(descriptor)
    try:
        yield tmp
        check_target(path, field=field)  # nothing put a link there meanwhile (os.replace would only replace it, but say so)
        os.replace(tmp, path)
    except OSError as error:
        _remove_quietly(tmp)
        raise cannot_write(error, path, field=field) from None
    except BaseException:
        _remove_quietly(tmp)
        raise


def write_atomically(path: str | os.PathLike[str], data: bytes | str | Callable[[IO[bytes]], object], *, field: str) -> Path:
    """Write `data` (bytes, text as UTF-8, or a function writing to a binary file) to `path` through a new
    temporary file: a reader never sees half a file, and a link at `path` is refused, never followed."""
    path = Path(path)
    with atomic_path(path, field=field) as tmp:
        descriptor = os.open(tmp, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW | _CLOEXEC)
        with os.fdopen(descriptor, "wb") as handle:
            if callable(data):
                data(handle)
            else:
                handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
    return path


def check_writable(folder: str | os.PathLike[str], *, field: str) -> None:
    """Create and remove a new file in `folder` now: a read-only, full-to-the-inode or forbidden folder is one
    line before the work whose output it will hold, not after it."""
    descriptor, tmp = _new_temporary(Path(folder) / "write-check", field=field)
    os.close(descriptor)
    _remove_quietly(tmp)


def open_append(path: str | os.PathLike[str], *, field: str, encoding: str = "utf-8", newline: str | None = None) -> IO[str]:
    """A text file opened for appending: created if new; a link or anything but a regular file is refused."""
    descriptor = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, field=field)
    return os.fdopen(descriptor, "a", encoding=encoding, newline=newline)


def append_whole(path: str | os.PathLike[str], text: str, *, field: str) -> None:
    """Append `text` to `path` (created if new; a link or a non-regular file refused) in unbuffered writes; when one
    fails (a full disk) the file is cut back to where it was, so a reader never meets half a line, and the error is
    one line."""
    descriptor = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, field=field)
    try:
        size = os.fstat(descriptor).st_size
        data = memoryview(text.encode("utf-8"))
        try:
            while data:
                data = data[os.write(descriptor, data):]
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(descriptor, size)
            raise cannot_write(error, path, field=field) from None
    finally:
        os.close(descriptor)


def open_lock(path: str | os.PathLike[str], *, field: str) -> int:
    """The descriptor of a lock file opened read-write (created if new); a link or a non-regular file is refused."""
    return _open_regular(path, os.O_RDWR | os.O_CREAT, field=field)


def open_input(path: str | os.PathLike[str], *, field: str) -> int:
    """The descriptor of a file gpufill reads (links followed: the user named it): a pipe or socket is refused at once
    instead of waiting for a writer that may never come. A device stays non-blocking (a read that would wait fails)."""
    descriptor = os.open(path, os.O_RDONLY | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))  # OSError (not found, a directory) is the caller's
    mode = os.fstat(descriptor).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        os.close(descriptor)
        raise InputError("a pipe (FIFO) or socket, not a regular file: reading it would wait for a writer", where=_shorten(Path(path)),
                         field=field, fix=f"pass a regular file as the {field} (save what the pipe carries to a file first)")
    if stat.S_ISREG(mode):
        os.set_blocking(descriptor, True)
    return descriptor


def check_in_place(path: str | os.PathLike[str], *, field: str) -> None:
    """Refuse, by name, an existing file that a library (SQLite) will open and write in place itself: a link, a file
    that is not regular, or one with other names. By name, not by descriptor: SQLite offers none to check, and a
    descriptor of ours closed on its files would drop the locks it holds on them in this process."""
    info = _existing(path, field=field)
    if info is None:
        return
    if not stat.S_ISREG(info.st_mode):
        raise not_regular(path, field=field)
    if info.st_nlink > 1:
        raise hard_link_refused(path, info.st_nlink, field=field)


def open_existing(path: str | os.PathLike[str], flags: int = os.O_RDONLY, *, field: str) -> int | None:
    """The descriptor of an existing regular file opened without following a link (None: nothing there)."""
    try:
        return _open_regular(path, flags, field=field)
    except FileNotFoundError:
        return None


def _open_regular(path: str | os.PathLike[str], flags: int, *, field: str) -> int:
    """Open without following a link or waiting on a pipe; refuse what is not a regular file, and, when opened for
    writing, a file with other names. Never O_TRUNC: it would empty the file before the checks (ftruncate after)."""
    assert not flags & os.O_TRUNC, "truncate with os.ftruncate after _open_regular's checks"
    path = Path(path)
    try:
        descriptor = os.open(path, flags | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0), 0o666)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        raise cannot_write(OSError(errno.ENOENT, "No such file or directory"), path, field=field) from None
    except OSError as error:
        if error.errno == errno.ELOOP or (error.errno == errno.EMLINK and os.path.islink(path)):  # FreeBSD says EMLINK
            raise symlink_refused(path, field=field) from None
        if error.errno == errno.ENXIO:  # a pipe nobody reads (O_NONBLOCK), or a device without its driver
            raise not_regular(path, field=field) from None
        raise cannot_write(error, path, field=field) from None
    info = os.fstat(descriptor)  # the file opened, not whatever the name points at a moment later
    if not stat.S_ISREG(info.st_mode):  # a pipe or device: O_NONBLOCK kept the open itself from hanging
        os.close(descriptor)
        raise not_regular(path, field=field)
    if flags & (os.O_WRONLY | os.O_RDWR) and info.st_nlink > 1:  # a hard link: a write here lands in the file its other names show
        os.close(descriptor)
        raise hard_link_refused(path, info.st_nlink, field=field)
    os.set_blocking(descriptor, True)
    return descriptor


def remove_file(path: str | os.PathLike[str]) -> bool:
    """Remove `path` if it is a regular file (a link, a folder or anything else is left alone); True if removed."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _shorten(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 240 else f"{text[:120]}...{text[-60:]}"  # a 5,000-byte path still makes a readable line
