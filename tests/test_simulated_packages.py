"""A simulated machine has this machine's installed packages unless told otherwise, and says so.

`cudaload plan M --finetune --gpu H100 --quantize 4bit` used to fail with "bitsandbytes is not
installed" on a machine where it is installed: the simulation started from torch, transformers and
accelerate only. These tests use the `packages_installed_here` fixture (tests/conftest.py), which
gives simulated machines this machine's packages, as they have outside the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cudaload
from cudaload import Machine, MissingPackageError, SettingError
from cudaload.cli import main


def test_a_simulated_machine_has_the_packages_installed_here(packages_installed_here: dict[str, str]) -> None:
    assert {"bitsandbytes", "kernels", "peft"} <= set(packages_installed_here)  # the tested set installs them
    software = Machine.simulated("H100").software
    assert dict(software.packages) == packages_installed_here
    assert software.assumed == "as installed here"


def test_told_packages_go_on_top_and_none_removes_one(packages_installed_here: dict[str, str]) -> None:
    software = Machine.simulated("H100", packages={"flash-attn": "2.8.3", "bitsandbytes": None}).software
    assert software.version("flash-attn") == "2.8.3" and not software.has("bitsandbytes")
    assert software.version("kernels") == packages_installed_here["kernels"]
    assert software.assumed == "as installed here, with flash-attn 2.8.3, without bitsandbytes"
    bare = Machine.simulated("H100", installed_packages=False).software
    assert dict(bare.packages) == {"torch": "2.13.0", "transformers": "5.22.2", "accelerate": "1.16.0"}
    with pytest.raises(SettingError, match="removes torch or transformers"):
        Machine.simulated("H100", packages={"transformers": None})
    with pytest.raises(SettingError, match="installed_packages="):
        Machine.simulated("H100", installed_packages="no")  # type: ignore[arg-type]


def test_a_qlora_plan_for_a_gpu_you_do_not_have_uses_your_bitsandbytes(
    tiny_models: dict[str, Path], packages_installed_here: dict[str, str]
) -> None:
    path = str(tiny_models["llama"])
    plan = cudaload.plan(path, machine=Machine.simulated("H100"), finetune=True, quantize="4bit")
    assert plan.kwargs["quantization_config"]["load_in_4bit"] is True
    opening = " ".join(" ".join(plan.explain().splitlines()[:4]).split())  # as read, however the path wrapped it
    assert f"bitsandbytes {packages_installed_here['bitsandbytes']}" in opening
    assert plan.to_dict()["assumed_packages"].startswith("as installed here: ")
    without = Machine.simulated("H100", packages={"bitsandbytes": None})
    with pytest.raises(MissingPackageError, match=r"pip install bitsandbytes"):
        cudaload.plan(path, machine=without, finetune=True, quantize="4bit")
    assert cudaload.plan(path).to_dict()["assumed_packages"] is None  # this machine: nothing assumed


def test_the_cli_plans_with_the_packages_here(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str], packages_installed_here: dict[str, str]
) -> None:
    path = str(tiny_models["llama"])
    assert main(["plan", path, "--finetune", "--gpu", "H100", "--quantize", "4bit", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert "bitsandbytes" in planned["assumed_packages"] and planned["kwargs"]["quantization_config"]
    assert main(["plan", path, "--finetune", "--gpu", "H100", "--quantize", "4bit", "--without", "bitsandbytes"]) == 2
    # a simulated machine gets a package with --with (issue 46), not `pip install` here
    assert f"--with bitsandbytes=={packages_installed_here['bitsandbytes']}" in capsys.readouterr().err
    assert main(["plan", path, "--gpu", "H100", "--default-packages", "--with", "peft==0.21.2"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the line as read, whatever the terminal wrapped
    assert (
        "on 1x NVIDIA H100 80GB HBM3 (sm_90) simulated machine's packages, the defaults (torch 2.13.0, transformers "
        "5.22.2, accelerate 1.16.0), with peft 0.21.2: accelerate 1.16.0, peft 0.21.2, torch 2.13.0, transformers "
        "5.22.2 dtype "
    ) in text
