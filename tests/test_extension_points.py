"""Extension points (issue 30 item 4, issue 41 item 4): `Software.at_least` is the one "installed version >= X"
test, a quantization method is one record, an attention backend is one record. A method or backend registered in
its table alone is planned, with no edit elsewhere, and its record registers the rest: a method's package is a
detected package and has an install hint; a backend's run-time modules attribute its failures, and its class
flag is read into the model facts."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import cudaload
from cudaload.capability.software import probe_software
from cudaload.errors import AttentionUnavailableError, MissingPackageError, QuantizationError
from cudaload.facts.machine import Machine, Software
from cudaload.facts.model import ModelFacts
from cudaload.facts.packages import detected_packages, install_hint, packages_here
from cudaload.facts.quant_methods import QUANT_METHODS, QuantMethod, QuantPackage
from cudaload.loaders.attribution import is_attention_failure
from cudaload.plans import Rejected
from cudaload.policy.attention import decide_attention
from cudaload.policy.attention_checks import BACKENDS, AttentionBackend, OptionCheck


def test_at_least_compares_installed_versions_by_pep440() -> None:
    software = Software(packages=(("odd", "not-a-version"), ("torch", "2.8.0"), ("transformers", "5.23.0rc1")))
    assert software.at_least("torch", "2.8")
    assert not software.at_least("torch", "2.9")
    assert not software.at_least("peft", "0")  # not installed
    assert not software.at_least("odd", "0")  # a version that does not parse is never new enough
    # A ".dev0" minimum admits the minor's pre-releases (the rule "release >= (5, 23)" it replaces).
    assert software.at_least("transformers", "5.23.dev0")
    assert not software.at_least("transformers", "5.23.0")


# --- a quantization method is one record ----------------------------------------------------------


def _fake_int8() -> QuantMethod:
    return QuantMethod(
        choice="int8_fake",
        summary="'int8_fake'",
        detail="a made-up int8 method in {dtype}",
        package=QuantPackage("fakequant", "fakequant", "1.0", "finetune"),
        quant_method="fakequant",
        config_class="FakeQuantConfig",
        cpu_since=None,
        bits_per_weight=8,
        row_scale_bytes=0,
        saves_input=False,
        optimizer=("adamw_torch", "the fake method's own optimizer"),
        auto=False,
        build=lambda dtype, shards: {"quant_type": "int8_weight_only", "dtype": dtype},
    )


def test_a_registered_quantization_method_is_planned_with_no_edit_elsewhere(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_int8()
    monkeypatch.setitem(QUANT_METHODS, fake.choice, fake)
    a100 = Machine.simulated("A100", packages={"fakequant": "1.2", "peft": "0.21.2", "bitsandbytes": None})
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=a100, finetune=True, quantize="int8_fake")

    assert plan.decision("quantize").value == "int8_fake"
    assert plan.decision("quantize").reason == "your choice: a made-up int8 method in bfloat16"
    assert plan.kwargs["quantization_config"] == {"quant_type": "int8_weight_only", "dtype": "bfloat16"}
    assert plan.decision("training.optim").value == "adamw_torch"
    # The memory estimate sizes each method from its record: int8 linears, the rest in bf16.
    assert plan.finetune is not None and "int8_fake" in plan.finetune.memory_estimate
    facts = cudaload.read_model_facts(str(tiny_models["qwen3"]))
    expected = facts.linear_parameters + (facts.parameters - facts.linear_parameters) * 2
    assert plan.weight_bytes == expected
    # The loader builds the record's config class from the plan's keyword arguments.
    # (transformers as imported now: a fixture may have dropped the module this file imported)
    monkeypatch.setattr(
        importlib.import_module("transformers"), "FakeQuantConfig", lambda **kw: ("built", kw), raising=False
    )
    built = cudaload.from_pretrained_kwargs(plan)["quantization_config"]
    assert built == ("built", {"quant_type": "int8_weight_only", "dtype": "bfloat16"})
    # A method whose package is missing, or older than its record's minimum, is refused with the install hint
    # its record registered (no INSTALLED_BY line).
    refusals = {
        None: r"fakequant is not installed \(pip install fakequant\)",
        "0.9": r"fakequant 0.9 is older than 1.0, .*\(pip install 'fakequant>=1.0'\)",
    }
    for version, refusal in refusals.items():
        with pytest.raises(MissingPackageError, match=refusal):
            cudaload.plan(
                str(tiny_models["qwen3"]),
                machine=Machine.simulated("A100", packages={"fakequant": version, "peft": "0.21.2"}),
                finetune=True,
                quantize="int8_fake",
            )
    # The CLI offers it.
    assert "int8_fake" in _quantize_choices_of_cli()


def test_a_registered_methods_package_is_detected_and_has_an_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record alone registers its package: detection lists it (detect() and a simulated machine read
    the same list) and install_hint names it, with no line in installed.PACKAGES or facts/packages.py INSTALLED_BY."""
    (tmp_path / "fakequant-1.2.dist-info").mkdir()
    assert "fakequant" not in detected_packages() and "fakequant" not in packages_here(paths=[str(tmp_path)])
    with pytest.raises(KeyError, match="no install hint for 'fakequant'"):
        install_hint("fakequant")
    fake = _fake_int8()
    monkeypatch.setitem(QUANT_METHODS, fake.choice, fake)
    assert "fakequant" in detected_packages()
    assert packages_here(paths=[str(tmp_path)]) == {"fakequant": "1.2"}
    monkeypatch.syspath_prepend(str(tmp_path))
    assert probe_software().version("fakequant") == "1.2"
    assert install_hint("fakequant", fake.package.min_version) == "pip install 'fakequant>=1.0'"


def _quantize_choices_of_cli() -> list[str]:
    from cudaload.cli.parser import build_parser

    plan = next(a for a in build_parser()._actions if a.dest == "command").choices["plan"]  # type: ignore[union-attr]
    return list(next(a for a in plan._actions if a.dest == "quantize").choices)


def test_an_unknown_quantize_lists_the_registered_methods(tiny_models: dict[str, Path]) -> None:
    listed = (
        r"Use '4bit' \(QLoRA\), '8bit', 'torchao-int8' \(torchao int8 weight-only\), None \(no quantization\) or 'auto'"
    )
    with pytest.raises(QuantizationError, match=listed):
        cudaload.plan(str(tiny_models["qwen3"]), machine=Machine.simulated("A100"), finetune=True, quantize="2bit")


# --- an attention backend is one record -----------------------------------------------------------


def _registered(fake: AttentionBackend, before: str) -> Iterator[AttentionBackend]:
    """BACKENDS with `fake` inserted just before the backend named `before`, for as long as the caller yields."""
    saved = dict(BACKENDS)
    BACKENDS.clear()
    for name, backend in saved.items():
        if name == before:
            BACKENDS[fake.name] = fake
        BACKENDS[name] = backend
    try:
        yield fake
    finally:
        BACKENDS.clear()
        BACKENDS.update(saved)


@pytest.fixture
def fake_backend_first() -> Iterator[AttentionBackend]:
    """A made-up backend registered first in BACKENDS (so the automatic chain tries it before SDPA)."""

    def check(machine: Machine, model: ModelFacts, dtype: str) -> OptionCheck:
        blockers = () if machine.gpus else ("fake_attention needs a GPU",)
        return OptionCheck("fake_attention", "a made-up fused kernel", blockers)

    fake = AttentionBackend("fake_attention", check, "always")
    yield from _registered(fake, before="sdpa")


def test_a_registered_attention_backend_is_planned_with_no_edit_elsewhere(
    tiny_models: dict[str, Path], fake_backend_first: AttentionBackend
) -> None:
    path = str(tiny_models["qwen3"])
    t4 = Machine.simulated("T4")  # no FlashAttention on sm75: the named backends decide
    plan = cudaload.plan(path, machine=t4)
    assert plan.attn_implementation == "fake_attention"
    assert plan.decision("attn_implementation").reason == "a made-up fused kernel"
    assert plan.attention_chain[:2] == ("fake_attention", "sdpa")
    # Its own check rejects it where it cannot run, in the trace explain() shows, and an explicit choice is refused.
    cpu = cudaload.plan(path, machine=Machine.simulated(None))
    assert cpu.attn_implementation == "sdpa"
    assert Rejected("fake_attention", "fake_attention needs a GPU") in cpu.decision("attn_implementation").rejected
    # (plan() first asks transformers whether it knows the name: a real backend is registered there.)
    facts = cudaload.read_model_facts(path)
    with pytest.raises(AttentionUnavailableError, match="fake_attention needs a GPU"):
        decide_attention(Machine.simulated(None), facts, "float32", "fake_attention")
    chosen, _, _ = decide_attention(t4, facts, "float16", "fake_attention")
    assert chosen.reason == "your choice (a made-up fused kernel)"


@pytest.fixture
def fake_backend_after_flex() -> Iterator[AttentionBackend]:
    """A made-up backend tried only when the one before it, flex_attention, was rejected."""

    def check(machine: Machine, model: ModelFacts, dtype: str) -> OptionCheck:
        return OptionCheck("fake_attention", "a made-up fallback kernel", ())

    fake = AttentionBackend("fake_attention", check, "if_previous_rejected")
    yield from _registered(fake, before="eager")


@pytest.mark.parametrize(("flex", "tried"), [(True, False), (False, True)])
def test_if_previous_rejected_means_the_backend_just_before(
    fake_backend_after_flex: AttentionBackend, flex: bool, tried: bool
) -> None:
    """`tried="if_previous_rejected"` looks at the backend tried just before it, not the first one: with SDPA
    rejected and flex_attention planned, a backend after flex is not tried; with flex rejected too, it is."""
    from cudaload.facts.model import any_model

    model = replace(any_model(), supports_sdpa=False, supports_flex=flex, supports_flash=False)
    _, chain, _ = decide_attention(Machine.simulated("T4"), model, "float16", None)
    assert ("flex_attention" in chain) is flex
    assert ("fake_attention" in chain) is tried, chain


def _flagged_backend() -> Iterator[AttentionBackend]:
    """A made-up backend that owns a class flag and run-time modules, registered first."""

    def check(machine: Machine, model: ModelFacts, dtype: str) -> OptionCheck:
        supported = model.supports("_supports_fake_attention")
        return OptionCheck("fake_attention", "a made-up kernel", () if supported else ("the class has no flag",))

    fake = AttentionBackend(
        "fake_attention", check, "always", class_flag="_supports_fake_attention", runtime_modules=("fake_kernels",)
    )
    yield from _registered(fake, before="sdpa")


def _raised_in(module: str, error: BaseException) -> BaseException:
    """`error` as raised by a function of `module`, as its traceback then shows it."""
    namespace: dict[str, object] = {"__name__": module, "error": error}
    exec("def forward():\n    raise error\n", namespace)
    try:
        namespace["forward"]()  # type: ignore[operator]
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def test_a_registered_backend_owns_its_class_flag_and_run_time_modules(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registered in BACKENDS alone: its class flag is read into the model facts (and decides its check), and
    an error raised in its run-time modules is its own, so load() would try the next option."""
    crash = _raised_in("fake_kernels.ops", RuntimeError("illegal memory access"))
    assert not is_attention_failure(crash, "fake_attention")  # not registered: not attention's
    from transformers import Qwen3ForCausalLM

    monkeypatch.setattr(Qwen3ForCausalLM, "_supports_fake_attention", True, raising=False)
    registered = _flagged_backend()
    next(registered)
    try:
        # Qwen3's class declares the flag (set above); Llama's does not.
        for name, flag in (("qwen3", True), ("llama", False)):
            facts = cudaload.read_model_facts(str(tiny_models[name]))
            assert facts.class_flags == (("_supports_fake_attention", flag),)
            assert facts.supports("_supports_fake_attention") is flag and facts.supports("_supports_sdpa")
            plan = cudaload.plan(str(tiny_models[name]), machine=Machine.simulated("T4"))
            assert (plan.attn_implementation == "fake_attention") is flag
        assert is_attention_failure(crash, "fake_attention")
        assert not is_attention_failure(crash, "sdpa")
    finally:
        registered.close()
    assert cudaload.read_model_facts(str(tiny_models["qwen3"])).class_flags == ()  # unregistered: no flag read
