"""The LoRA training the workers share, and what it did to the trainable tensors: a snapshot taken
before training, and after it which tensors training left unchanged and whether every rank holds the
same values.

A check against zero or against initialisation proves nothing (lora_A starts random and non-zero,
lora_B at zero; DDP makes the ranks equal at construction), so each worker compares with its snapshot.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

STEPS = 3


def trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def values(tensor: torch.Tensor) -> torch.Tensor:
    """A detached float32 copy of the whole tensor (an FSDP2 DTensor gathered from every rank)."""
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().float().clone()


def snapshot(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: values(p) for name, p in params.items()}


def unchanged(before: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> list[str]:
    """The tensors whose values training did not move from the snapshot (all of them if no step ran)."""
    assert before.keys() == params.keys(), "the trainable tensors changed between snapshot and check"
    return [name for name, p in params.items() if torch.equal(before[name], values(p))]


def identical_across_ranks(params: dict[str, torch.Tensor]) -> bool:
    """Every rank's trainable tensors, all-gathered: equal to rank 0's, value for value."""
    flat = torch.cat([values(p).flatten() for p in params.values()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def lora_optimizer(params: dict[str, torch.Tensor]) -> torch.optim.AdamW:
    """AdamW without weight decay: decay alone would move the non-zero lora_A, so a change is a gradient step."""
    return torch.optim.AdamW(params.values(), lr=1e-2, weight_decay=0.0)


def train_steps(
    model: Callable[..., object],
    optimizer: torch.optim.Optimizer,
    rank: int,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
) -> list[float]:
    """STEPS causal-LM steps on one batch per rank (the same batch every step, seeded by the rank: the
    ranks see different data, so only gradient averaging makes their adapters agree); the losses."""
    ids = torch.randint(2, 256, (2, 16), generator=torch.Generator().manual_seed(100 + rank))
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def lora_report(before: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> dict[str, object]:
    """What training did to the adapters, for a worker's rank-<N>.json."""
    still = unchanged(before, params)
    return {"lora_tensors": len(params), "lora_unchanged": still, "lora_changed": len(still) < len(params)}
