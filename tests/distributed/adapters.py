"""The trainable (LoRA) tensors of a worker's model, by name: a snapshot taken before training, and
after it which tensors training left unchanged and whether every rank holds the same values.

A check against zero or against initialisation proves nothing (lora_A starts random and non-zero,
lora_B at zero; DDP makes the ranks equal at construction), so each worker compares with its snapshot.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


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
