"""A load failure falls back along the attention chain only when attention caused it, judged by
where it was raised (transformers' attention dispatch, the attention packages), not by its text."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import transformers

import cudaload
from cudaload import LoadFailedError, Machine
from cudaload.loaders import _attention_related


@pytest.fixture
def from_pretrained_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count AutoModelForCausalLM.from_pretrained calls (each one reads the weights)."""
    calls: list[str] = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        calls.append(kwargs.get("attn_implementation"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    return calls


def test_a_missing_weights_file_under_a_flash_kernel_path_is_not_an_attention_failure(
    tiny_models, tmp_path: Path, from_pretrained_calls
) -> None:
    folder = tmp_path / "flash_attention_kernel_attn"  # every word the old text match looked for
    folder.mkdir()
    shutil.copy(tiny_models["llama"] / "config.json", folder / "config.json")
    plan = cudaload.plan(str(folder), machine=Machine.simulated(), dtype="float32")
    assert plan.attention_chain == ("sdpa", "eager")
    with pytest.raises(LoadFailedError, match="a file the model needs is missing"):
        cudaload.load(plan)
    assert from_pretrained_calls == ["sdpa"]  # tried once, not again with eager


def test_no_kernel_image_from_outside_attention_does_not_fall_back(tiny_models, monkeypatch) -> None:
    # bitsandbytes (or any CUDA extension) built for another GPU says "no kernel image is available":
    # not attention's fault, and another attention option would read the weights again for nothing.
    calls: list[str] = []

    def quantizer_failure(cls, *args, **kwargs):
        calls.append(kwargs.get("attn_implementation"))
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(quantizer_failure))
    plan = cudaload.plan(str(tiny_models["llama"]), machine=Machine.simulated(), dtype="float32")
    with pytest.raises(LoadFailedError, match="no kernel image"):
        cudaload.load(plan)
    assert calls == ["sdpa"]


def test_transformers_refusing_flash_attention_falls_back(tiny_models, from_pretrained_calls) -> None:
    # A plan made for an A100 with flash-attn, applied here (no flash_attn, no GPU): transformers'
    # attention check raises, which is attention's failure, and sdpa takes over.
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    model = cudaload.load(str(tiny_models["llama"]), machine=a100, device_map="cpu", dtype="bfloat16")
    assert [f.option for f in model.cudaload_plan.fallbacks] == ["flash_attention_2"]
    # Refused at load (a second from_pretrained with sdpa) or, once an earlier failed Hub-kernel
    # fetch in this process half-registered it, at the test forward (switched in place).
    assert from_pretrained_calls[0] == "flash_attention_2"
    assert model.config._attn_implementation == "sdpa"


def test_attribution_reads_the_frames_of_the_whole_chain() -> None:
    def dispatch() -> None:
        raise ImportError("flash_attn is not installed")

    # A function of transformers' attention dispatch, by name and module, as the traceback shows it.
    namespace = {"__name__": "transformers.modeling_utils", "raise_it": dispatch}
    exec("def _flash_attn_can_dispatch():\n    raise_it()\n", namespace)
    try:
        namespace["_flash_attn_can_dispatch"]()
    except ImportError as exc:
        assert _attention_related(exc)
        try:
            raise ValueError("wrapped") from exc
        except ValueError as outer:
            assert _attention_related(outer)  # found through __cause__
    try:
        dispatch()  # the same error raised elsewhere
    except ImportError as exc:
        assert not _attention_related(exc)
