"""A failure falls back along the attention chain only when it is the attention option's, judged by
the exception's type and where it was raised (transformers' attention checks and dispatch, the code
that runs that kind of attention), never by words in its text.

The load tests count `from_pretrained` calls: each one reads the weights again, which is what a
wrong attribution costs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
import transformers.modeling_flash_attention_utils as flash_utils

import cudaload
from cudaload import LoadFailedError, Machine
from cudaload.loaders.attribution import is_attention_failure

# Every word the old text match took for an attention failure.
ATTENTION_WORDS = "flash_attention_2-kernel-attn-sdpa"
NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"


@pytest.fixture
def from_pretrained_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The attn_implementation of each AutoModelForCausalLM.from_pretrained call (each reads the weights)."""
    calls: list[str] = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("attn_implementation"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    return calls


def _cpu_plan(path: Path) -> cudaload.Plan:
    plan = cudaload.plan(str(path), machine=Machine.simulated(), dtype="float32")
    assert plan.attention_chain == ("sdpa", "eager")
    return plan


# --- load phase ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "cause"),
    [("missing", "a file the model needs is missing"), ("truncated", "truncated or corrupt")],
)
def test_broken_weights_under_a_flash_kernel_path_are_read_once(
    tiny_models, tmp_path: Path, from_pretrained_calls, damage: str, cause: str
) -> None:
    folder = tmp_path / ATTENTION_WORDS
    shutil.copytree(tiny_models["llama"], folder)
    weights = folder / "model.safetensors"
    if damage == "missing":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(LoadFailedError, match=cause) as info:
        cudaload.load(_cpu_plan(folder))
    assert from_pretrained_calls == ["sdpa"]  # not read again with eager
    if damage == "missing":
        assert ATTENTION_WORDS in str(info.value.__cause__)  # the words are in the text, and did not count


@pytest.mark.slow
def test_no_kernel_image_from_the_weights_path_is_read_once(tiny_models, monkeypatch, from_pretrained_calls) -> None:
    # bitsandbytes (or any CUDA extension) built for another GPU fails while the weights load,
    # inside the real from_pretrained and after transformers accepted the attention option.
    def quantized_weights_failure(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(NO_KERNEL_IMAGE)

    monkeypatch.setattr(
        transformers.modeling_utils.PreTrainedModel, "_load_pretrained_model", staticmethod(quantized_weights_failure)
    )
    with pytest.raises(LoadFailedError, match=r"Loading .* failed: RuntimeError: CUDA error: no kernel image"):
        cudaload.load(_cpu_plan(tiny_models["llama"]))
    assert from_pretrained_calls == ["sdpa"]


@pytest.mark.slow
def test_transformers_refusing_flash_attention_at_load_falls_back(
    tiny_models, monkeypatch, from_pretrained_calls
) -> None:
    # A plan for an A100 with flash-attn, applied on this CPU without it: transformers'
    # _flash_attn_import_error raises ImportError while the model is built, and sdpa is loaded.
    # (As in a fresh process: no earlier Hub-kernel attempt has left flash-attn half-registered.)
    # hub_kernels=True: transformers is asked (its Hub-kernel fallback fails offline); without it cudaload
    # refuses the link before asking (tests/test_upstream_round4.py).
    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    model = cudaload.load(str(tiny_models["llama"]), machine=a100, hub_kernels=True, device_map="cpu", dtype="bfloat16")
    (fallback,) = model.cudaload_plan.fallbacks
    assert (fallback.option, fallback.phase) == ("flash_attention_2", "load")
    assert fallback.error.startswith("ImportError: FlashAttention2 has been toggled on")
    assert from_pretrained_calls == ["flash_attention_2", "sdpa"]
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_a_strict_load_names_the_refused_option_without_trying_another(
    tiny_models, monkeypatch, from_pretrained_calls
) -> None:
    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    with pytest.raises(LoadFailedError, match=r"'flash_attention_2' failed at load: ImportError: .*\(strict=True\)"):
        cudaload.load(
            str(tiny_models["llama"]), machine=a100, hub_kernels=True, device_map="cpu", dtype="bfloat16", strict=True
        )
    assert from_pretrained_calls == ["flash_attention_2"]


# --- verify phase -------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unregistered_flash_kernel_fails_at_the_forward_and_is_switched_in_place(
    tiny_models, monkeypatch, from_pretrained_calls
) -> None:
    # transformers takes kernels-community/flash-attn2 as imported once a failed fetch recorded it
    # (modeling_flash_attention_utils._loaded_implementation), so the model loads; its first forward
    # then finds the kernel missing from AttentionInterface (get_interface raises KeyError).
    monkeypatch.setattr(flash_utils, "_loaded_implementation", "kernels-community/flash-attn2")
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    model = cudaload.load(str(tiny_models["llama"]), machine=a100, hub_kernels=True, device_map="cpu", dtype="bfloat16")
    (fallback,) = model.cudaload_plan.fallbacks
    assert (fallback.option, fallback.phase) == ("flash_attention_2", "verify")
    assert fallback.error.startswith("KeyError:") and "AttentionInterface" in fallback.error
    assert from_pretrained_calls == ["flash_attention_2"]  # switched in place, not loaded again
    assert model.config._attn_implementation == "sdpa" and model.cudaload_plan.verified is True


@pytest.mark.slow
def test_no_kernel_image_from_inside_sdpa_switches_to_eager(tiny_models, monkeypatch, from_pretrained_calls) -> None:
    # The same words as the weights-path case, raised inside transformers' SDPA wrapper: SDPA's failure.
    def sdpa_without_a_kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(NO_KERNEL_IMAGE)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_without_a_kernel)
    model = cudaload.load(_cpu_plan(tiny_models["llama"]))
    assert [(f.option, f.phase) for f in model.cudaload_plan.fallbacks] == [("sdpa", "verify")]
    assert "no kernel image" in model.cudaload_plan.fallbacks[0].error
    assert from_pretrained_calls == ["sdpa"]
    assert model.config._attn_implementation == "eager" and model.cudaload_plan.verified is True


@pytest.mark.slow
def test_a_forward_failure_outside_attention_raises_without_switching(
    tiny_models, monkeypatch, from_pretrained_calls
) -> None:
    switched: list[str] = []
    original_switch = transformers.PreTrainedModel.set_attn_implementation

    def counting_switch(self: Any, implementation: Any, *args: Any, **kwargs: Any) -> Any:
        switched.append(implementation)
        return original_switch(self, implementation, *args, **kwargs)

    def mlp_without_a_kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{NO_KERNEL_IMAGE} (flash_attn attention kernel)")

    monkeypatch.setattr(transformers.PreTrainedModel, "set_attn_implementation", counting_switch)
    monkeypatch.setattr(transformers.models.llama.modeling_llama.LlamaMLP, "forward", mlp_without_a_kernel)
    with pytest.raises(LoadFailedError, match="test forward failed for a reason unrelated to attention"):
        cudaload.load(_cpu_plan(tiny_models["llama"]))
    assert from_pretrained_calls == ["sdpa"] and switched == []


# --- the attribution itself ---------------------------------------------------------------------


def _raised_in(module: str, function: str, error: BaseException) -> BaseException:
    """`error` as raised by `function` of `module`, as its traceback then shows it."""
    namespace: dict[str, Any] = {"__name__": module, "error": error}
    exec(f"def {function}():\n    raise error\n", namespace)
    try:
        namespace[function]()
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def test_a_refusal_counts_in_transformers_attention_checks_with_the_types_they_raise() -> None:
    refused = _raised_in("transformers.modeling_utils", "_flash_attn_can_dispatch", ImportError("no flash_attn"))
    assert is_attention_failure(refused, "flash_attention_2")
    unknown = _raised_in("transformers.modeling_utils", "get_interface", KeyError("`x` is not a valid attention"))
    assert is_attention_failure(unknown, "x")
    # Not a type those checks refuse an option with; not one of those checks.
    other = _raised_in("transformers.modeling_utils", "_flash_attn_can_dispatch", RuntimeError("CUDA error"))
    assert not is_attention_failure(other, "flash_attention_2")
    elsewhere = _raised_in("transformers.modeling_utils", "_load_pretrained_model", ValueError("flash_attention_2"))
    assert not is_attention_failure(elsewhere, "flash_attention_2")


def test_code_that_runs_an_option_counts_for_that_option_only() -> None:
    in_flash_attn = _raised_in("flash_attn.flash_attn_interface", "_flash_attn_forward", RuntimeError(NO_KERNEL_IMAGE))
    assert is_attention_failure(in_flash_attn, "flash_attention_2")
    assert not is_attention_failure(in_flash_attn, "sdpa")
    in_sdpa = _raised_in("transformers.integrations.sdpa_attention", "sdpa_attention_forward", RuntimeError("x"))
    assert is_attention_failure(in_sdpa, "sdpa")
    assert not is_attention_failure(in_sdpa, "flex_attention") and not is_attention_failure(in_sdpa, "eager")
    # The kernels package also loads use_kernels layers and quantization kernels: not attention's by itself.
    in_kernels = _raised_in("kernels.layer", "kernelize", ValueError("kernels-community/flash-attn2"))
    assert not is_attention_failure(in_kernels, "kernels-community/flash-attn2")
    # Out of memory inside an attention kernel: the fix is placement, not another option.
    oom = _raised_in("flash_attn.flash_attn_interface", "_flash_attn_forward", torch.OutOfMemoryError("CUDA OOM"))
    assert not is_attention_failure(oom, "flash_attention_2")


def test_text_alone_never_counts() -> None:
    text = f"{NO_KERNEL_IMAGE}: flash_attention_2 kernel attn sdpa attention at /models/{ATTENTION_WORDS}"
    for error in (RuntimeError(text), ImportError(text), ValueError(text), OSError(text)):
        raised = _raised_in("bitsandbytes.functional", "dequantize_4bit", error)
        for option in ("flash_attention_2", "kernels-community/flash-attn2", "sdpa", "flex_attention", "eager"):
            assert not is_attention_failure(raised, option)


def test_the_exceptions_it_was_raised_from_count_unless_suppressed() -> None:
    refused = _raised_in("transformers.modeling_utils", "_check_and_adjust_attn_implementation", ValueError("no"))

    def wrap(suppress: bool, chained: bool) -> BaseException:
        try:
            raise refused
        except ValueError as inner:
            try:
                if suppress:
                    raise RuntimeError("wrapped") from None
                if chained:
                    raise RuntimeError("wrapped") from inner
                raise RuntimeError("wrapped")  # raised while handling: __context__
            except RuntimeError as outer:
                return outer
        raise AssertionError("did not raise")

    assert is_attention_failure(wrap(suppress=False, chained=True), "sdpa")  # __cause__
    assert is_attention_failure(wrap(suppress=False, chained=False), "sdpa")  # __context__
    assert not is_attention_failure(wrap(suppress=True, chained=False), "sdpa")  # from None
