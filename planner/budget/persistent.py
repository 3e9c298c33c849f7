"""Live set ``persistent``: weights, gradients and optimizer state that stay on the device.

Composed stack (DESIGN §2–§3.2), counted by owner:

    dense weights + grads   2·b · Θ_dense / W        ZeRO-3 over all W ranks
    expert weights + grads  2·b · Θ_exp / E_p        whole per expert shard, no gather
    head weight + grad      2·b · ceil(V/P)·H        whole per vocabulary shard (P > 1);
                                                     with P = 1 the head is ZeRO-3 (in Θ_dense/W)
    fp32 master, m, v       12 · Θ / W               sharded over W through the replicas;
                                                     on the host under cpu_offload/stream_offload

At ``b = 2`` and ``E_p = P = W`` this is ``16Θ/W`` (``4Θ/W`` with offload).

FSDP2 baseline (DESIGN §2): sharded fp32 parameters and fp32 gradients (4 + 4 B) plus AdamW m, v
(8 B), all over W; everything on the host with ``CPUOffloadPolicy``.
"""

from __future__ import annotations

import numpy as np

from planner.budget.context import Ctx
from planner.budget.terms import ALWAYS, Term
from planner.units import ceil_div

SOURCE = "DESIGN §3.2 Persistent"


def terms(ctx: Ctx) -> list[Term]:
    """Persistent terms of one rank (resident in every phase)."""
    p = ctx.params
    W, b = ctx.world_size, ctx.act_bytes
    if ctx.stack == "fsdp2":
        if ctx.cpu_offload:
            return []
        n = ceil_div(p["total"], W)
        return [
            Term("fp32 parameter shards", "persistent", n, 4, "Θ/W", ALWAYS, source=SOURCE),
            Term("fp32 gradient shards", "persistent", n, 4, "Θ/W", ALWAYS, source=SOURCE),
            Term("AdamW m, v", "persistent", n, 8, "Θ/W (m, v: 4+4 B)", ALWAYS, source=SOURCE),
        ]
    P = np.asarray(ctx.vocab_parallel)
    sharded_head = ctx.vocab != "dense"
    head = p["head"]
    # P = 1 (or a dense head): the head is a ZeRO-3-sharded dense weight.
    head_in_dense = np.where(sharded_head & (P > 1), 0, head) if sharded_head else head
    head_whole = np.where(P > 1, ceil_div(ctx.vocab_size, P) * ctx.hidden_size, 0) if sharded_head else 0
    dense = ceil_div(p["dense"] + head_in_dense, W)
    experts = ceil_div(p["experts"], ctx.expert_parallel) if p["experts"] else 0
    out = [
        Term("dense weights (ZeRO-3 shard)", "persistent", dense, b, "(Θ_dense [+ Θ_head if P=1])/W",
             ALWAYS, source=SOURCE),
        Term("dense grads (ZeRO-3 shard)", "persistent", dense, b, "(Θ_dense [+ Θ_head if P=1])/W",
             ALWAYS, source=SOURCE),
    ]
    if p["experts"]:
        out += [
            Term("expert weights (whole per shard)", "persistent", experts, b, "Θ_exp/E_p", ALWAYS,
                 source=SOURCE),
            Term("expert grads (whole per shard)", "persistent", experts, b, "Θ_exp/E_p", ALWAYS,
                 source=SOURCE),
        ]
    if sharded_head:
        out += [
            Term("head weight (vocab shard)", "persistent", head_whole, b, "ceil(V/P)·H if P>1", ALWAYS,
                 source=SOURCE),
            Term("head grad (vocab shard)", "persistent", head_whole, b, "ceil(V/P)·H if P>1", ALWAYS,
                 source=SOURCE),
        ]
    if ctx.optimizer == "gpu":
        state = ceil_div(p["dense"] + head, W) + ceil_div(p["experts"], W)
        out.append(Term("fp32 master, m, v", "persistent", state, 12, "Θ/W (4+4+4 B)", ALWAYS,
                        source=SOURCE))
    return out
