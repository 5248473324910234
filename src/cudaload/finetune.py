"""`load_for_finetune()`: a PEFT LoRA model (4-bit QLoRA when planned), or for full training the model with
every weight trainable, ready to train, and `training_arguments()`: the TrainingArguments flags of the same plan."""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .errors import CudaloadWarning, FinetuneConfigError, LoadFailedError, MissingPackageError
from .facts.packages import install_hint
from .loaders import apply_plan
from .loaders.readback import lora_targets_read_back
from .loaders.zero3_loading import zero3_loading
from .plans import FinetunePlan, Plan
from .upstream_imports import import_bitsandbytes

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

    from .facts.machine import Machine

__all__ = ["load_for_finetune", "training_arguments"]


def _prepare(model: Any, finetune: FinetunePlan, checkpointing_method: str | None) -> None:
    """Apply the plan's k-bit preparation: freeze the base, checkpointing as planned, the planned
    `use_cache`; without peft's fp32 upcast. `checkpointing_method` is the installed transformers' name for
    checkpointing, as the planner read it (`ApplyFacts.checkpointing_method`; None: the old name).

    peft's `prepare_model_for_kbit_training` also casts every non-quantized weight (norms,
    embeddings, lm_head) to fp32, which multiplies their memory (81 GB vs 63 GB peak in one
    report); the adapters peft adds are fp32 anyway, and norms compute fine in bf16/fp16.
    """
    for param in model.parameters():
        param.requires_grad_(False)
    if finetune.gradient_checkpointing:
        # transformers >= 5.23 names it activation_checkpointing (the old name warns FutureWarning there).
        name = checkpointing_method or "gradient_checkpointing"
        getattr(model, f"{name}_enable")(**{f"{name}_kwargs": dict(finetune.checkpointing_kwargs)})
        # With the embeddings frozen, the checkpointed blocks' inputs need grads for the
        # backward to reach the adapters.
        model.enable_input_require_grads()
    model.config.use_cache = finetune.use_cache


def _prepare_full(model: Any, finetune: FinetunePlan, checkpointing_method: str | None) -> None:
    """Full training: every weight trainable, checkpointing as planned (no input grads to enable: the embeddings
    are trained, so the checkpointed blocks' inputs already need grads), the planned `use_cache`."""
    for param in model.parameters():
        param.requires_grad_(True)
    if finetune.gradient_checkpointing:
        name = checkpointing_method or "gradient_checkpointing"
        getattr(model, f"{name}_enable")(**{f"{name}_kwargs": dict(finetune.checkpointing_kwargs)})
    model.config.use_cache = finetune.use_cache


def _missing_peft(quantize: Any) -> str:
    """peft is missing: the message names every package the asked run needs at once (4-bit also needs
    bitsandbytes), as `plan(finetune=True, quantize="4bit")` does, instead of one round trip per package."""
    from .facts.quant_methods import QUANT_METHODS

    method = QUANT_METHODS.get(quantize) if isinstance(quantize, str) else None
    dist = method.package.distribution if method is not None else None
    if dist is None or _installed(dist):
        return f"load_for_finetune needs peft, which is not installed: {install_hint('peft')}."
    return (
        f"load_for_finetune(quantize={quantize!r}) needs peft (LoRA) and {dist} ({quantize} weights), and neither "
        f"is installed: pip install {dist} peft."
    )


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def load_for_finetune(
    model: str | os.PathLike[str] | Plan,
    *,
    train: str = "lora",
    quantize: str | None = "auto",
    lora: Mapping[str, Any] | None = None,
    gradient_checkpointing: bool = True,
    seq_len: int = 2048,
    batch_size: int = 1,
    strict: bool = False,
    machine: Machine | None = None,
    model_class: str | type | None = None,
    allow_missing_weights: bool = False,
    **overrides: Any,
) -> PeftModel | PreTrainedModel:
    """A PEFT model ready to train (or with train="full" the model itself, every weight trainable), with every
    setting planned and explained like `load()`.

    quantize: "4bit" (QLoRA: nf4, double quant, compute in the plan's dtype), "8bit", None,
    or "auto" (4-bit only when 16-bit LoRA would not fit the GPU at `seq_len` x `batch_size`).
    lora: LoraConfig overrides (r, lora_alpha, lora_dropout, target_modules, ...).
    Under torchrun / accelerate each rank loads the whole model on its own device
    (`device_map={"": LOCAL_RANK}`; none under FSDP / ZeRO-3). Only rank 0 reads the weights of an FSDP2 plan:
    the other ranks' model is on the meta device until accelerate shards it and broadcasts rank 0's weights
    (the plan's fsdp_config `cpu_ram_efficient_loading`; shard it with Trainer or accelerate); a ZeRO-3 rank
    loads its partition. `model.cudaload_plan` is the AppliedPlan; its `plan.finetune.training_arguments`
    feeds `training_arguments()`.

    The base weights are frozen (without peft's fp32 upcast of norms and embeddings), gradient
    checkpointing is enabled when planned, and the load is verified by a short forward in train mode
    (on the ranks that hold weights).

    Args:
        model: A local path or Hub id, or a fine-tuning `Plan` from `plan(..., finetune=True)` (then
            loaded as planned: the planning arguments below and overrides are not accepted).
        train: "lora" (the default: LoRA adapters on a frozen base) or "full" (every weight trained in the
            plan's dtype: no adapters, no quantization, peft not needed).
        quantize: "4bit", "8bit", None (full-precision base weights) or "auto" (the default).
        lora: LoraConfig keyword overrides (default None: r=16, lora_alpha=32, lora_dropout=0.05
            on every linear layer of the decoder, planned from the model).
        gradient_checkpointing: Trade compute for activation memory (default True).
        seq_len: Sequence length the memory estimate (and `quantize="auto"`) assumes (default 2048).
        batch_size: Batch size the memory estimate assumes (default 1).
        strict: Raise instead of falling back along the attention chain (default False).
        machine: The `Machine` to plan for (default None: `detect()` this one).
        model_class: The transformers Auto class (or model class) to load with, as a class or its
            name. Default None: the checkpoint's own architecture (config.json's "architectures").
        allow_missing_weights: Accept weights the checkpoint lacks, initialized at random (e.g. a
            classification head on a base checkpoint), as `load()` does (default False: raise).
        **overrides: from_pretrained and `plan()` keyword arguments (`dtype`,
            `attn_implementation`, `device_map`, `quantization_config` with `quantize=None`, ...).

    Returns:
        A peft `PeftModel` with trainable LoRA adapters (train="full": the transformers model, every parameter
        with requires_grad); `model.cudaload_plan` is the `AppliedPlan`, its
        `plan.finetune.trainable_parameters` the trained parameters' count.

    Raises:
        MissingPackageError: peft is not installed (LoRA), or `quantize="4bit"`/`"8bit"` without a usable
            bitsandbytes.
        FinetuneConfigError: LoRA settings that are not valid for this model, or an inference Plan.
        QuantizationError: an unknown `quantize`, a checkpoint that is already quantized, or both
            `quantize` and `quantization_config`.
        SettingError: generation settings (`generate=True`, `context`, ...), an unknown `train`,
            train="full" with a quantized base or `lora`, an override of the wrong type, a flag
            (`gradient_checkpointing`, `strict`, `allow_missing_weights`) that is not a real bool, a
            `seq_len`/`batch_size` that is not a positive int, or a Plan given with planning arguments.
        ModelConfigError: as `plan()` raises it (a model or config that cannot be read).
        RemoteCodeError: the model needs `trust_remote_code=True` and it was not given.
        DtypeUnsupportedError: a `dtype` this machine cannot run.
        AttentionUnavailableError: an `attn_implementation` this machine or model cannot run.
        PlacementError: a `device_map` that cannot work here, or invalid launch variables.
        LoadFailedError: as `load()` raises it (loading or the train-mode test forward failed
            with nothing to fall back to), or the adapted model (after get_peft_model) fails the
            same test forward.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> model = cudaload.load_for_finetune(path, quantize=None, dtype="float32", seq_len=64)
        >>> type(model).__name__, model.cudaload_plan.plan.finetune.trainable_parameters
        ('PeftModelForCausalLM', 32768)
        >>> args = cudaload.training_arguments(model)  # transformers 5.23 renamed the flag
        >>> args.get("gradient_checkpointing", args.get("activation_checkpointing"))
        True
    """
    if train != "full" and importlib.util.find_spec("peft") is None:
        raise MissingPackageError(_missing_peft(quantize))
    from .launch import check_launch, check_launched_environment, manifest_plan_arguments, read_manifest
    from .planner import plan
    from .request import check_flag, model_class_name

    for name, value in (("strict", strict), ("allow_missing_weights", allow_missing_weights)):
        check_flag(name, value, allow_none=False)
    start = time.perf_counter()
    # Started by the files `cudaload launch` wrote: plan with the launch's arguments, then agree with it.
    manifest = read_manifest(os.environ)
    if manifest is not None:  # a process no launcher started is told so before it plans
        check_launched_environment(manifest, os.environ)
    if isinstance(model, Plan):
        given = {
            "train": train != "lora",
            "quantize": quantize != "auto",
            "lora": lora is not None,
            "gradient_checkpointing": gradient_checkpointing is not True,
            "seq_len": seq_len != 2048,
            "batch_size": batch_size != 1,
            "machine": machine is not None,
            "model_class": model_class_name(model_class) not in (None, model.auto_class),
            **{key: True for key in overrides},
        }
        _check_finetune_plan(model, [name for name, set_ in given.items() if set_])
        the_plan = model
    else:
        layout = manifest_plan_arguments(manifest, os.environ) if manifest is not None else {}
        the_plan = plan(
            model,
            machine=machine,
            model_class=model_class,
            finetune=True,
            train=train,
            quantize=quantize,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
            seq_len=seq_len,
            batch_size=batch_size,
            **{**layout, **overrides},
        )
    if manifest is not None:  # every rank agrees, or every rank stops here, before a weight is loaded
        check_launch(the_plan, manifest)
    planned = time.perf_counter() - start
    assert the_plan.finetune is not None  # plan(finetune=True) always has the section
    if the_plan.finetune.lora is None:  # full training: the model itself, every weight trained
        return _load_full(the_plan, strict, allow_missing_weights, planned)
    # peft imports bitsandbytes, whose import may fetch Hub code: cudaload imports it first, with the plan's consent.
    import_bitsandbytes(hub_code=the_plan.hub_code)
    from peft import LoraConfig, get_peft_model

    try:  # plan() checked its LoRA settings where it was made, if peft was there: a Plan may come from elsewhere
        lora_config = LoraConfig(**the_plan.finetune.lora)
    except (TypeError, ValueError) as exc:
        raise FinetuneConfigError(
            f"peft's LoraConfig refuses the plan's LoRA settings ({dict(the_plan.finetune.lora)!r}): "
            f"{type(exc).__name__}: {exc}. Plan again with LoraConfig keyword arguments it takes (r, lora_alpha, "
            "lora_dropout, target_modules, ...)."
        ) from exc
    zero3 = zero3_loading(the_plan)  # a ZeRO-3 rank loads its share only, while this lives
    base = apply_plan(the_plan, strict=strict, verify=True, training=True, allow_missing_weights=allow_missing_weights)
    _prepare(base, the_plan.finetune, the_plan.apply_facts.checkpointing_method if the_plan.apply_facts else None)
    with warnings.catch_warnings():
        # peft (<= 0.21.2) reads the deprecated `is_gradient_checkpointing`, a FutureWarning on
        # transformers >= 5.23 that the caller cannot act on.
        warnings.filterwarnings("ignore", r"`is_gradient_checkpointing` is deprecated", FutureWarning)
        peft_model = get_peft_model(base, lora_config)
    _verify_adapted(peft_model, the_plan)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    applied = base.cudaload_plan
    differences = lora_targets_read_back(the_plan, peft_model)
    for difference in differences:
        warnings.warn(difference, CudaloadWarning, stacklevel=2)
    if zero3 is not None:
        peft_model.cudaload_zero3_config = zero3  # alive until TrainingArguments makes Trainer's own
    peft_model.cudaload_plan = replace(
        applied,
        plan=replace(applied.plan, finetune=replace(the_plan.finetune, trainable_parameters=trainable)),
        timings={"plan": planned, **applied.timings},
        warnings=(*applied.warnings, *differences),
    )
    return peft_model


def _load_full(the_plan: Plan, strict: bool, allow_missing_weights: bool, planned: float) -> PreTrainedModel:
    """Load as planned and make every weight trainable; `cudaload_plan` records the trained parameters."""
    assert the_plan.finetune is not None
    base = apply_plan(the_plan, strict=strict, verify=True, training=True, allow_missing_weights=allow_missing_weights)
    _prepare_full(base, the_plan.finetune, the_plan.apply_facts.checkpointing_method if the_plan.apply_facts else None)
    applied = base.cudaload_plan
    trained = sum(p.numel() for p in base.parameters() if p.requires_grad)
    base.cudaload_plan = replace(
        applied,
        plan=replace(applied.plan, finetune=replace(the_plan.finetune, trainable_parameters=trained)),
        timings={"plan": planned, **applied.timings},
    )
    model: PreTrainedModel = base
    return model


def _verify_adapted(peft_model: Any, the_plan: Plan) -> None:
    """The check forward again on the model that is returned: the base passed it before get_peft_model,
    and the adapters (their scale lora_alpha / r, their init) can still break it."""
    from .loaders.verify import verify_forward

    outcome = verify_forward(peft_model, training=True)
    if outcome.status == "failed":
        assert the_plan.finetune is not None and the_plan.finetune.lora is not None
        settings = ", ".join(f"{k}={v!r}" for k, v in the_plan.finetune.lora.items() if k != "target_modules")
        raise LoadFailedError(
            f"{the_plan.model} loaded and passed its test forward, but after get_peft_model the adapted model's "
            f"test forward failed: {outcome.problem}. The LoRA settings ({settings}) are the change: check them "
            "(a finite lora_alpha, a usable init_lora_weights)."
        ) from outcome.error


def _check_finetune_plan(the_plan: Plan, given: list[str]) -> None:
    """A Plan given to load_for_finetune() is applied as planned: it must be a fine-tuning plan, and
    nothing else may be asked beside it."""
    if the_plan.finetune is None:
        raise FinetuneConfigError(
            "load_for_finetune(plan) was given an inference plan (no LoRA, quantization or training settings): "
            "build it with cudaload.plan(model, finetune=True, ...), or pass the model itself."
        )
    if given:
        from .errors import SettingError

        raise SettingError(
            f"load_for_finetune(plan) was given {', '.join(given)}: a Plan is loaded as planned "
            f"(for {the_plan.machine}, through {the_plan.auto_class}). Build the plan with them instead: "
            "cudaload.plan(model, finetune=True, ...)."
        )


def training_arguments(
    model_or_plan: PreTrainedModel | PeftModel | Plan | None = None, **overrides: Any
) -> dict[str, Any]:
    """TrainingArguments keyword arguments for a model from `load_for_finetune` (or its Plan).

    Yours win: `TrainingArguments(**training_arguments(model, output_dir="out", max_steps=10))`.
    Without a model, the flags are planned for this machine with the default dtype.

    Args:
        model_or_plan: A model from `load_for_finetune()`, or a Plan from
            `plan(..., finetune=True)`. Default None: the flags for this machine (`detect()`),
            with the dtype cudaload would pick for a generic bf16 model and checkpointing on.
        **overrides: TrainingArguments keyword arguments; they replace the planned ones, the
            checkpointing flags under either name (`gradient_checkpointing=False` replaces a
            planned `activation_checkpointing=True`).

    Returns:
        A dict of TrainingArguments keyword arguments: the precision flags (`bf16`, `fp16`, and
        `tf32` on sm80+ GPUs), `optim`, `gradient_checkpointing` (`activation_checkpointing`
        from transformers 5.23) with its kwargs, on a CPU `use_cpu` and `dataloader_pin_memory`,
        then your overrides.

    Raises:
        FinetuneConfigError: the model or plan is not a fine-tuning one (no planned training
            arguments), or is neither a model from `load_for_finetune()` nor a Plan.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> plan = cudaload.plan(path, machine=cudaload.Machine.simulated("A100"), finetune=True)
        >>> cudaload.training_arguments(plan, output_dir="out")  # doctest: +NORMALIZE_WHITESPACE
        {'bf16': True, 'fp16': False, 'tf32': True, 'optim': 'adamw_torch_fused', 'gradient_checkpointing': True,
         'gradient_checkpointing_kwargs': {'use_reentrant': False}, 'output_dir': 'out'}
    """
    if model_or_plan is None:
        from .facts.model import reference_model
        from .planner import plan

        # Planned as any fine-tuning plan is, for a 16-bit model: the flags do not depend on its size.
        model_or_plan = plan(reference_model(), finetune=True, quantize=None)
    applied = getattr(model_or_plan, "cudaload_plan", None)
    the_plan = model_or_plan if isinstance(model_or_plan, Plan) else getattr(applied, "plan", None)
    if not isinstance(the_plan, Plan):
        raise FinetuneConfigError(
            f"training_arguments() takes a model from cudaload.load_for_finetune() or a Plan from "
            f"cudaload.plan(..., finetune=True), not {type(model_or_plan).__name__} ({model_or_plan!r:.60})."
        )
    if the_plan.finetune is None:
        raise FinetuneConfigError(
            "This plan is not a fine-tuning plan (no training arguments): build it with "
            "cudaload.plan(..., finetune=True) or load the model with load_for_finetune()."
        )
    # A copy: TrainingArguments normalizes the fsdp_config it is given in place (transformers 5.22-5.25
    # `TrainingArguments._process_fsdp_args`), which must not change the plan.
    planned = copy.deepcopy(dict(the_plan.finetune.training_arguments))
    _check_checkpointing_name(the_plan, planned)
    for names in _RENAMED:
        yours = [name for name in names if name in overrides]
        if not yours:
            continue
        # transformers 5.23 renamed the flag: yours wins under whichever name you used, and the
        # planned one under the other name must go, or TrainingArguments gets both.
        ours = {name: planned.pop(name) for name in names if name in planned}
        turned_off = names[0] == "gradient_checkpointing" and not overrides[yours[0]] and any(ours.values())
        if turned_off and not isinstance(model_or_plan, Plan):
            warnings.warn(
                f"training_arguments({yours[0]}=False): the model was loaded with checkpointing on "
                "(load_for_finetune(gradient_checkpointing=True)) and TrainingArguments cannot turn it off; "
                "load it with gradient_checkpointing=False instead.",
                CudaloadWarning,
                stacklevel=2,
            )
    if isinstance(planned.get("parallelism_config"), Mapping) and "parallelism_config" not in overrides:
        # Hybrid shard's mesh: TrainingArguments takes accelerate's object (it hands it to the Accelerator).
        from accelerate import ParallelismConfig

        planned["parallelism_config"] = ParallelismConfig(**planned["parallelism_config"])
    return {**planned, **overrides}


def _check_checkpointing_name(the_plan: Plan, planned: Mapping[str, Any]) -> None:
    """A plan made under transformers >= 5.23 (`activation_checkpointing`) cannot go to an older
    TrainingArguments, which raises a bare TypeError ("unexpected keyword argument"). (The other way round
    works: 5.23+ still takes `gradient_checkpointing`, with a FutureWarning.)"""
    from .installed import installed_versions
    from .upstream import CHECKPOINTING_RENAMED_SINCE, version_at_least

    here = installed_versions().get("transformers")
    if here is None or "activation_checkpointing" not in planned or version_at_least(here, CHECKPOINTING_RENAMED_SINCE):
        return
    import re

    # A plan for a simulated machine lists its packages ("...: torch 2.13.0, transformers 5.25.0, ...").
    assumed = re.search(r"\btransformers (\S+?)(?:,|$)", the_plan.assumed_packages or "")
    made_for = assumed.group(1) if assumed else "5.23 or newer"
    raise FinetuneConfigError(
        f"This plan's TrainingArguments flags were planned for transformers {made_for} "
        f"(activation_checkpointing=...), but transformers {here} is installed here, whose TrainingArguments "
        "takes gradient_checkpointing (transformers 5.23 renamed it). Plan again on this machine "
        "(cudaload.plan(model, finetune=True)), or install the transformers the plan was made for."
    )


# TrainingArguments' checkpointing flags, old name first: transformers 5.23 renamed them
# (`activation_checkpointing*`; the old names still work, with a FutureWarning).
_RENAMED = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)
