"""cudaload's own cache folder: measurements of this machine, as small JSON files.

`$CUDALOAD_CACHE`, else `$XDG_CACHE_HOME/cudaload`, else `~/.cache/cudaload` (a leading `~` is the
home folder, as a shell would expand it). Files are written atomically (a temporary file renamed
into place, mode 0600), so a reader never sees half a file, in folders created 0700. As ssh does
for its keys, a folder another user can write to (or that another user owns) is not read: anyone
could plant measurements there; one warning names it. Writers that must not race (N processes
measuring the same thing at once) hold `exclusive(...)`, a lock file beside the record. A reader
states the layout it expects (`conforms`): a file that cannot be parsed, or parses but has a wrong
type, a NaN, an infinite or a negative number anywhere, is treated as missing, so the caller
measures (or reads) again and rewrites it. An unwritable folder is not an error: the caller
measures again next time, and is warned once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import math
import os
import stat
import tempfile
import time
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import CudaloadWarning

__all__ = [
    "MAX_READ_BYTES",
    "NO_LOCK",
    "LockRefusal",
    "Positive",
    "cache_dir",
    "cache_key",
    "conforms",
    "decode",
    "exclusive",
    "read_json",
    "read_regular_file",
    "untrusted",
    "write_json",
]

MAX_READ_BYTES = 16 * 2**20
"""Files cudaload reads whole (its cache records, a model's config.json to hash it) are small:
anything larger is not read."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("CUDALOAD_CACHE"):
        return _expand(env["CUDALOAD_CACHE"], env)
    if env.get("XDG_CACHE_HOME"):
        return _expand(env["XDG_CACHE_HOME"], env) / "cudaload"
    return Path.home() / ".cache" / "cudaload"


def _expand(value: str, env: Mapping[str, str]) -> Path:
    """A leading `~` as the shell expands it (`~` and `~/x` from this environment's HOME, `~user`
    from the password database), never a folder literally called `~`."""
    if value == "~" or value.startswith("~/"):
        return Path(env.get("HOME") or Path.home()) / value[2:]
    return Path(value).expanduser()


def cache_key(value: str | Mapping[str, Any]) -> str:
    """A short stable file-name key for a string or a JSON-able mapping (keys sorted)."""
    text = value if isinstance(value, str) else json.dumps(dict(value), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_regular_file(path: str | os.PathLike[str], limit: int = MAX_READ_BYTES) -> bytes | None:
    """The bytes of `path` when it is a regular file of at most `limit` bytes, else None.

    A FIFO, a device (a symlink to /dev/zero), a folder or a larger file is never read: the file is
    opened non-blocking (so a FIFO without a writer does not block the open) and checked with
    fstat on the opened descriptor (so it cannot be swapped between the check and the read).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks) if size <= limit else None  # grew past the limit while read


class Positive:
    """A `conforms` spec: a finite number greater than zero (a size, a divisor)."""


def conforms(value: Any, spec: Any) -> bool:
    """Whether a value parsed from JSON has the layout `spec` describes, field by field.

    A spec is a type hint or a layout: `int` (not bool) and `float` (an int is accepted) must be
    finite and not negative (every number cudaload caches is a count, a size or a duration),
    `Positive` greater than zero; `str`, `bool`, `None`, `Any`, `X | None`, `Literal[...]`;
    `tuple[X, ...]` and `tuple[X, Y]` are JSON arrays (any or that exact length), `dict[str, X]` an
    object of those values, a dataclass an object with every field of its type; a dict
    `{"key": spec}` is an object with at least those keys, and a one-item list `[spec]` an array of
    such items. `decode` then turns a conforming value into the types the spec names.
    """
    if spec is Any:
        return True
    if spec is None or spec is type(None):
        return value is None
    if spec is Positive:
        return conforms(value, float) and value > 0
    if spec is bool:
        return isinstance(value, bool)
    if spec is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if spec is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if spec is str:
        return isinstance(value, str)
    if isinstance(spec, dict):
        return isinstance(value, dict) and all(key in value and conforms(value[key], s) for key, s in spec.items())
    if isinstance(spec, type) and dataclasses.is_dataclass(spec):
        return conforms(value, _fields(spec))
    if isinstance(spec, list) and len(spec) == 1:
        return isinstance(value, (list, tuple)) and all(conforms(item, spec[0]) for item in value)
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(item, args[0]) for item in value)
        return len(value) == len(args) and all(conforms(item, arg) for item, arg in zip(value, args, strict=True))
    if origin is dict:
        return isinstance(value, dict) and all(
            conforms(key, args[0]) and conforms(item, args[1]) for key, item in value.items()
        )
    raise TypeError(f"conforms() has no rule for the spec {spec!r}")


def _fields(cls: type) -> dict[str, Any]:
    """A dataclass as a layout: every field, with its type hint."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def decode(value: Any, spec: Any) -> Any:
    """A value that `conforms` to `spec` as the Python value the spec names: JSON arrays become
    tuples where the hint says tuple, objects become the dataclass the hint names, ints become
    floats where it says float."""
    if isinstance(spec, type) and dataclasses.is_dataclass(spec):
        return spec(**{name: decode(value[name], hint) for name, hint in _fields(spec).items()})
    if spec is float or spec is Positive:
        return float(value)
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if origin in (typing.Union, types.UnionType):
        return next((decode(value, arg) for arg in args if conforms(value, arg)), value)
    if origin is tuple:
        items = (args[0],) * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        return tuple(decode(item, arg) for item, arg in zip(value, items, strict=True))
    if origin is dict:
        return {key: decode(item, args[1]) for key, item in value.items()}
    return value


def untrusted(folder: Path) -> str | None:
    """Why cudaload must not read records from `folder` (None: it may): owned by another user, or
    writable by the group or others (as ssh refuses such a key folder). A missing folder is fine."""
    try:
        info = os.stat(folder)
    except OSError:
        return None
    if info.st_uid != os.getuid():
        return f"it is owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    writable = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if info.st_mode & bit]
    if writable:
        return f"it is writable by {' and '.join(writable)} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


_refused: set[str] = set()


def _trusted(path: Path) -> bool:
    """Whether the record's folder and the cache folder above it may be read; one warning per folder."""
    for folder in (path.parent, path.parent.parent):
        why = untrusted(folder)
        if why is None:
            continue
        if str(folder) not in _refused:
            _refused.add(str(folder))
            warnings.warn(
                f"cudaload does not read its cache in {folder}: {why}, so anyone could plant measurements there "
                f"(ssh refuses such folders for the same reason). Run `chmod go-w {folder}` if it is yours, or set "
                "CUDALOAD_CACHE to a folder only you can write; until then this machine is measured again.",
                CudaloadWarning,
                stacklevel=3,
            )
        return False
    return True


def read_json(path: Path, spec: Any = None) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing, unreadable, in a folder others can
    write (`untrusted`), not a regular file of at most MAX_READ_BYTES, not a JSON object, or (given
    a `spec`) does not conform to it."""
    if not _trusted(path):
        return None
    raw = read_regular_file(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode(), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or (spec is not None and not conforms(data, spec)):
        return None
    return data


def _no_constant(name: str) -> Any:
    """JSON has no NaN or Infinity: Python's json writes and reads them, cudaload's cache does not."""
    raise ValueError(f"{name} is not a JSON number")


_warned: set[str] = set()


def _make_folders(folder: Path) -> None:
    """`folder` and its parent (the cache folder), created 0700 when missing: only this user's."""
    for one in (folder.parent, folder):
        if not one.is_dir():
            one.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_json(path: Path, data: Mapping[str, Any]) -> bool:
    """Write `data` to `path` atomically. False (and one warning per folder) when it cannot."""
    try:
        _make_folders(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle, indent=2)
                handle.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        folder = str(path.parent)
        if folder not in _warned:
            _warned.add(folder)
            warnings.warn(
                f"cudaload could not write its measurement cache in {folder} ({exc.strerror or exc}): this "
                "machine will be measured again in every process. Set CUDALOAD_CACHE to a writable folder, "
                "or CUDALOAD_PROBE=0 to plan from the static tables without measuring.",
                CudaloadWarning,
                stacklevel=2,
            )
        return False
    return True


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

    The lock file is written (its holder's pid), so it is opened as ssh opens its keys: never in a
    folder another user can write or owns (`untrusted`: a symlink planted there would make this
    process truncate its target), never through a symbolic link (O_NOFOLLOW), and only when it is a
    regular file with one name (not a FIFO, a device or a hard link to another file).

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
        _make_folders(path.parent)
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
