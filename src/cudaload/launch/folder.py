"""Write a launch's files as a package manager installs: into a new temporary folder beside the target, then
renamed into place, so a reader sees the old set or the new one, never a part; never through a symbolic link; an
existing folder is replaced only when every file in it is one cudaload wrote (listed, with the same digest, in
its manifest), or when forced."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..errors import SettingError
from ..regular_file import read_regular_or_none
from .job import MANIFEST
from .manifest import MAX_BYTES, sha256

__all__ = ["write_set"]

_EXECUTABLE = (".sh", ".sbatch")


def _listed(folder: Path) -> dict[str, str] | None:
    """The digests the folder's own manifest lists (its files, by name), or None when it has no readable one."""
    raw = read_regular_or_none(folder / MANIFEST, MAX_BYTES, follow_symlinks=False)
    try:
        manifest = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None


def _foreign(folder: Path) -> list[str]:
    """The entries of `folder` cudaload did not write: not listed in its manifest, changed since, or not files."""
    listed = _listed(folder)
    found = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name == MANIFEST and listed is not None and entry.is_file(follow_symlinks=False):
            continue
        if listed is None or entry.name not in listed or not entry.is_file(follow_symlinks=False):
            found.append(entry.name)
        elif sha256(Path(entry.path).read_bytes()) != listed[entry.name]:
            found.append(f"{entry.name} (changed since cudaload wrote it)")
    return found


def _write_file(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(path, mode)  # the umask may have taken bits the mode asked for


def write_set(folder: str | os.PathLike[str], files: Mapping[str, str], *, force: bool = False) -> list[Path]:
    """Write `files` (name -> text) as the whole content of `folder`; the paths written.

    Raises:
        SettingError: `folder` is a symbolic link or not a folder, or holds files cudaload did not write (and
            `force` is not set).
    """
    target = Path(os.path.abspath(folder))
    try:
        info: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise SettingError(
            f"{target} is a symbolic link (to {os.readlink(target)}): cudaload never writes launch files through "
            "one. Pass the folder it points to, or another path."
        )
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise SettingError(f"{target} exists and is not a folder: pass a folder for the launch files.")
    if info is not None and not force:
        foreign = _foreign(target)
        if foreign:
            raise SettingError(
                f"{target} holds files cudaload did not write: {', '.join(foreign[:10])}"
                f"{' ...' if len(foreign) > 10 else ''}. The launch files replace the whole folder: pass an empty or "
                "new folder, or force=True (`cudaload launch --force`) to replace it."
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.cudaload-", dir=target.parent))
    old: Path | None = None
    try:
        for name, text in files.items():
            if Path(name).name != name or name in (".", ".."):
                raise SettingError(f"launch file name {name!r} is not a plain file name")
            _write_file(staging / name, text, 0o755 if name.endswith(_EXECUTABLE) else 0o644)
        os.chmod(staging, 0o755)
        if info is not None:
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, old / "set")
            try:
                os.rename(staging, target)
            except BaseException:
                os.rename(old / "set", target)
                raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and not (old / "set").exists():
            shutil.rmtree(old, ignore_errors=True)
        raise
    if info is None:
        try:
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return [target / name for name in files]
