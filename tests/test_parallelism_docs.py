"""docs/distributed.md's parallelism table is what the code gives (tools/parallelism_table.py), and the CLI
plans a job's parallelism and writes its launch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from cudaload.cli import main

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("parallelism_table", ROOT / "tools" / "parallelism_table.py")
assert _spec is not None and _spec.loader is not None
table_tool: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table_tool)


def test_the_docs_table_is_generated_from_the_code() -> None:
    page = (ROOT / "docs" / "distributed.md").read_text()
    assert table_tool.table() in page, "docs/distributed.md is stale: run python tools/parallelism_table.py"
    assert table_tool.worked() in page, "docs/distributed.md's worked example is stale: run the same tool"
    rows = [line for line in table_tool.rows()[2:]]
    assert len(rows) == 12  # 7B, 70B, 405B on 1x8, 2x8, 16x8 H100 and 4x8 A100-40GB
    assert any("| 70B | 2x8 H100, infiniband-ndr | none | `fsdp-hybrid` |" in row for row in rows)


def test_cli_plan_decides_the_parallelism(llama70b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(llama70b), "--finetune", "--gpu", "H100", "--count", "8", "--nodes", "2", "--json"]
    assert main([*argv, "--interconnect", "infiniband-ndr"]) == 0
    plan = json.loads(capsys.readouterr().out)
    decision = next(d for d in plan["decisions"] if d["setting"] == "parallelism")
    assert decision["value"] == "fsdp-hybrid"
    assert plan["extras"]["parallelism"]["interconnect"] == "infiniband-ndr"
    with pytest.raises(SystemExit):  # --nodes alone plans each rank's inference (issue 46); a link is training's
        main(["plan", str(llama70b), "--gpu", "H100", "--nodes", "2", "--interconnect", "infiniband-ndr"])
    assert "--interconnect describes a fine-tuning plan: add --finetune" in capsys.readouterr().err


def test_cli_launch_writes_the_files(llama70b: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "launch"
    argv = ["launch", str(llama70b), "--gpu", "H100", "--count", "8", "--nodes", "2", "--out", str(out)]
    assert main([*argv, "--emit", "accelerate", "--emit", "slurm"]) == 0
    assert capsys.readouterr().out.startswith("fsdp-hybrid: wrote ")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["accelerate-config.yaml", "accelerate-launch.sh", "cudaload-launch.json", "launch.sbatch"]
    manifest = json.loads((out / "cudaload-launch.json").read_text())
    assert manifest["nodes"] == 2 and manifest["interconnect"] is None  # the default link, not given


def test_the_worked_example_beside_the_engines_own_figures() -> None:
    """70B full training on 2 x 8 H100: each ZeRO stage's model states (weights + gradients + optimizer + DeepSpeed's
    fp32 gradient partition and ZeRO-3's gathered largest layer) equal DeepSpeed's estimator as the page writes it."""
    text = "\n".join(table_tool.worked_rows())
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines() if line.startswith("| `")}
    assert set(rows) >= {"ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero3-offload"}
    assert "Chosen: `deepspeed-zero3-offload`" in text  # nothing lighter fits 72 GiB a rank
    assert "2P + 18P/N = 205.3 GiB" in rows["deepspeed-zero2"] and "16P/N = 65.7 GiB" in rows["fsdp"]
    assert rows["deepspeed-zero3-offload"].count("788.5 GiB") == 2  # cudaload's CPU a node = DeepSpeed's figure
