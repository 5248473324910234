"""Read a small file only when it is a regular file: a FIFO, a device (a link to /dev/zero), a folder or a file past
the limit is refused before a byte is read. The cache records, the check proof's index and record, and the launch
manifest all read through here; it imports nothing of cudaload, so every layer may."""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["read_regular", "read_regular_or_none"]


def read_regular(path: str | os.PathLike[str], limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes.

    Opened non-blocking (so a FIFO without a writer does not block the open) and checked with fstat on the opened
    descriptor (so it cannot be swapped between the check and the read); with `follow_symlinks=False` a link is
    refused by the open itself (O_NOFOLLOW).

    Raises:
        OSError: the open's own error; EINVAL for a FIFO, device or folder; EFBIG past `limit` (also when the
            file grew past it while read).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or folder)")
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"{info.st_size} bytes, more than the {limit} read here")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(errno.EFBIG, f"more than the {limit} bytes read here (it grew while read)")
    return b"".join(chunks)


def read_regular_or_none(path: str | os.PathLike[str], limit: int, *, follow_symlinks: bool = True) -> bytes | None:
    """`read_regular`, or None where it raises: for records a reader treats as absent when they cannot be read."""
    try:
        return read_regular(path, limit, follow_symlinks=follow_symlinks)
    except OSError:
        return None
