"""Training-memory estimates for LoRA / QLoRA: weights + LoRA (weights, grads, optimizer state) +
activations (checkpointed layer inputs, one layer's saved tensors, the loss's logits) + overhead; and for
full training (`estimate_full_training_memory`): weights + every weight's gradient + AdamW's state +
activations + overhead.

Rough by design: the question is "does 16-bit LoRA fit, or is 4-bit needed?", not a byte-exact
forecast. Every term is derived from the code that allocates it (the versions tested here:
transformers 5.22.2, peft 0.21.2, bitsandbytes 0.50.2, torch 2.13; paths relative to
site-packages) and was checked on CPU by measuring peak RSS (cudaload.bench.finetune_bench).
Notation: s·b = tokens per step, h = hidden size, V = vocabulary, d = bytes per element of the
plan's dtype (2 in bf16/fp16, 4 in fp32).

weights
    16-bit: parameters x d. 4-bit (nf4, double quantization, QLoRA): linear layers at
    4 + 8/64 + 32/(64·256) = 4.127 bits (blocks of 64: bitsandbytes 0.50.2 nn/modules.py: Params4bit.__new__;
    their absmax re-quantized to uint8 in blocks of 256 with an fp32 scale each:
    bitsandbytes 0.50.2 functional.py: quantize_4bit), the rest (embeddings, lm_head, norms) in d.
    8-bit (LLM.int8): one int8 per weight plus one fp32 scale per output row
    (`CB, SCB`: bitsandbytes 0.50.2 nn/modules.py: Int8Params._quantize).
lora
    r·(fan_in + fan_out) parameters per wrapped layer, kept in fp32 (`autocast_adapter_dtype=True` in
    peft 0.21.2 mapping_func.py: get_peft_model; peft 0.21.2 tuners/tuners_utils.py: cast_adapter_dtype
    upcasts bf16/fp16 adapters to fp32): 4 bytes of weight + 4 of gradient + the optimizer's state. AdamW in
    torch (adamw_torch, adamw_torch_fused): exp_avg + exp_avg_sq in fp32, 8 bytes.
    paged_adamw_8bit (QLoRA on CUDA; transformers 5.22-5.25 trainer_optimizer.py: _get_bitsandbytes_optimizer
    builds bitsandbytes' AdamW with optim_bits=8, is_paged=True):
    bitsandbytes 0.50.2 optim/optimizer.py: Optimizer2State.init_state keeps two uint8 states (2 bytes) plus an
    fp32 absmax per block of 256 for each (8/256 bytes), so 2.03125 bytes per parameter; a tensor under
    `min_8bit_size` = 4096 elements (bitsandbytes 0.50.2 optim/adamw.py: AdamW.__init__) keeps fp32 states
    (8 bytes). The two 256-entry quantization maps are shared by all parameters (`name2qmap`). Paged states
    (>= 1e5 elements, bitsandbytes 0.50.2 optim/optimizer.py: Optimizer8bit.get_state_buffer) are CUDA unified
    memory: resident on the GPU unless evicted, so counted.
activations
    The logits, for the loss (see `logits_bytes_per_element`): 12·s·b·V bytes in every dtype,
    usually the largest single term for models with big vocabularies.
    Each decoder layer's saved tensors (see `layer_bytes_per_token`): for a Llama-style layer
    8h + 4·d·q + 3·d·I + (m + d)·(sum of the LoRA-wrapped layers' fan_in), ~66·h bytes
    per token for Llama-3-8B in bf16 with LoRA on every projection (Korthikanti et al. 2022
    count 34·h for a GPT layer with trained weights; frozen LoRA bases save less in the
    linear layers, but each adapter saves its own dropped-out copy of its input).
    With gradient checkpointing (non-reentrant) each layer keeps only its input (d·h per token)
    and one layer is recomputed at a time during the backward, after the logits' buffers are
    freed: kept + max(one layer, logits). Without it every layer's saved tensors stay until the
    backward reaches them: layers x layer + logits.
full training
    Every weight trained in the dtype it is loaded in: its gradient (`param.grad`) has the parameter's dtype,
    and torch's AdamW keeps exp_avg and exp_avg_sq as `torch.zeros_like(p)`, in the parameter's dtype too
    (torch 2.13 optim/adam.py: Adam._init_group; AdamW subclasses Adam), plus a 0-d fp32 `step` per tensor
    (not counted). A model loaded in bf16 holds 2 (weight) + 2 (gradient) + 4 (moments) = 8 bytes a parameter,
    in fp32 4 + 4 + 8 = 16. Each trained linear layer also saves its input for its weight's gradient: the
    norms' outputs (shared by q/k/v and by gate/up), the attention output and the MLP product (d x (2h + q + I)
    per token in a Llama-style layer), as LLM.int8's MatMul8bitLt does for a frozen one.
overhead
    1 GiB on a GPU (CUDA context and allocator slack); nothing on CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..facts.dtypes import BYTES
from ..facts.model import ModelFacts
from ..facts.quant_methods import CHECKPOINT_OPTIMIZER, QUANT_METHODS
from ..frozen import frozen

if TYPE_CHECKING:  # a quantized checkpoint's plan: the annotation only
    from ..plans.checkpoint import CheckpointPlan

__all__ = [
    "TrainingMemory",
    "adamw_state_bytes",
    "estimate_full_training_memory",
    "estimate_training_memory",
    "layer_bytes_per_token",
    "logits_bytes_per_element",
    "lora_estimates",
    "lora_parameters",
    "lora_tensor_bytes",
    "planned_optimizer",
    "quantized_optimizer",
    "weight_bytes",
]

CUDA_OVERHEAD = 1 << 30  # CUDA context + allocator slack
FP32 = 4
# bitsandbytes 8-bit optimizers (bitsandbytes 0.50.2 optim/optimizer.py: Optimizer2State.init_state and
# bitsandbytes 0.50.2 optim/adamw.py: AdamW.__init__).
BNB_MIN_8BIT_SIZE = 4096
BNB_STATE_BLOCK = 256
LLAMA_STYLE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def weight_bytes(model: ModelFacts, dtype: str, quantize: str | None, *, dequantized_to: str | None = None) -> int:
    """Bytes of the base weights: linear layers at 4 or 8 bits when quantized, the rest in dtype.

    An already-quantized checkpoint (`model.quantization`, with `quantize` None or "checkpoint") has
    its quantized weights at the bits it stores them in, as transformers' `param_element_size` sizes
    them (transformers 5.22-5.25 quantizers/base.py: HfQuantizer.param_element_size), or in `dequantized_to`
    when transformers dequantizes them on this machine (policy/checkpoint_quantization.py,
    `decide_checkpoint_quantization`); the rest in dtype.
    """
    checkpoint = model.quantization
    if checkpoint is not None and quantize in (None, "checkpoint"):
        rest = (model.parameters - checkpoint.quantized_parameters) * BYTES[dtype]
        if dequantized_to is not None:
            return checkpoint.quantized_parameters * BYTES[dequantized_to] + rest
        if checkpoint.bits is not None:
            return checkpoint.stored_bytes() + rest
    if quantize is None or quantize == "checkpoint":
        return model.parameters * BYTES[dtype]
    # A method's linear weights at its bits and per-row scales (facts/quant_methods.py), the rest in dtype.
    method = QUANT_METHODS[quantize]
    linear = model.linear_parameters
    rest = (model.parameters - linear) * BYTES[dtype]
    rows = sum(fan_out * count for _, _, fan_out, count in model.linear_shapes) if method.row_scale_bytes else 0
    return int(linear * method.bits_per_weight / 8) + method.row_scale_bytes * rows + rest


def adapted_shapes(model: ModelFacts, targets: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """(in_features, out_features, how many) of each layer LoRA adapts: the linear layers named, and the
    output layer (hidden -> vocabulary) when `lm_head` is."""
    shapes = [(fan_in, fan_out, count) for name, fan_in, fan_out, count in model.linear_shapes if name in targets]
    if "lm_head" in targets and model.hidden_size and model.vocab_size:
        shapes.append((model.hidden_size, model.vocab_size, 1))
    return shapes


def lora_parameters(model: ModelFacts, r: int, targets: tuple[str, ...]) -> int:
    return sum(r * (fan_in + fan_out) * count for fan_in, fan_out, count in adapted_shapes(model, targets))


def planned_optimizer(quantize: str | None, on_gpu: bool) -> str:
    """The `optim` the plan's TrainingArguments choose (policy/finetune.py, decide_training_arguments)."""
    if not on_gpu:
        return "adamw_torch_fused"  # torch >= 2.8 (training.py); before it "adamw_torch": the same 8 bytes of state
    return quantized_optimizer(quantize)[0] if quantize is not None else "adamw_torch_fused"


def quantized_optimizer(quantize: str) -> tuple[str, str]:
    """(optim, why) on a GPU for a quantized base: its method's, or a quantized checkpoint's ("checkpoint")."""
    method = QUANT_METHODS.get(quantize)
    return method.optimizer if method is not None else CHECKPOINT_OPTIMIZER


def lora_tensor_bytes(numel: int, optim: str) -> int:
    """Bytes for one trainable fp32 LoRA tensor: weight + gradient + the optimizer's state."""
    weight_and_grad = 2 * FP32 * numel
    if optim.endswith("8bit") and numel >= BNB_MIN_8BIT_SIZE:
        blocks = -(-numel // BNB_STATE_BLOCK)
        return weight_and_grad + 2 * numel + 2 * FP32 * blocks  # two uint8 states + two fp32 absmax per block
    return weight_and_grad + 2 * FP32 * numel  # exp_avg + exp_avg_sq in fp32


def logits_bytes_per_element(dtype: str, *, outputs_kept: bool = False, softcapped: bool = False) -> int:
    """Peak bytes per logit (per token x vocabulary entry) of the causal-LM loss and its backward.

    The model computes logits for every position in training (`logits_to_keep=0`:
    transformers 5.22-5.25 models/qwen3/modeling_qwen3.py: Qwen3ForCausalLM.forward; the same in
    5.22-5.25 models/llama/modeling_llama.py: LlamaForCausalLM.forward): one tensor of s·b x V in the dtype
    (d bytes). `ForCausalLMLoss` (transformers 5.22-5.25 loss/loss_utils.py: ForCausalLMLoss) upcasts it with
    `logits.float()` (a new fp32 tensor when d < 4, the same tensor in fp32), shifts the labels rather than the
    logits (`nn.functional.pad(labels, ...)`: no copy), and calls `cross_entropy`
    (5.22-5.25 loss/loss_utils.py: fixed_cross_entropy), which is log_softmax (an fp32 output, saved for the
    backward) + nll_loss. The upcast copy is saved by nothing (a dtype cast saves
    no tensor), so it dies with the loss function.

    forward peak  = d (logits) + 4 (fp32 copy, when d < 4) + 4 (log-probs) = 10 in bf16, 8 in fp32
    backward peak = 4 (saved log-probs) + 4 (nll_loss's gradient, dense) + 4 (log_softmax's
                    gradient, the fp32 logits' gradient) = 12; cast back to d only after the
                    log-probs and their gradient are freed.

    `Trainer.compute_loss` drops the model's outputs (and so the logits) before the backward
    (transformers 5.22-5.25 trainer.py: Trainer.compute_loss and Trainer.training_step), so the peak is 12
    bytes in every dtype. A loop that keeps `outputs` alive through `backward()` holds the d-byte logits too:
    `outputs_kept=True` -> 12 + d. Measured on CPU (peak RSS growth per extra logit, vocabulary
    64000 vs 32000 at 512 tokens): bf16 10.0 forward / 12.0 backward / 14.0 with the outputs kept;
    fp32 8.0 / 12.0 / 16.0.

    `softcapped`: the model caps its logits (`final_logit_softcapping`, Gemma 2: modeling_gemma2.py
    `logits = logits / cap; logits = torch.tanh(logits); logits = logits * cap`). `tanh` saves its output
    (d bytes a logit) for the backward, and it lives until the backward reaches it, after the loss's:
    +d at both peaks. Measured on CPU with a tiny Gemma2 in bf16 (autograd saved-tensor hooks, tensors
    of s x V): 4.0 bytes saved a logit plain, 6.0 with final_logit_softcapping=30.
    """
    d = BYTES[dtype]
    capped = d if softcapped else 0
    forward = d + (FP32 if d < FP32 else 0) + FP32 + capped
    backward = 3 * FP32 + (d if outputs_kept else 0) + capped
    return max(forward, backward)


def layer_bytes_per_token(
    model: ModelFacts,
    dtype: str,
    quantize: str | None,
    targets: tuple[str, ...],
    on_gpu: bool,
    *,
    trained: bool = False,
) -> int:
    """Bytes one decoder layer saves for the backward, per token (frozen base, LoRA on `targets`).

    Frozen base linears save no activation (torch saves the input of a matmul only for the
    weight's gradient; bitsandbytes' MatMul4Bit saves only the weight,
    bitsandbytes 0.50.2 autograd/_functions.py: MatMul4Bit.forward), except LLM.int8, which saves its input
    (bitsandbytes 0.50.2 autograd/_functions.py: MatMul8bitLt.forward). Llama-style layer
    (transformers/models/qwen3/modeling_qwen3.py, modeling_llama.py), with q = attention width, I = MLP width:

    - two RMSNorms save the fp32 upcast of their input
      (transformers 5.22-5.25 models/qwen3/modeling_qwen3.py: Qwen3RMSNorm.forward): 2 x 4h;
    - fused attention (SDPA / flash) saves q, k, v and its output: d·4q, with k and v repeated to
      every head as transformers does when a padding mask is passed
      (transformers 5.22-5.25 integrations/sdpa_attention.py: use_gqa_in_sdpa, then repeat_kv;
      without a mask GQA keeps them narrower);
    - the SwiGLU MLP (transformers 5.22-5.25 models/qwen3/modeling_qwen3.py: Qwen3MLP.forward) saves act_fn's
      input and both operands of the product: 3·d·I;
    - each LoRA adapter (peft 0.21.2 tuners/lora/layer.py: Linear.forward, `lora_B(lora_A(dropout(x)))` with x
      cast to the fp32 adapter dtype) saves its dropout mask (bool on CUDA: 1 byte; on CPU torch's
      dropout saves a float noise tensor: 4 bytes) and the input of lora_A (d: autocast casts it to
      the compute dtype; fp32 without autocast): (m + d) x fan_in per adapter. The plan's default
      lora_dropout is 0.05; with 0 there is no mask and no copy in 16-bit.

    `trained`: full training, every linear layer's weight gets a gradient, so each saves its input.

    Other layer shapes fall back to Korthikanti et al. 2022 (34·h bytes in 16-bit, scaled by d/2)
    plus the adapters' inputs. Not counted: Qwen3's q/k norms (4 x (q + kv), ~4% of a layer),
    the rotary cos/sin and softmax statistics (per token, not per channel).
    """
    hidden = model.hidden_size or 0
    layers = model.num_layers or 0
    if not layers or not hidden:
        return 0
    d = BYTES[dtype]
    mask = 1 if on_gpu else FP32
    adapters = sum(fan_in * count for name, fan_in, _, count in model.linear_shapes if name in targets)
    lora = (mask + d) * adapters // layers
    shapes = {name: (fan_in, fan_out) for name, fan_in, fan_out, _ in model.linear_shapes}
    if not all(name in shapes for name in LLAMA_STYLE):
        return 17 * hidden * d + lora
    attention = shapes["o_proj"][0]
    inter = shapes["up_proj"][1]
    base = 2 * FP32 * hidden + 4 * d * attention + 3 * d * inter
    method = QUANT_METHODS.get(quantize or "")
    if trained or (method is not None and method.saves_input):
        # A matmul that saves its input (a trained weight's, or MatMul8bitLt's): the norms' outputs (shared by
        # q/k/v and by gate/up), the attention output and the MLP product.
        base += d * (2 * hidden + attention + inter)
    return base + lora


def _step_activations(model: ModelFacts, dtype: str, layer: int, tokens: int, checkpointing: bool) -> int:
    """A step's activation peak from one layer's saved bytes (`layer`, for `tokens` tokens) and the loss's logits."""
    layers = model.num_layers or 0
    logits = logits_bytes_per_element(dtype, softcapped=bool(model.final_softcap)) * tokens * (model.vocab_size or 0)
    if checkpointing:
        # Non-reentrant checkpointing keeps each layer's input; the backward frees the logits'
        # buffers (lm_head and the loss come first) before it recomputes the last layer.
        kept = layers * tokens * (model.hidden_size or 0) * BYTES[dtype]
        return kept + max(layer, logits)
    return layers * layer + logits


@frozen
class TrainingMemory:
    """A fine-tuning run's peak memory estimate on one device, term by term, in bytes."""

    weights: int
    lora: int
    """LoRA weights and gradients (fp32) and the optimizer's state: 16 bytes per parameter with
    AdamW in fp32, ~10 with paged 8-bit AdamW. 0 in full training."""
    activations: int
    overhead: int
    gradients: int = 0
    """Full training: every weight's gradient, in the weights' dtype (0 for LoRA, counted in `lora`)."""
    optimizer: int = 0
    """Full training: AdamW's two moments for every weight, in the weights' dtype (`adamw_state_bytes`)."""
    full: bool = False
    """Full training (every weight trained): `as_dict` shows gradients and optimizer instead of lora."""

    @property
    def total(self) -> int:
        return self.weights + self.lora + self.gradients + self.optimizer + self.activations + self.overhead

    def as_dict(self) -> dict[str, int]:
        trained = {"gradients": self.gradients, "optimizer": self.optimizer} if self.full else {"lora": self.lora}
        return {
            "weights": self.weights,
            **trained,
            "activations": self.activations,
            "overhead": self.overhead,
            "total": self.total,
        }


def estimate_training_memory(
    model: ModelFacts,
    *,
    dtype: str,
    quantize: str | None,
    r: int,
    targets: tuple[str, ...],
    seq_len: int = 2048,
    batch: int = 1,
    checkpointing: bool = True,
    on_gpu: bool = True,
    optim: str | None = None,
    dequantized_to: str | None = None,
) -> TrainingMemory:
    """Peak training memory of one LoRA step. `optim` is TrainingArguments' optimizer name; None
    means the one the plan chooses (`planned_optimizer`)."""
    optim = optim or planned_optimizer(quantize, on_gpu)
    tokens = seq_len * batch
    layer = layer_bytes_per_token(model, dtype, quantize, targets, on_gpu) * tokens
    activations = _step_activations(model, dtype, layer, tokens, checkpointing)
    lora = sum(
        (lora_tensor_bytes(r * fan_in, optim) + lora_tensor_bytes(r * fan_out, optim)) * count
        for fan_in, fan_out, count in adapted_shapes(model, targets)
    )
    return TrainingMemory(
        weights=weight_bytes(model, dtype, quantize, dequantized_to=dequantized_to),
        lora=int(lora),
        activations=activations,
        overhead=CUDA_OVERHEAD if on_gpu else 0,
    )


def lora_estimates(
    model: ModelFacts,
    *,
    dtype: str,
    r: int,
    targets: tuple[str, ...],
    seq_len: int,
    batch: int,
    checkpointing: bool,
    on_gpu: bool,
    checkpoint: CheckpointPlan | None,
) -> dict[str | None, TrainingMemory]:
    """LoRA's estimate for each quantization option a plan weighs (None: 16-bit). A quantized checkpoint is
    trained as stored ("checkpoint") or dequantized (None), never requantized."""
    dequantized_to = checkpoint.dequantized_to if checkpoint is not None else None
    options = (None, *QUANT_METHODS) if checkpoint is None else (None if dequantized_to else "checkpoint",)
    return {
        q: estimate_training_memory(
            model,
            dtype=dtype,
            quantize=q,
            r=r,
            targets=targets,
            seq_len=seq_len,
            batch=batch,
            checkpointing=checkpointing,
            on_gpu=on_gpu,
            dequantized_to=dequantized_to,
        )
        for q in options
    }


def adamw_state_bytes(parameters: int, dtype: str) -> int:
    """torch AdamW's exp_avg + exp_avg_sq for `parameters` weights held in `dtype`: `torch.zeros_like(p)` keeps
    the parameter's dtype (torch 2.13 optim/adam.py: Adam._init_group), so 2 x 2 bytes a bf16 weight."""
    return 2 * parameters * BYTES[dtype]


def estimate_full_training_memory(
    model: ModelFacts,
    *,
    dtype: str,
    seq_len: int = 2048,
    batch: int = 1,
    checkpointing: bool = True,
    on_gpu: bool = True,
    dequantized_to: str | None = None,
) -> TrainingMemory:
    """Peak memory of one full-training step (every weight trained in `dtype`, torch AdamW): the weights, a
    gradient per weight in `dtype`, AdamW's two moments in `dtype`, the activations of trained layers (each
    linear saves its input) and the device's overhead."""
    tokens = seq_len * batch
    layer = layer_bytes_per_token(model, dtype, None, (), on_gpu, trained=True) * tokens
    return TrainingMemory(
        weights=weight_bytes(model, dtype, None, dequantized_to=dequantized_to),
        lora=0,
        activations=_step_activations(model, dtype, layer, tokens, checkpointing),
        overhead=CUDA_OVERHEAD if on_gpu else 0,
        gradients=model.parameters * BYTES[dtype],
        optimizer=adamw_state_bytes(model.parameters, dtype),
        full=True,
    )
