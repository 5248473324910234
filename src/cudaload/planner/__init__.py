"""`plan()`: detect (or take) the machine, read the model's config, run the policy.

One module per job: planning.py (`plan()` itself), arguments.py (its arguments checked into a Request),
gather.py (the facts it gathers: the model's, this machine's measurements, transformers' own placement),
apply_facts.py (what applying the plan needs to know of this process: the loaders probe nothing).
"""

from __future__ import annotations

from ..request import check_count, check_flag
from .arguments import split_overrides
from .gather import SOURCE_KWARGS
from .planning import plan

__all__ = ["SOURCE_KWARGS", "check_count", "check_flag", "plan", "split_overrides"]
