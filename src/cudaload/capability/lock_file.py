"""The lock file beside a cache record: processes that would measure the same thing at once take turns.

It is opened as ssh opens its keys, since it is written (its holder's pid): never in a folder another
user can write or owns (`cache.untrusted`: a symbolic link planted there would make this process
truncate its target), never through a symbolic link (O_NOFOLLOW), and only when it is a regular file
with one name and this user's (not a FIFO, a device, a folder or a hard link to another file).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .cache import make_folders, untrusted

__all__ = ["LOCK_TIMEOUT_S", "NO_LOCK", "LockRefusal", "exclusive"]

LOCK_TIMEOUT_S = 120.0
"""How long a process waits for another one's lock: a dtype probe takes 1-5 s on a quiet machine, and
up to ~50 s (two tries) at load 15 on 2 cores."""
LOCK_POLL_S = 0.05


@contextlib.contextmanager
def exclusive(
    path: Path, timeout_s: float | None = None, waiting: Callable[[str], None] | None = None
) -> Iterator[LockRefusal | None]:
    """Hold an exclusive `fcntl.flock` on `path` (a lock file, created 0600 beside the record it
    guards) while the block runs, so processes that start together take turns: the first measures,
    the others wait (asleep, using no CPU) and then read what it wrote. The lock dies with its
    process, so a killed holder never blocks anyone. `waiting` is called once, with a line naming
    the holder, when the lock is found held (a command the user watches says why it is silent).

    Yields None while the lock is held, else why it was not taken (a `LockRefusal`, whose `kind`
    says which): no lock file can be used here (the text starts with `NO_LOCK`), or another process
    held it for longer than `timeout_s` (default LOCK_TIMEOUT_S).
    """
    fd, refused = _open_lock(path)
    if fd is None:
        yield refused
        return
    try:
        timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() >= deadline:
                    yield LockRefusal(
                        f"another process (pid {holder}) has held {path} for more than {timeout_s:.0f} s", "held"
                    )
                    return
                if waiting is not None and not told:
                    told = True
                    waiting(f"waiting for another process (pid {holder}), which holds {path} (up to {timeout_s:.0f} s)")
                time.sleep(LOCK_POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield None
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class LockRefusal(str):
    """Why `exclusive` holds no lock: the text, and its `kind`: "held" (another process held it past
    the timeout), "unwritable" (no lock file can be made: nothing is cached there either),
    "untrusted" (the folder is another user's or writable by others) or "not-a-lock" (the path is a
    symbolic link, a FIFO, a device, a folder or a hard link: only its owner can have put it there)."""

    kind: str

    def __new__(cls, text: str, kind: str) -> LockRefusal:
        made = super().__new__(cls, text)
        made.kind = kind
        return made


NO_LOCK = "no lock file"
"""How `exclusive` starts a reason that means "no lock can be used here", as opposed to "held by another"."""


def _open_lock(path: Path) -> tuple[int | None, LockRefusal | None]:
    """The lock file's descriptor, or None and why it must not be used (see `exclusive`)."""
    for folder in (path.parent.parent, path.parent):
        why = untrusted(folder)
        if why is not None:
            return None, LockRefusal(f"{NO_LOCK} in {folder}: {why}, so another user could plant one", "untrusted")
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        make_folders(path.parent)
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, _not_a_lock(path, "a symbolic link, which cudaload never follows")
        if exc.errno == errno.EISDIR:
            return None, _not_a_lock(path, "a folder")
        return None, LockRefusal(f"{NO_LOCK} {path} ({exc.strerror or exc})", "unwritable")
    info = os.fstat(fd)  # the opened file itself: it cannot be swapped after this check
    kind = _file_kind(info.st_mode)
    if kind != "a regular file" or info.st_nlink != 1 or info.st_uid != os.getuid():
        os.close(fd)
        return None, _not_a_lock(path, kind if kind != "a regular file" else "a file with another name or owner")
    return fd, None


def _not_a_lock(path: Path, what: str) -> LockRefusal:
    return LockRefusal(
        f"{NO_LOCK} {path}: it is {what}, not a lock file cudaload made; delete it (`rm {path}`)", "not-a-lock"
    )


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"
