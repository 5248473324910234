"""The tokenizer's setup is decided by the policy (policy/tokenizer.py) and carried on the Plan; tokenizer_for()
only applies it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import cudaload
from cudaload import Machine
from cudaload.plans import Decision, TokenizerPlan
from cudaload.policy import Request, decide_plan
from cudaload.request import TrainingRequest
from model_shapes import llama


def test_the_policy_decides_the_tokenizer_setup() -> None:
    a100 = Machine.simulated("A100")
    inference = decide_plan(a100, llama(1), Request()).tokenizer
    assert inference is not None and (inference.side(False), inference.side(True)) == ("left", "right")
    assert inference.pad_token.value == "eos" and inference.training_padding_side.reason.startswith("training")
    training = decide_plan(a100, llama(1), Request(training=TrainingRequest(quantize=None))).tokenizer
    assert training is not None and training.side(True) == "right"
    encoder = replace(llama(1), auto_class="AutoModel", model_class="LlamaModel", generation=None)
    assert decide_plan(a100, encoder, Request()).tokenizer.side(False) is None  # type: ignore[union-attr]


def test_tokenizer_for_applies_the_plans_decision(tiny_models: dict[str, Path]) -> None:
    planned = cudaload.plan(str(tiny_models["qwen3"]), dtype="float32")
    assert planned.tokenizer is not None and planned.generation is None
    assert cudaload.tokenizer_for(planned).padding_side == "left"
    # What the plan says is applied, for inference and for training: the tokenizer decides nothing itself.
    right, left = Decision("tokenizer.padding_side", "right", "test"), Decision("x", "left", "test")
    told = replace(planned, tokenizer=TokenizerPlan(right, left, planned.tokenizer.pad_token))
    assert cudaload.tokenizer_for(told).padding_side == "right"
    assert cudaload.tokenizer_for(told, training=True).padding_side == "left"
    assert cudaload.tokenizer_for(told, padding_side="left").padding_side == "left"  # yours win
    # With a generation section its padding decision is the tokenizer's (yours, here).
    generating = cudaload.plan(str(tiny_models["qwen3"]), generate=True, padding_side="right")
    assert generating.tokenizer is not None and generating.tokenizer.padding_side.source == "user"
    assert cudaload.tokenizer_for(generating).padding_side == "right"
