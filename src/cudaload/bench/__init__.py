"""`cudaload bench`: cudaload's plan measured against every alternative on this machine.

- `inference`: the plan against every dtype x attention variant and a bare `from_pretrained`,
  load / prefill / decode / end to end / peak memory (`harness` measures, `results` compares,
  `report` prints, `chart` draws; `models` picks the checkpoint);
- `finetune`: 16-bit LoRA against QLoRA, step time and peak memory beside the plan's estimate;
- `overhead`: what cudaload itself costs, in fresh processes;
- `environment`: the machine facts and versions each result records, and where results go.
"""

from __future__ import annotations

from .chart import write_chart
from .environment import machine_slug, result_path
from .inference import run_bench, write_result
from .report import format_report

__all__ = ["format_report", "machine_slug", "result_path", "run_bench", "write_chart", "write_result"]
