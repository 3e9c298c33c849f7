"""Initialisation of the composed stack's shards: random on the device, or copied from the full
state dict of an unsharded ``Decoder`` (tests compare the composed step with that reference).

Legend: a parameter is a DTensor (FSDP2: this rank holds ``torch.chunk(full, W)[rank]``), an expert
shard (``full[first : first + E/E_p]``), a vocabulary shard (``full[vocab_start : +V_r]``), or
whole.
"""

from __future__ import annotations

import torch

from planner.runtime import shim
from planner.runtime.model_layers import init_normal

SHARD_SEED_STRIDE = 1_000_003
"""Seed offset between expert / vocabulary shards (replicas of one shard share the seed)."""


@torch.no_grad()
def init_composed(model, groups, seed: int) -> None:
    """Dense shards from ``seed + rank``; each expert / vocabulary shard from a seed of its own."""
    torch.manual_seed(seed + groups.rank)
    model.init_weights()
    e_rank = shim.group_rank(groups.expert)
    for i, b in enumerate(model.layers):
        if b.is_moe:
            torch.manual_seed(seed + SHARD_SEED_STRIDE * (1 + e_rank) + i)
            from planner.runtime.moe_block import init_expert_shard
            init_expert_shard(b.ffn.experts.shard)
    head = model.head
    if head is not None and hasattr(head, "vocab_start") and not hasattr(head.weight, "to_local"):
        torch.manual_seed(seed + SHARD_SEED_STRIDE * 7919 + head.vocab_start)
        init_normal(head.weight, head.weight.shape[1] ** -0.5)


@torch.no_grad()
def load_full_state(model, full: dict, groups) -> None:
    """Copy this rank's part of every parameter out of the unsharded state dict ``full``."""
    import torch.distributed as dist

    W, rank = dist.get_world_size(), dist.get_rank()
    for name, p in model.named_parameters():
        src = full[name].to(p.device, p.dtype)
        if hasattr(p, "to_local"):
            chunks = torch.chunk(src, W, dim=0)
            t = p.to_local()
            if t.numel():
                t.copy_(chunks[rank])
        elif name.endswith(("w_up_nHJ", "w_down_nIH")):
            first = _owner(model, name).first_expert
            p.copy_(src[first:first + p.shape[0]])
        elif name.startswith("head.") and hasattr(model.head, "vocab_start"):
            p.copy_(src[model.head.vocab_start:model.head.vocab_start + p.shape[0]])
        else:
            p.copy_(src)


def _owner(model, name: str):
    mod = model
    for part in name.split(".")[:-1]:
        mod = getattr(mod, part) if not part.isdigit() else mod[int(part)]
    return mod
