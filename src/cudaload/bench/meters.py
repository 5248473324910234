"""What a benchmark round is timed and sized with: its clock, the decode steps' stamps, its peak memory.

The clock is wall seconds (`time.perf_counter`), except on a CPU whose cores are taken: a default bench then
measures on one torch thread (`contention.bench_threads`) and times its rounds in this process's CPU seconds
(`time.process_time`), as the plan's dtype probe times one thread in CPU time. Wall seconds there are mostly
the waits for a core: at load 4-7 on the 2-core Zen 4 one bfloat16 prefill of SmolLM2 took 0.44-1.15 s wall
in three rounds of one run, and variants loading the same bytes differed by 1.35x in load time, so the
verdict (`bench.verdict`) of a busy run named whichever variant waited least; the CPU seconds one thread spends
are the work itself, which is what the quiet machine's wall time measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

__all__ = ["CPU_CLOCK", "WALL_CLOCK", "PeakMemory", "StepClock", "round_clock"]

WALL_CLOCK = "wall seconds (time.perf_counter)"
CPU_CLOCK = "CPU seconds of this process (time.process_time): one torch thread, the cores busy"


def round_clock(cpu: bool) -> tuple[Callable[[], float], str]:
    """The clock a round is timed with (`cpu`: the process's CPU seconds, else wall seconds), and its name."""
    return (time.process_time, CPU_CLOCK) if cpu else (time.perf_counter, WALL_CLOCK)


class StepClock:
    """A logits processor that only notes when each generated token's logits were ready.

    `generate` calls it once per new token: the first call follows the prefill, the later ones
    each follow one decode step, so (N-1) steps / (last - first stamp) is the pure decode rate.
    """

    def __init__(self, sync: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.sync, self.clock = sync, clock
        self.stamps: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.sync()
        self.stamps.append(self.clock())
        return scores


class _Measured(Protocol):
    """What `PeakMemory.watch` reads and fills: a load variant or a generation variant."""

    weights_bytes: int | None
    peak_bytes: int | None


class PeakMemory:
    """Peak memory of one round. CUDA: max_memory_allocated above what was allocated before the
    round (the other resident variants), plus this variant's weights. CPU: the growth of the
    process's peak RSS (VmHWM, reset through /proc/self/clear_refs) over the RSS before the round,
    plus the weights; memory the allocator kept from earlier rounds and reuses is not growth, so
    on CPU this is a lower bound."""

    def __init__(self, torch: Any, on_cuda: bool) -> None:
        self.torch, self.on_cuda = torch, on_cuda
        self.method = (
            "weights + torch.cuda.max_memory_allocated() growth during prefill + generate()"
            if on_cuda
            else "weights + growth of the process's peak RSS (VmHWM) during prefill + generate() (a lower bound)"
        )
        self.available = on_cuda or self._cpu_reset()

    @staticmethod
    def _status(key: str) -> int | None:
        try:
            for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    @staticmethod
    def _cpu_reset() -> bool:
        try:
            Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")
        except OSError:
            return False
        return True

    @contextmanager
    def watch(self, variant: _Measured) -> Iterator[None]:
        if not self.available:
            yield
            return
        if self.on_cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            before = int(self.torch.cuda.memory_allocated())
        else:
            self._cpu_reset()
            before = self._status("VmRSS") or 0
        yield
        if self.on_cuda:
            grown = int(self.torch.cuda.max_memory_allocated()) - before
        else:
            grown = (self._status("VmHWM") or before) - before
        peak = (variant.weights_bytes or 0) + max(grown, 0)
        variant.peak_bytes = max(variant.peak_bytes or 0, peak)
