"""How much repeated timings agree: a speed ratio measured round by round, summarised.

A ratio is `reference seconds / candidate seconds` for one round (> 1: the candidate was faster in
that round). Its summary is the median and the middle half of the rounds (lower to upper quartile,
read off the sorted rounds, so each end is a ratio some round measured): one outlier round moves
neither the median nor, from five rounds on, the ends. The capability layer measures until the
rounds agree (or its budget ends); the policy calls a summary a tie unless its whole middle half
lies beyond `TIE_MARGIN` on one side: rounds on both sides of 1, a median within the margin, or a
median just past it with rounds inside it are all too close to call.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ..frozen import frozen

__all__ = ["TIE_MARGIN", "Spread", "spread"]

TIE_MARGIN = 0.15
"""Ratios within 15% of 1 (0.87x-1.15x) are a tie: within the run-to-run noise of a timing on a
shared CPU, and the probe times only the linear layers, so the whole model's difference (attention
and per-token overhead cost the same in every dtype) is smaller still."""


@frozen
class Spread:
    """Per-round ratios summarised: median, middle half (low-high) and how many rounds."""

    median: float
    low: float
    high: float
    rounds: int

    @property
    def disagrees(self) -> bool:
        """The middle half of the rounds is on both sides of 1: some say faster, some slower."""
        return self.low < 1.0 < self.high

    def tie(self, margin: float = TIE_MARGIN) -> bool:
        """Too close or too noisy to call: the middle half of the rounds is not all faster than
        1 + `margin`, nor all slower than 1 / (1 + `margin`)."""
        return not (self.low > 1 + margin or self.high < 1 / (1 + margin))

    def within(self, margin: float = TIE_MARGIN) -> bool:
        """The median is within `margin` of 1."""
        return abs(math.log(self.median)) < math.log1p(margin)


def spread(ratios: Sequence[float]) -> Spread | None:
    """The summary of per-round ratios; None when there are none, or one is not a positive number."""
    if not ratios or not all(math.isfinite(r) and r > 0 for r in ratios):
        return None
    ordered = sorted(ratios)
    last = len(ordered) - 1
    return Spread(
        median=statistics.median(ordered),
        low=ordered[last // 4],
        high=ordered[-(-3 * last // 4)],
        rounds=len(ordered),
    )
