"""The cudaload exception tree.

Every error says what was asked, what was found and what to do. Each class also
subclasses the builtin a caller would naturally catch (ValueError for bad input,
ImportError for a missing package, RuntimeError for a failure while loading).
"""

from __future__ import annotations

__all__ = [
    "AttentionUnavailableError",
    "CudaloadError",
    "CudaloadWarning",
    "DtypeUnsupportedError",
    "FinetuneConfigError",
    "LaunchManifestError",
    "LoadFailedError",
    "MissingPackageError",
    "ModelConfigError",
    "PlacementError",
    "QuantizationError",
    "RemoteCodeError",
    "SettingError",
    "UnknownGpuError",
    "WorkloadError",
    "describe_error",
]


def describe_error(exc: BaseException) -> str:
    """One line for a foreign exception in a message or a result: "TypeName: first line"."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


class CudaloadError(Exception):
    """Base class of every error cudaload raises.

    Never raised itself: every error is one of the subclasses below, which say when. Catch it to
    handle any cudaload refusal at once; each subclass also derives from the builtin a caller
    would naturally catch (ValueError, ImportError or RuntimeError), so existing
    `except ValueError:` code keeps working. The message says what was asked, what was found and
    what to do.

    Examples:
        >>> import cudaload
        >>> issubclass(cudaload.LoadFailedError, cudaload.CudaloadError)
        True
        >>> issubclass(cudaload.WorkloadError, cudaload.SettingError), issubclass(cudaload.SettingError, ValueError)
        (True, True)
        >>> issubclass(cudaload.MissingPackageError, ImportError), issubclass(cudaload.LoadFailedError, RuntimeError)
        (True, True)
    """


class ModelConfigError(CudaloadError, ValueError):
    """The model's config could not be read (missing path, offline hub id, bad config).

    Raised by `plan()`, `load()`, `load_for_finetune()`, `pipeline()` and `read_model_facts()`
    when `model` is not a local path, Hub id, PretrainedConfig (or, for `plan()`, ModelFacts),
    is empty, or names a folder or Hub id whose config.json cannot be read (e.g. not in the cache
    with HF_HUB_OFFLINE=1), or whose model type no transformers Auto class maps; by
    `plan(..., generate=True)` given ModelFacts (they carry no KV-cache layout); and by
    `tokenizer_for()` when there is no tokenizer next to the model, or it has neither a pad nor an
    EOS token. Check the path or Hub id (and the network or cache), or save the missing files.

    Examples:
        >>> import cudaload
        >>> cudaload.plan("")
        Traceback (most recent call last):
        ...
        cudaload.errors.ModelConfigError: plan() was given an empty model name: pass a local path or a Hub id.
    """


class RemoteCodeError(CudaloadError, ValueError):
    """The model needs `trust_remote_code=True` and the user did not pass it.

    Raised while reading the config (`read_model_facts()`, hence `plan()`, `load()`,
    `load_for_finetune()`, `pipeline()`) when the checkpoint's architecture is defined only by code
    in its repository (`auto_map`). cudaload never sets `trust_remote_code` for you: read the
    repository's code, then pass `trust_remote_code=True` if you trust it.

    Examples:
        >>> import cudaload
        >>> issubclass(cudaload.RemoteCodeError, ValueError)
        True
    """


class AttentionUnavailableError(CudaloadError, ValueError):
    """An explicitly requested attention implementation cannot work on this machine.

    Raised by `plan()` (and so `load()`, `load_for_finetune()`, `pipeline()`) when you pass an
    `attn_implementation` the machine or model cannot run: e.g. a FlashAttention kernel on a GPU
    it has no build for, or on a CPU. Use another implementation (e.g. "sdpa") or leave
    `attn_implementation` unset so cudaload chooses and can fall back.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> t4 = cudaload.Machine.simulated("T4")
        >>> cudaload.plan(path, machine=t4, attn_implementation="flash_attention_3")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.AttentionUnavailableError: attn_implementation='flash_attention_3' was asked, but ...
    """


class DtypeUnsupportedError(CudaloadError, ValueError):
    """An explicitly requested dtype cannot work on this machine or with these settings.

    Raised by `plan()` (and the loaders built on it) for a `dtype` that is not a floating dtype
    cudaload plans with ("bfloat16", "float16", "float32", "auto" and their aliases), for bfloat16
    (asked, or the checkpoint's via "auto") on a GPU older than sm80, and when both `dtype=` and
    `torch_dtype=` are given; by a fine-tuning plan launched with a precision that cannot work
    (`accelerate launch --mixed_precision fp16` for an fp16-fragile family, bf16 before sm80). Pass
    another dtype (or relaunch), or leave it unset to let cudaload choose.

    Examples:
        >>> import cudaload
        >>> cudaload.plan("any/model", dtype="float16", torch_dtype="float16")
        Traceback (most recent call last):
        ...
        cudaload.errors.DtypeUnsupportedError: Both dtype= and torch_dtype= were given; pass only dtype=.
    """


class PlacementError(CudaloadError, ValueError):
    """An explicitly requested placement (device_map) cannot work here.

    Raised by `plan()` (and the loaders built on it) for a `device_map` or `max_memory` naming a
    device that is not "cpu", "disk", "cuda:N" or an int, a GPU this process cannot see, or an
    empty map; for a `device_map` with "meta" (no weights would load) or with every weight on
    "disk" (nothing to compute on); and when the distributed launch variables (RANK, WORLD_SIZE, ...) are invalid. Fix
    the map (or the launch environment), or leave `device_map` unset.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> cudaload.plan(path, machine=cudaload.Machine.simulated("T4"), device_map={})
        Traceback (most recent call last):
        ...
        cudaload.errors.PlacementError: device_map={} places nothing: leave it unset, or map modules to devices.
    """


class QuantizationError(CudaloadError, ValueError):
    """A quantization request is invalid or cannot run on this machine.

    Raised by `plan(..., finetune=True)` and `load_for_finetune()` for a `quantize` that is not
    "4bit", "8bit", None or "auto", for quantizing a checkpoint that is already quantized, and when
    both `quantize` and your own `quantization_config` are given. Pass one valid choice.

    Examples:
        >>> import cudaload
        >>> cudaload.plan("any/model", finetune=True, quantize="4bit", quantization_config={})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.QuantizationError: Both quantize='4bit' and quantization_config= were given. ...
    """


class FinetuneConfigError(CudaloadError, ValueError):
    """A fine-tuning (LoRA) setting is invalid for this model.

    Raised by `plan()` when `lora=` is given without `finetune=True`; by `plan(..., finetune=True)`
    and `load_for_finetune()` for LoRA settings that are not valid (rank, alpha, dropout, target
    modules the model does not have) or a model with no linear layers to wrap; and by
    `training_arguments()` given a model or plan that is not a fine-tuning one. Fix the setting, or
    build the plan with `finetune=True` / load with `load_for_finetune()`.

    Examples:
        >>> import cudaload
        >>> cudaload.plan("any/model", lora={"r": 8})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.FinetuneConfigError: lora={'r': 8} only applies to a fine-tuning plan: pass finetune=True ...
    """


class MissingPackageError(CudaloadError, ImportError):
    """A package a requested feature needs is not installed (or not an accepted version).

    Raised by `load_for_finetune()` without peft, and by `plan()` (and the loaders built on it)
    when `quantize="4bit"`/`"8bit"` needs a usable bitsandbytes, or `use_kernels=True` needs a
    `kernels` version the installed transformers accepts (and a CUDA GPU). Install what the
    message names (e.g. `pip install bitsandbytes`), or drop the setting.

    Examples:
        >>> import cudaload
        >>> issubclass(cudaload.MissingPackageError, ImportError)
        True
    """


class LoadFailedError(CudaloadError, RuntimeError):
    """Loading failed for an option the plan could not fall back from (or strict=True).

    Raised by `load()`, `load_for_finetune()` and `pipeline()` when `from_pretrained` fails for a
    reason no other attention implementation can fix (mismatched or truncated weights, a missing
    file or package, a GPU plan on a torch without CUDA: the message names the likely cause, or when
    it knows none, the arguments from_pretrained was given; a plan made for another machine says
    so), when an attention option fails at load
    or at the test forward and there is nothing to fall back to (you chose it, `strict=True`, or
    the chain is exhausted), and when every option gives non-finite logits. Follow the message: fix
    the checkpoint, pass another attention implementation or dtype, or let cudaload fall back.

    Examples:
        >>> import pathlib, tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> folder = pathlib.Path(build_tiny_model(tempfile.mkdtemp()))
        >>> (folder / "model.safetensors").unlink()  # the config is left, the weights are gone
        >>> cudaload.load(str(folder), machine=cudaload.Machine.simulated())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.LoadFailedError: Loading ... failed: OSError: ... check the folder.
    """


class LaunchMismatchError(CudaloadError, RuntimeError):
    """A launched rank planned differently from the plan its launch files were written from.

    Raised by `load_for_finetune()` inside a rank started by the files `cudaload launch` (or
    `launch_files()`) wrote, when the rank's own plan reaches another parallelism, dtype, attention,
    quantization or LoRA setting than the manifest (`CUDALOAD_LAUNCH`) records, when the launch has another
    shape than planned (nodes x ranks per node), or when the manifest cannot be read. The message names
    each setting with both values. Regenerate the launch on a machine like the ranks' (`cudaload launch`
    with the same flags), or pass the planned settings explicitly.

    Examples:
        >>> import json, tempfile, pathlib, cudaload
        >>> from cudaload.launch import check_launched_plan, launch_files
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> files = launch_files(path, machine=cudaload.Machine.simulated("H100", count=2), emit=["torchrun"])
        >>> rank = cudaload.plan(path, finetune=True, nodes=2, machine=cudaload.Machine.simulated("H100", count=2))
        >>> check_launched_plan(rank, files.manifest)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.LaunchMismatchError: This rank's plan ... layout: this launch runs 2 node(s) x 2 ranks, ...
    """


class LaunchManifestError(LaunchMismatchError):
    """The launch manifest a rank was started with (`CUDALOAD_LAUNCH`) cannot be read as one.

    Raised by `load_for_finetune()` in a launched rank when the file is missing, is not a regular file (a FIFO,
    a device), is larger than a manifest can be, is not JSON, or lacks a field of its schema or has one of the
    wrong type, or was written by another version of cudaload. The message names the file and what is wrong.
    Copy the launch's `cudaload-launch.json` to every node at that path (write it again with `cudaload launch`
    if it was damaged), or unset `CUDALOAD_LAUNCH`.

    Examples:
        >>> import json, tempfile, pathlib, cudaload
        >>> from cudaload.launch import read_manifest
        >>> broken = pathlib.Path(tempfile.mkdtemp()) / "cudaload-launch.json"
        >>> _ = broken.write_text(json.dumps({"model": "m"}))
        >>> read_manifest({"CUDALOAD_LAUNCH": str(broken)})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.LaunchManifestError: CUDALOAD_LAUNCH=... is not a cudaload launch manifest of version 2 ...
    """


class UnknownGpuError(CudaloadError, ValueError):
    """A simulated machine named a GPU the catalog does not know.

    Raised by `Machine.simulated()` (and so `cudaload plan --gpu ...`) for a GPU name or alias not in
    cudaload's catalog, or a "custom:" description that does not parse; the message suggests the
    nearest names and lists the known ones. Use one of those names, or describe the GPU by its facts:
    "custom:sm90:80GiB" (compute capability, memory).

    Examples:
        >>> import cudaload
        >>> cudaload.Machine.simulated("H10")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.UnknownGpuError: Unknown GPU 'H10' for a simulated machine. Did you mean 'h100' or 'h20' ...
    """


class SettingError(CudaloadError, ValueError):
    """A setting has the wrong type or an impossible value (e.g. use_kernels="yes").

    Raised by `plan()` (and `load()`, `load_for_finetune()`, `pipeline()`) for a flag that is not a
    real bool (`use_kernels`, `hub_kernels`, `generate`, `trust_remote_code`, `gradient_checkpointing`,
    `strict`, `verify`, `allow_missing_weights`; `tokenizer_for()`'s `training`), an
    `attn_implementation` that is not a string, generation settings (`context`,
    `cache_implementation`, `padding_side`) without `generate=True` or with `finetune=True`, or
    with impossible values; by `pipeline()` for an unknown task or a `model_class`/`generate`
    override; by `tokenizer_for()` for a `padding_side` other than "left"/"right"; and by
    `cudaload.demo.build_tiny_model()` for a folder it did not make; by `load(plan, ...)`,
    `load_for_finetune(plan, ...)` and `pipeline(task, plan, ...)` given overrides, a `machine` or
    another `model_class` (a Plan loads as planned), and by `load()` given a fine-tuning plan (its
    LoRA would be dropped: `load_for_finetune(plan)` applies it); for a `seq_len`/`batch_size` that
    is not a positive int and a `config=` that is not a PretrainedConfig; by `cudaload probe` when its
    lock file is not one (a symbolic link, a FIFO: delete it) or another process holds it too long.
    Pass a value of the kind the message names.

    Examples:
        >>> import cudaload
        >>> cudaload.plan("any/model", use_kernels="yes")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.SettingError: use_kernels='yes' (str): pass True or False, ...
    """


class WorkloadError(SettingError):
    """`workload=` names no known workload and is not a (prompt_tokens, new_tokens) pair.

    Raised by `plan()` (and the loaders built on it) before anything is read. Pass "balanced",
    "prefill-heavy", "decode-heavy", a pair of non-negative ints with prompt_tokens > 0, or a
    `Workload`.

    Examples:
        >>> import cudaload
        >>> cudaload.plan("any/model", workload="fast")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.WorkloadError: workload='fast' is not a workload cudaload knows. ...
    """


class CudaloadWarning(UserWarning):
    """A setting works but costs you (CPU offload, fp16 on a fragile family, an unwritable cache, ...).

    Issued (once per message) by `load()`, `load_for_finetune()` and `pipeline()` for each warning
    of the plan (`plan.warnings`, also shown by `explain()`) and when `device_map` offloaded modules
    to CPU or disk; and when cudaload's cache folder cannot be written (measurements are then not
    kept). It is a UserWarning: filter it with
    `warnings.filterwarnings("ignore", category=cudaload.CudaloadWarning)` once you have read it.

    Examples:
        >>> import cudaload
        >>> issubclass(cudaload.CudaloadWarning, UserWarning)
        True
    """
