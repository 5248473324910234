"""cudaload's own cache folder: measurements of this machine, as small JSON files.

`$CUDALOAD_CACHE`, else `$XDG_CACHE_HOME/cudaload`, else `~/.cache/cudaload`. Files are written
atomically (a temporary file renamed into place), so a reader never sees half a file; one that
cannot be parsed is treated as missing and rewritten. An unwritable folder is not an error: the
caller measures again next time, and is warned once.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CudaloadWarning

__all__ = ["cache_dir", "cache_key", "read_json", "write_json"]


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("CUDALOAD_CACHE"):
        return Path(env["CUDALOAD_CACHE"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "cudaload"
    return Path.home() / ".cache" / "cudaload"


def cache_key(value: str | Mapping[str, Any]) -> str:
    """A short stable file-name key for a string or a JSON-able mapping (keys sorted)."""
    text = value if isinstance(value, str) else json.dumps(dict(value), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_warned: set[str] = set()


def write_json(path: Path, data: Mapping[str, Any]) -> bool:
    """Write `data` to `path` atomically. False (and one warning per folder) when it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
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
