"""How the model's tokenizer is set up for the plan: its padding side for inference and for training, and the
token it pads with when it has none. `tokenizer_for()` applies these; it decides nothing itself."""

from __future__ import annotations

from ..facts.model import ModelFacts
from ..plans import Decision, GenerationPlan, Rejected, TokenizerPlan

__all__ = ["decide_tokenizer"]


def _inference_side(model: ModelFacts, generation: GenerationPlan | None) -> Decision:
    if generation is not None:  # the generation section decided it (yours, or by the model's layout)
        return generation.decision("generation.padding_side")
    if model.generates:
        return Decision(
            "tokenizer.padding_side",
            "left",
            "a generating model continues from each sequence's last position, so padding must come first "
            "(generate() warns on a right-padded batch, whose shorter rows continue from padding)",
            (Rejected("right", "batched generate() would continue from pad tokens"),),
        )
    return Decision(
        "tokenizer.padding_side",
        None,
        "not a generating model: the tokenizer's own side (absolute position embeddings expect right padding)",
    )


def decide_tokenizer(model: ModelFacts, generation: GenerationPlan | None) -> TokenizerPlan:
    """The tokenizer settings of a plan for `model` (with its generation section, if it has one)."""
    return TokenizerPlan(
        padding_side=_inference_side(model, generation),
        training_padding_side=Decision(
            "tokenizer.training_padding_side",
            "right",
            "training: labels line up with the inputs, and the loss masks the padding at the end",
            (Rejected("left", "shifts every shorter sequence's positions; only generation needs it"),),
        ),
        pad_token=Decision(
            "tokenizer.pad_token",
            "eos",
            "when the tokenizer has no pad token, EOS pads: the embeddings are not resized, and the attention "
            "mask hides the padded positions",
            (Rejected("a new <pad> token", "resizes the embeddings, a new untrained row"),),
        ),
    )
