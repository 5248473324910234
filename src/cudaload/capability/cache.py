"""cudaload's own cache folder: measurements of this machine, as small JSON files.

`$CUDALOAD_CACHE`, else `$XDG_CACHE_HOME/cudaload`, else `~/.cache/cudaload` (a leading `~` is the
home folder, as a shell would expand it). Files are written atomically (a temporary file renamed
into place, mode 0600), so a reader never sees half a file, in folders created 0700. As ssh does
for its keys, a folder another user can write to (or that another user owns) is not read: anyone
could plant measurements there; one warning names it. Writers that must not race (N processes
measuring the same thing at once) hold a lock file beside the record (`lock_file.exclusive`). A reader
states the layout it expects (`conforms`): a file that cannot be parsed, or parses but has a wrong
type, a NaN, an infinite or a negative number anywhere, is treated as missing, so the caller
measures (or reads) again and rewrites it. An unwritable folder is not an error: the caller
measures again next time, and is warned once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import math
import os
import stat
import tempfile
import types
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CudaloadWarning
from ..regular_file import read_regular_or_none

__all__ = [
    "MAX_READ_BYTES",
    "Positive",
    "cache_dir",
    "cache_key",
    "conforms",
    "decode",
    "listing",
    "make_folders",
    "read_json",
    "read_regular_file",
    "unreadable",
    "untrusted",
    "write_json",
]

MAX_READ_BYTES = 16 * 2**20
"""Files cudaload reads whole (its cache records, a model's config.json to hash it) are small:
anything larger is not read."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The cache folder.

    Raises:
        SettingError: CUDALOAD_CACHE names the home folder itself (`~`): cudaload's folders would be
            made among the user's own files.
    """
    env = os.environ if env is None else env
    if env.get("CUDALOAD_CACHE"):
        folder = _expand(env["CUDALOAD_CACHE"], env)
        home = Path(env.get("HOME") or Path.home())
        if folder == home or (folder.anchor and folder == Path(folder.anchor)):
            from ..errors import SettingError

            what = "your home folder" if folder == home else "the root folder"
            raise SettingError(
                f"CUDALOAD_CACHE={env['CUDALOAD_CACHE']!r} is {what} itself ({folder}): cudaload would make its "
                "folders among your own files. Set it to a folder of its own, e.g. CUDALOAD_CACHE=~/.cache/cudaload "
                "(or unset it)."
            )
        return folder
    if env.get("XDG_CACHE_HOME"):
        return _expand(env["XDG_CACHE_HOME"], env) / "cudaload"
    return Path.home() / ".cache" / "cudaload"


def _expand(value: str, env: Mapping[str, str]) -> Path:
    """A leading `~` as the shell expands it (`~` and `~/x` from this environment's HOME, `~user`
    from the password database), never a folder literally called `~`."""
    if value == "~" or value.startswith("~/"):
        return Path(env.get("HOME") or Path.home()) / value[2:]
    try:
        return Path(value).expanduser()
    except RuntimeError:  # ~user with no such user (pathlib: "Could not determine home directory.")
        from ..errors import SettingError

        name = "CUDALOAD_CACHE" if env.get("CUDALOAD_CACHE") == value else "XDG_CACHE_HOME"
        user = value[1:].split("/", 1)[0]
        raise SettingError(
            f"{name}={value!r}: there is no user {user!r} whose home folder `~{user}` could name. Set it to a "
            "folder path (e.g. ~/.cache/cudaload)."
        ) from None


def cache_key(value: str | Mapping[str, Any]) -> str:
    """A short stable file-name key for a string or a JSON-able mapping (keys sorted)."""
    text = value if isinstance(value, str) else json.dumps(dict(value), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_regular_file(path: str | os.PathLike[str], limit: int = MAX_READ_BYTES) -> bytes | None:
    """The bytes of `path` when it is a regular file of at most `limit` bytes, else None (regular_file.py: a FIFO,
    a device, a folder or a larger file is never read)."""
    return read_regular_or_none(path, limit)


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


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    """A dataclass as a layout: every field, with its type hint. Cached per class (never changed by its
    callers): each cached plan reads ~10 records' worth of dataclasses (a third of a warm plan()'s CPU time
    before). The annotation strings are evaluated in each defining class's module by `inspect.get_annotations`,
    half the time of `typing.get_type_hints` (which wraps each in a `ForwardRef` first; 0.25 of 0.5 ms for
    ModelFacts, Python 3.11): the same types for every record cudaload caches (tests/test_cache_records.py)."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):  # a base's fields first, a subclass's annotation winning
        hints.update(inspect.get_annotations(klass, eval_str=True))
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
    if not stat.S_ISDIR(info.st_mode):  # /dev/null: nothing can be written under it (and that is said)
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


def listing(folder: Path, pattern: str) -> list[Path]:
    """The files in `folder` matching `pattern`, sorted; none (and one warning per folder) when the
    folder cannot be searched (another user's 0700 folder, a name over the file system's 255 bytes):
    planning never fails on a cache, it measures or reads again."""
    try:
        return sorted(folder.glob(pattern)) if folder.is_dir() else []
    except OSError as exc:
        unreadable(folder, exc)
        return []


def unreadable(folder: Path, exc: OSError) -> None:
    """Warn once that `folder` (a cache) cannot be read, and what is done instead."""
    if str(folder) not in _refused:
        _refused.add(str(folder))
        warnings.warn(
            f"cudaload cannot read the cache folder {folder} ({exc.strerror or exc}), so it goes on without "
            "it. Set CUDALOAD_CACHE (or HF_HUB_CACHE for Hub files) to a folder you can read and write.",
            CudaloadWarning,
            stacklevel=3,
        )


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


def make_folders(folder: Path) -> None:
    """`folder` and its parent (the cache folder), created 0700 when missing: only this user's."""
    for one in (folder.parent, folder):
        if not one.is_dir():
            one.mkdir(mode=0o700, parents=True, exist_ok=True)


def _not_a_folder(root: Path) -> str:
    """ "; <the setting> leads to <file>, which is not a folder" when the cache folder (or one above it) is a file,
    naming the variable that chose it (CUDALOAD_CACHE=/dev/null fails with "File exists", which says nothing of it)."""
    for one in (root, *root.parents):
        try:
            there = one.exists() or one.is_symlink()
        except OSError:  # a name over 255 bytes: the error already says so
            return ""
        if there:
            if one.is_dir():
                return ""
            chosen = next(
                (
                    f"{name}={os.environ[name]!r}"
                    for name in ("CUDALOAD_CACHE", "XDG_CACHE_HOME")
                    if os.environ.get(name)
                ),
                "the default cache folder",
            )
            return f"; {chosen} leads to {one}, which is not a folder"
    return ""


def write_json(path: Path, data: Mapping[str, Any]) -> bool:
    """Write `data` to `path` atomically. False (and one warning per folder) when it cannot, or when the cache
    folder is one cudaload does not read (`untrusted`: another user's, or writable by others): as root against
    another user's cache, it neither reads it nor makes root-owned folders in it."""
    if not _trusted(path):
        return False
    try:
        make_folders(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
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
                f"cudaload could not write its measurement cache in {folder} ({exc.strerror or exc}"
                f"{_not_a_folder(path.parent.parent)}): this machine will be measured again in every process. Set "
                "CUDALOAD_CACHE to a writable folder, or CUDALOAD_PROBE=0 to plan from the static tables without "
                "measuring.",
                CudaloadWarning,
                stacklevel=2,
            )
        return False
    return True
