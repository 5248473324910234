"""The Plan: the single contract between the policy (which decides) and the loaders (which apply).

A Plan holds the exact `from_pretrained` keyword arguments (JSON-ready: dtypes as strings,
quantization as the BitsAndBytesConfig keyword arguments), the attention fallback chain,
and one Decision per setting: its value, why, and what was rejected and why.

One module per part: decision.py (Decision, Rejected and the read-only, JSON-ready values), sections.py
(FinetunePlan, GenerationPlan, TokenizerPlan, ApplyFacts), check_proof.py (CheckProof: a passed test forward's record),
plan.py (Plan).
"""

from __future__ import annotations

from .check_proof import CheckProof
from .decision import (
    SUB_MODEL_ATTENTION,
    VALUE_WIDTH,
    Decision,
    DecisionSource,
    ReadOnlyDict,
    Rejected,
    decision_lines,
    jsonable,
    mutable,
    read_only,
)
from .plan import Plan
from .sections import ApplyFacts, FinetunePlan, GenerationPlan, TokenizerPlan

__all__ = [
    "SUB_MODEL_ATTENTION",
    "VALUE_WIDTH",
    "ApplyFacts",
    "CheckProof",
    "Decision",
    "DecisionSource",
    "FinetunePlan",
    "GenerationPlan",
    "Plan",
    "ReadOnlyDict",
    "Rejected",
    "TokenizerPlan",
    "decision_lines",
    "jsonable",
    "mutable",
    "read_only",
]
