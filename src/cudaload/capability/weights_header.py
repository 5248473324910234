"""The dtype a checkpoint stores most of its weights in, read from a local safetensors header (no tensor
is read): what transformers' dtype="auto" uses when the config names none (`weights_dtype`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["weights_dtype"]


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def weights_dtype(model: str, revision: str | None, config_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """The floating dtype holding most of the weights, read from a safetensors header (the first
    8 bytes give the JSON header's length; no tensor is read). None when there is no local file
    (or the weights are a GGUF file, which transformers dequantizes)."""
    import json
    import struct

    where = dict(config_kwargs or {})
    if where.get("gguf_file"):
        return None
    path = _weights_file(model, revision, where.get("subfolder") or "", where.get("cache_dir"))
    if path is None:
        return None
    import stat

    try:
        with open(path, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100_000_000:  # safetensors' own header limit (MAX_HEADER_SIZE)
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error):
        return None
    counts: dict[str, int] = {}
    for name, entry in header.items():
        dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype", "")) if name != "__metadata__" else None
        if dtype is not None:
            size = 1
            for dim in entry.get("shape", ()):
                size *= int(dim)
            counts[dtype] = counts.get(dtype, 0) + size
    return max(counts, key=lambda d: counts[d]) if counts else None


def _weights_file(model: str, revision: str | None, subfolder: str = "", cache_dir: Any = None) -> str | None:
    """A local safetensors file of `model` (a folder, or a Hub id already in the cache), in `subfolder`
    and through `cache_dir` as transformers' `cached_file` looks them up."""
    import json
    from pathlib import Path

    def find(name: str) -> str | None:
        if os.path.isdir(model):
            candidate = os.path.join(model, subfolder, name)
            return candidate if os.path.isfile(candidate) else None
        from huggingface_hub import try_to_load_from_cache

        filename = f"{subfolder}/{name}" if subfolder else name
        cached = try_to_load_from_cache(model, filename, revision=revision, cache_dir=cache_dir)
        return cached if isinstance(cached, str) else None

    single = find("model.safetensors")
    if single is not None:
        return single
    index = find("model.safetensors.index.json")
    if index is None:
        return None
    try:
        weight_map = json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"]
        return find(next(iter(weight_map.values())))
    except (OSError, ValueError, KeyError, StopIteration):
        return None
