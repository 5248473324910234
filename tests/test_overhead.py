"""What cudaload costs before any weight is read: detection and planning stay off torch and
transformers where cached facts answer, and those shortcuts agree with the real imports."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from cudaload.capability.model_config import read_model_facts
from cudaload.installed import PACKAGES, installed_versions


def _fresh_process(code: str, cache: Path) -> dict[str, object]:
    """Run `code` in a new interpreter (no module imported yet); it prints one JSON object."""
    env = {**os.environ, "CUDALOAD_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_installed_versions_agree_with_importlib_metadata() -> None:
    """Folder names give the same versions as parsing every METADATA file, for every installed
    distribution (first on sys.path wins in both)."""
    fast = installed_versions()
    checked = 0
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = name.lower().replace("-", "_").replace(".", "_")
        assert key in fast, name
        assert fast[key] in (None, metadata.version(name)), name
        checked += 1
    assert checked > 20  # torch, transformers and their dependencies at least
    assert fast.get("transformers") == metadata.version("transformers")
    assert all(fast.get(p.replace("-", "_").lower()) is None for p in PACKAGES if p.startswith("flash-attn"))


def test_installed_versions_reads_dist_and_egg_info(tmp_path: Path) -> None:
    (tmp_path / "Some.Package-1.2.3.dist-info").mkdir()
    (tmp_path / "other_pkg-0.5-py3.11.egg-info").mkdir()
    (tmp_path / "develop_pkg.egg-info").mkdir()
    later = tmp_path / "later"
    later.mkdir()
    (later / "some_package-9.9.dist-info").mkdir()
    found = installed_versions([str(tmp_path), str(later), str(tmp_path / "missing")])
    assert found == {"some_package": "1.2.3", "other_pkg": "0.5", "develop_pkg": None}


def test_installed_versions_lists_a_folder_again_only_when_it_changed(tmp_path: Path, monkeypatch) -> None:
    """A load asks for the installed versions four times: an unchanged folder is listed once, one a distribution
    was installed into since is listed again, and one changed just before its listing is listed every time (a
    second change in the same tick of the file system's clock keeps its stamp)."""
    from cudaload import installed

    site = tmp_path / "site"
    site.mkdir()
    (site / "pkg_a-1.0.dist-info").mkdir()
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(installed.os, "listdir", lambda path: listed.append(path) or real(path))
    paths = [str(site)]
    assert installed_versions(paths) == {"pkg_a": "1.0"}
    assert installed_versions(paths) == {"pkg_a": "1.0"}
    assert len(listed) == 2  # just changed: not trusted
    os.utime(site, ns=(0, 10**18))  # changed long ago (2001)
    assert installed_versions(paths) == installed_versions(paths) == {"pkg_a": "1.0"}
    assert len(listed) == 3
    (site / "pkg_b-2.0.dist-info").mkdir()  # installed since: the folder's stamp moved
    assert installed_versions(paths) == {"pkg_a": "1.0", "pkg_b": "2.0"}
    assert len(listed) == 4


def test_detect_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    out = _fresh_process(
        """
        import json, sys
        import cudaload
        machine = cudaload.detect()
        print(json.dumps({
            "heavy": sorted(m for m in ("torch", "transformers", "huggingface_hub") if m in sys.modules),
            "kernels_range": machine.software.kernels_range,
            "transformers": machine.software.version("transformers"),
        }))
        """,
        tmp_path,
    )
    import transformers
    from transformers.utils import import_utils

    assert out["heavy"] == []
    # Read as text, the same range the imported module holds.
    assert out["kernels_range"] == [import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION]
    assert out["transformers"] == transformers.__version__


@pytest.mark.slow
def test_a_planned_model_is_planned_again_without_torch(tiny_models, tmp_path: Path) -> None:
    """The second plan() of a local model, in a new process, reads cached facts: no torch, no
    transformers, and the same facts and plan as a fresh read through the real import."""
    model = tmp_path / "model"
    shutil.copytree(tiny_models["llama"], model)
    code = f"""
        import json, sys
        from dataclasses import asdict
        import cudaload
        from cudaload.capability.model_config import read_model_facts
        plan = cudaload.plan({str(model)!r}, probe=False)
        facts = read_model_facts({str(model)!r})
        print(json.dumps({{
            "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules),
            "plan": plan.to_dict(),
            "facts": asdict(facts),
        }}))
        """
    first = _fresh_process(code, tmp_path / "cache")
    second = _fresh_process(code, tmp_path / "cache")
    assert "torch" in first["heavy"]  # the first read builds the meta model
    assert second["heavy"] == []
    assert second["plan"] == first["plan"]
    assert second["facts"] == first["facts"]
    assert list((tmp_path / "cache" / "model-facts").glob("*.json"))


TRAINING_POLICY = (
    "cudaload.policy.finetune_section",
    "cudaload.policy.parallelism",
    "cudaload.policy.rank_sizing",
    "cudaload.policy.node_memory",
    "cudaload.policy.engine_arguments",
    "cudaload.policy.training",
    "cudaload.facts.interconnect",
)
"""The fine-tuning and distributed policy: an inference plan has no use for it (issue 50: importing it was a quarter
of the CPU a first load() spent in cudaload's imports)."""


def test_an_inference_plan_imports_none_of_the_training_policy(tiny_models, tmp_path: Path) -> None:
    """plan() and load() pay for the modules they use: the training policy is imported by a fine-tuning plan only,
    which still plans with it (its parallelism and TrainingArguments present)."""
    code = f"""
        import json, sys
        import cudaload
        training = {list(TRAINING_POLICY)!r}
        inference = cudaload.plan({str(tiny_models["llama"])!r}, probe=False, generate=None)
        before = sorted(m for m in training if m in sys.modules)
        finetune = cudaload.plan({str(tiny_models["llama"])!r}, probe=False, finetune=True)
        print(json.dumps({{
            "inference": before,
            "finetune": sorted(m for m in training if m in sys.modules),
            "training_arguments": sorted(finetune.finetune.training_arguments),
            "inference_finetune": inference.finetune is None,
        }}))
        """
    out = _fresh_process(code, tmp_path / "cache")
    assert out["inference"] == []
    assert out["inference_finetune"] is True
    assert out["finetune"] == sorted(TRAINING_POLICY)
    assert {"bf16", "optim", "use_cpu"} <= set(out["training_arguments"])


def test_load_reads_no_tokenizer_module_and_tokenizer_for_does(tiny_models, tmp_path: Path) -> None:
    """load() resolves the transformers names it uses, not AutoTokenizer's tokenization modules (~7 ms of CPU in a
    fresh process); tokenizer_for() resolves them when first called."""
    code = f"""
        import json, sys
        import cudaload
        model = cudaload.load({str(tiny_models["llama"])!r}, dtype="float32", verify=False)
        loaded = "transformers.models.auto.tokenization_auto" in sys.modules
        tokenizer = cudaload.tokenizer_for(model)
        from transformers import PreTrainedTokenizerBase
        print(json.dumps({{"after_load": loaded, "tokenizer": isinstance(tokenizer, PreTrainedTokenizerBase),
                           "after_tokenizer": "transformers.models.auto.tokenization_auto" in sys.modules}}))
        """
    out = _fresh_process(code, tmp_path / "cache")
    assert out["after_load"] is False
    assert out["after_tokenizer"] is True
    assert out["tokenizer"] is True


def test_cached_facts_follow_the_config_and_the_weights(tiny_models, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_models["qwen3"], folder)  # bf16 weights
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (folder / "config.json").write_text(json.dumps(config))
    fresh = read_model_facts(str(folder))
    assert read_model_facts(str(folder)) == fresh  # from the cache, field for field (tuples too)
    assert fresh.checkpoint_dtype == "bfloat16"

    # New weights under the same config.json: the dtype is re-read from their header.
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))  # save_pretrained wrote a dtype: take it out
    assert read_model_facts(str(folder)) == replace(fresh, checkpoint_dtype="float16")

    # A changed config.json is another model.
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    wider = read_model_facts(str(folder))
    assert wider.intermediate_size == 2 * config["intermediate_size"]
    assert wider.parameters > fresh.parameters


def test_a_corrupt_facts_cache_is_read_again(tiny_models, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    folder = str(tiny_models["gpt2"])
    fresh = read_model_facts(folder)
    (cached,) = (tmp_path / "cache" / "model-facts").glob("*.json")
    cached.write_text('{"schema": 1, "facts": {"model_type": "gpt2"}}')
    assert read_model_facts(folder) == fresh
    assert json.loads(cached.read_text())["facts"]["parameters"] == fresh.parameters  # rewritten


LAZY_ON_A_PROVEN_LOAD = {
    "cudaload.facts.catalog": "simulated",
    "cudaload.facts.simulated": "simulated",
    "cudaload.facts.platform": "simulated",  # the GPU vendors' records: a machine with no GPU asks none
    "cudaload.facts.platform_cuda": "simulated",
    "cudaload.facts.platforms": "simulated",
    "cudaload.capability.visible": "gpu_found",
    "cudaload.capability.dtype_timing": "measured",
    "cudaload.capability.probe_confidence": "measured",
    "cudaload.capability.lock_file": "measured",
    "cudaload.capability.config_facts": "facts_read",
    "cudaload.capability.config_file": "facts_read",
    "cudaload.capability.model_class": "facts_read",
    "cudaload.capability.kv_layout": "facts_read",
    "cudaload.capability.per_layer": "facts_read",
    "cudaload.capability.hub_access": "facts_read",
    "cudaload.loaders.verify": "verified",
    "cudaload.loaders.attribution": "failed",
    "cudaload.policy.checkpoint_quantization": "quantized",
    "cudaload.policy.checkpoint_rocm": "quantized",
    "cudaload.policy.quantization": "quantized",
    "cudaload.plans.checkpoint": "quantized",
    "cudaload.capability.kernel_variants": "kernel_cached",
    "cudaload.capability.variant_names": "kernel_cached",
}
"""Modules a load() of a proven checkpoint has no use for (issue 50: a fresh process's load() paid ~1 ms of CPU for
each, most of it their dataclasses), and the step that imports each: a simulated machine (the GPU catalog), a probe
that found a GPU (its raw records), a dtype measurement, the facts of a model not in the facts cache, a test
forward, a failed one, the plan of a pre-quantized checkpoint, a Hub kernel in the cache (its build variants)."""


def test_a_proven_load_imports_none_of_what_it_does_not_use(tiny_models, tmp_path: Path, monkeypatch) -> None:
    """A fresh process's load() of a checkpoint whose test forward an earlier process proved imports none of
    LAZY_ON_A_PROVEN_LOAD; each is imported by the step that uses it, which still works."""
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.delenv("CUDALOAD_VERIFY", raising=False)  # the conftest's "full": here the proof is what is tested
    model = tmp_path / "model"
    shutil.copytree(tiny_models["llama"], model)
    broken = tmp_path / "nan"
    nan = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        for parameter in nan.parameters():
            parameter.fill_(float("nan"))
    nan.save_pretrained(broken)
    proved = _fresh_process(
        f"""
        import json, cudaload
        print(json.dumps({{"verified": cudaload.load({str(model)!r}).cudaload_plan.verified}}))
        """,
        tmp_path / "cache",
    )
    out = _fresh_process(
        f"""
        import json, sys
        from dataclasses import replace
        import cudaload
        lazy = {LAZY_ON_A_PROVEN_LOAD!r}
        steps, seen = {{}}, {{}}
        def step(name):
            seen[name] = sorted(m for m, s in lazy.items() if s == name and m in sys.modules)
        loaded = cudaload.load({str(model)!r})
        proven = bool(loaded.cudaload_plan.check_proven)
        after_load = sorted(m for m in lazy if m in sys.modules)
        steps["simulated"] = cudaload.Machine.simulated("T4").gpus[0].sm
        step("simulated")

        class Found:  # a probe that answered (with no device): its records are read as visible GPUs
            name = "nvml"
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                return None
            def devices(self):
                return []
            def driver_version(self):
                return None

        from cudaload.capability.gpus import probe_gpus
        steps["gpu_found"] = probe_gpus({{}}, (Found,)).source
        step("gpu_found")
        from cudaload.capability.dtype_probe import dtype_probe_for
        steps["measured"] = dtype_probe_for(cudaload.detect(), (16, 16), model="16x16")[0].in_features  # no record
        step("measured")
        facts = cudaload.read_model_facts({str(model)!r}, auto_class="AutoModel")  # not in the facts cache
        steps["facts_read"] = facts.model_class
        step("facts_read")
        steps["verified"] = cudaload.load({str(model)!r}, verify="full").cudaload_plan.verified
        step("verified")
        try:
            cudaload.load({str(broken)!r})
        except cudaload.LoadFailedError as exc:
            steps["failed"] = "non-finite" in str(exc)
        step("failed")
        from cudaload.facts.stored_weights import CheckpointQuantization
        stored = CheckpointQuantization("bitsandbytes", "bitsandbytes 8-bit", 8.0, quantized_parameters=10)
        quantized = replace(facts, quantized="bitsandbytes", quantization=stored)
        steps["quantized"] = cudaload.plan(quantized, probe=False).decision("checkpoint_quantization").setting
        step("quantized")
        from pathlib import Path
        from cudaload.capability.software import find_cached_kernel
        kernels = Path({str(tmp_path / "kernels")!r})
        build = kernels / "kernels--org--attn" / "snapshots" / "abc123" / "build" / "torch-universal"
        build.mkdir(parents=True)
        (kernels / "kernels--org--attn" / "refs").mkdir()
        (kernels / "kernels--org--attn" / "refs" / "v1").write_text("abc123")
        steps["kernel_cached"] = find_cached_kernel(kernels, "org/attn", 1, "2.13.0", None).cached_variant
        step("kernel_cached")
        print(json.dumps({{"proven": proven, "after_load": after_load, "steps": steps, "seen": seen}}))
        """,
        tmp_path / "cache",
    )
    assert proved["verified"] is True
    assert out["proven"] is True  # the path measured: the test forward skipped on the earlier process's proof
    assert out["after_load"] == []
    for name in set(LAZY_ON_A_PROVEN_LOAD.values()):
        assert out["seen"][name] == sorted(m for m, s in LAZY_ON_A_PROVEN_LOAD.items() if s == name), name
    assert out["steps"] == {
        "simulated": "sm_75",
        "gpu_found": "nvml",
        "measured": 16,
        "facts_read": "LlamaModel",
        "verified": True,
        "failed": True,
        "quantized": "checkpoint_quantization",
        "kernel_cached": "torch-universal",
    }
