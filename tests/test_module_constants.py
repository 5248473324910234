"""torch's build versions and transformers' kernels range: the loaded module's values when the process imported it
(load() in a fresh process: read for free), else its source text (detect() without torch: nothing imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from cudaload.capability import software, xpu_mps
from cudaload.capability.module_constants import (
    TorchBuilds,
    module_constants,
    torch_builds,
    transformers_kernels_range,
)
from cudaload.capability.software import probe_software


def _module(name: str, **values: object) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(values)
    return module


def test_the_loaded_modules_and_their_source_files_give_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers.utils import import_utils

    loaded = (torch_builds(), transformers_kernels_range())
    assert loaded == (
        TorchBuilds(torch.version.cuda, torch.version.hip, torch.version.xpu),
        (import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION),
    )
    monkeypatch.delitem(sys.modules, "torch.version")
    monkeypatch.delitem(sys.modules, "transformers.utils.import_utils")
    assert (torch_builds(), transformers_kernels_range()) == loaded  # now read from the files


def test_a_loaded_module_wins_over_its_file_and_nothing_is_imported(tmp_path: Path) -> None:
    """Modules that say otherwise than the installed files, put in sys.modules of a process that has imported neither
    torch nor transformers: their values are the ones read, and torch and transformers stay unimported."""
    code = """
        import json, sys, types
        for name, values in {
            "torch.version": {"cuda": "12.8", "hip": None, "xpu": "2025.1"},
            "transformers.utils.import_utils": {"KERNELS_MIN_VERSION": "9.1", "KERNELS_MAX_VERSION": "9.2"},
        }.items():
            sys.modules[name] = types.ModuleType(name)
            vars(sys.modules[name]).update(values)
        from cudaload.capability import rocm, software, xpu_mps
        found = software.probe_software()
        print(json.dumps({
            "builds": [found.torch_cuda, found.torch_hip, found.torch_xpu],
            "kernels_range": found.kernels_range,
            "public": [software.torch_hip_version(), xpu_mps.torch_xpu_version()],
            "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules),
        }))
        """
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {
        "builds": ["12.8", None, "2025.1"],
        "kernels_range": ["9.1", "9.2"],
        "public": [None, "2025.1"],
        "heavy": [],
    }


def test_without_torch_loaded_its_version_file_is_read_once_for_the_three(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch.version", raising=False)
    reads: list[str] = []
    read_text = Path.read_text

    def counted(path: Path, *args: object, **kwargs: object) -> str:
        reads.append(path.as_posix())
        return read_text(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counted)
    probe_software()
    assert len([p for p in reads if p.endswith("torch/version.py")]) == 1  # before: 3 (cuda, hip, xpu)


def test_a_module_not_loaded_or_lacking_a_name_is_read_from_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fake_torch_build"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "version.py").write_text(
        "from typing import Optional\n"
        "cuda: Optional[str] = '12.8'\n"
        "hip: Optional[str] = None\n"
        'xpu = "2025.1"\n'
        "cuda = '11.0'  # a later assignment: the first one is read\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("cuda", "hip", "xpu")
    from_file = {"cuda": "12.8", "hip": None, "xpu": "2025.1"}
    assert module_constants("fake_torch_build.version", names) == from_file
    monkeypatch.setitem(sys.modules, "fake_torch_build.version", _module("v", cuda="13.0", xpu=None))  # no hip
    assert module_constants("fake_torch_build.version", names) == from_file
    monkeypatch.setitem(sys.modules, "fake_torch_build.version", _module("v", cuda="13.0", hip="", xpu=None))
    assert module_constants("fake_torch_build.version", names) == {"cuda": "13.0", "hip": None, "xpu": None}
    assert "fake_torch_build" not in sys.modules
    assert module_constants("no_such_package_here.version", names) == dict.fromkeys(names)


def test_the_public_names_read_the_loaded_module(monkeypatch: pytest.MonkeyPatch) -> None:
    rocm_torch = _module("torch.version", cuda=None, hip="6.4.43484", xpu="2025.1")
    monkeypatch.setitem(sys.modules, "torch.version", rocm_torch)
    assert (software.torch_hip_version(), xpu_mps.torch_xpu_version()) == ("6.4.43484", "2025.1")
    assert probe_software().torch_hip == "6.4.43484"
