"""Live set ``persistent``: weights, gradients and optimizer state that stay on the device.

Composed stack (DESIGN §2–§3.2), counted by owner:

    dense weights + grads   2·b · Θ_dense / W        ZeRO-3 over all W ranks
    expert weights + grads  2·b · Θ_exp / E_p        whole per expert shard, no gather
    head weight + grad      2·b · ceil(V/P)·H        whole per vocabulary shard (P > 1);
                                                     with P = 1 the head is ZeRO-3 (in Θ_dense/W)
    fp32 master, m, v       12 · Θ / W               sharded over W through the replicas;
                                                     on the host under cpu_offload/stream_offload

At ``b = 2`` and ``E_p = P = W`` this is ``16Θ/W`` (``4Θ/W`` with offload).

Gradient lifetime (``Ctx.grad_lifetime``): ``accumulate`` (gradients kept across micro-steps, the
default and the conservative one) keeps every gradient resident in every phase. ``freed``
(``zero_grad(set_to_none=True)`` between steps) means a gradient first exists when its owner's
backward produces it: the head's and the final norm's after the head phase's peak (counted from
``backward[L_b]``), region ``j``'s in
``backward[j]`` (so ``backward[r]`` holds the regions ``j ≥ r``; under LLEP and standard EP region
``r``'s own expert gradients are the grouped MLP's, which ``dispatch`` counts from when they are
made: ``dispatch_edges``), the embedding's in its own
backward after region 1's (``gathered``'s embedding sub-step counts it); none in ``forward[r]``.

FSDP2 baseline: ``planner.budget.fsdp2_persistent`` (per-unit padded shards, gradient lifetime).
"""

from __future__ import annotations

import numpy as np

from planner.budget import regions as reg
from planner.budget.dispatch_edges import books_own_grads
from planner.context.ctx import Ctx
from planner.budget.terms import ALWAYS, Phase, Term
from planner.units import ceil_div

SOURCE = "DESIGN §3.2 Persistent"
GRAD_PHASES = ("backward", "optimizer")
"""Where gradients exist when they are freed between steps: the head's is made at the end of the
head's backward, after the phase's peak (the H200 allocator history of ``planner validate``: no
head gradient at the head phase's peak, gpt-oss-W8's 138.1 MiB Ring-DTP shard, ring_dtp.py:101,
from backward[4] on; Qwen3-W1's 593.5 MiB ZeRO-3 one likewise)."""


def _region_grads(ctx: Ctx) -> tuple[list[int], list[int]]:
    """Dense and expert parameters of each checkpointed region (forward order)."""
    m = ctx.model
    dense, experts = [], []
    for kind in ctx.regions:
        if kind == "attention":
            dense.append(reg.attention_region_params(m)); experts.append(0)
        elif kind == "moe":
            dense.append(reg.moe_region_dense_params(m)); experts.append(m.num_experts * m.expert_params())
        else:
            dense.append(reg.dense_region_params(m)); experts.append(0)
    return dense, experts


def _grad_at(full, per_region: list[int], before_regions, div, after_regions=0, own: bool = True):
    """``phase -> count`` of a gradient that grows through the backward (``freed`` lifetime):
    ``before_regions`` (head, final norm) from ``backward[L_b]`` on, plus regions ``j ≥ r`` in
    ``backward[r]`` (``j > r`` when not ``own``: a dense unit's reduced shard exists only after its
    region's backward, whose unreduced gradients ``gathered`` counts), everything in ``optimizer``;
    ``div`` shards it. ``after_regions`` (the embedding's shard) first exists in the embedding's
    backward, after region 1's: counted there by ``gathered``'s embedding sub-step, not in
    ``backward[1]``."""
    tail = np.cumsum(per_region[::-1])[::-1].tolist() + [0]  # tail[r-1] = Σ_{j≥r}
    if not own:
        tail = tail[1:] + [0]                                  # tail[r-1] = Σ_{j>r}

    def at(ph: Phase):
        if ph.kind == "optimizer":
            return full
        if ph.kind == "backward" and ph.region == 1:
            return np.maximum(full - after_regions, 0)
        return np.minimum(full, ceil_div(before_regions + tail[ph.region - 1], div))
    return at


def embedding_grad_shard(ctx: Ctx):
    """Elements of this rank's embedding-gradient shard, ``ceil(V·H/W)`` (untied embeddings; tied
    ones are the head's, which exists from ``backward[L_b]`` on): with ``freed`` gradients it first exists in
    the embedding's backward, after region 1's (H200 allocator history, gpt-oss-W8 backward[1]:
    the 1104.6 MiB table re-gathered, no embedding gradient at the region's peak)."""
    if ctx.model.tie_embeddings or ctx.grad_lifetime != "freed":
        return 0
    return ceil_div(ctx.vocab_size * ctx.hidden_size, ctx.world_size)


def terms(ctx: Ctx) -> list[Term]:
    """Persistent terms of one rank (resident in every phase)."""
    p = ctx.params
    W, b = ctx.world_size, ctx.act_bytes
    if ctx.stack == "fsdp2":
        from planner.budget import fsdp2_persistent

        return fsdp2_persistent.terms(ctx)
    P = np.asarray(ctx.vocab_parallel)
    sharded_head = ctx.vocab != "dense"
    head = p["head"]
    # P = 1 (or a dense head): the head is a ZeRO-3-sharded dense weight.
    head_in_dense = np.where(sharded_head & (P > 1), 0, head) if sharded_head else head
    head_whole = np.where(P > 1, ceil_div(ctx.vocab_size, P) * ctx.hidden_size, 0) if sharded_head else 0
    dense = ceil_div(p["dense"] + head_in_dense, W)
    experts = ceil_div(p["experts"], ctx.expert_parallel) if p["experts"] else 0
    freed = ctx.grad_lifetime == "freed"
    gph = GRAD_PHASES if freed else ALWAYS
    grad_at = dict(dense=None, experts=None)
    grad_txt = ""
    if freed:
        d_reg, e_reg = _region_grads(ctx)
        grad_at["dense"] = _grad_at(dense, d_reg, head_in_dense + ctx.hidden_size + p["mtp"], W,
                                    embedding_grad_shard(ctx), own=False)
        # LLEP and standard EP: the region's own expert gradients are the grouped MLP's stacked
        # gradients, counted by dispatch from its backward on (dispatch_edges.books_own_grads)
        own = not books_own_grads(ctx)
        grad_at["experts"] = _grad_at(experts, e_reg, 0, ctx.expert_parallel, own=own)
        grad_txt = ("; freed: head + final norm from backward[L_b], regions j > r (dense) / j "
                    + ("≥" if own else ">") + " r (experts" + ("" if own else "; region r's own: in dispatch")
                    + ") in backward[r], all but the embedding's at backward[1]")
    out = [
        Term("dense weights (ZeRO-3 shard)", "persistent", dense, b, "(Θ_dense [+ Θ_head if P=1])/W",
             ALWAYS, source=SOURCE),
        Term("dense grads (ZeRO-3 shard)", "persistent", dense, b, "(Θ_dense [+ Θ_head if P=1])/W" + grad_txt,
             gph, at=grad_at["dense"], source=SOURCE),
    ]
    if p["experts"]:
        out += [
            Term("expert weights (whole per shard)", "persistent", experts, b, "Θ_exp/E_p", ALWAYS,
                 source=SOURCE),
            Term("expert grads (whole per shard)", "persistent", experts, b, "Θ_exp/E_p" + grad_txt,
                 gph, at=grad_at["experts"], source=SOURCE),
        ]
    if sharded_head:
        out += [
            Term("head weight (vocab shard)", "persistent", head_whole, b, "ceil(V/P)·H if P>1", ALWAYS,
                 source=SOURCE),
            Term("head grad (vocab shard)", "persistent", head_whole, b, "ceil(V/P)·H if P>1"
                 + ("; freed: from backward[L_b] on" if freed else ""), gph, source=SOURCE),
        ]
    if ctx.optimizer == "gpu":
        state = ceil_div(p["dense"] + head, W) + ceil_div(p["experts"], W)
        out.append(Term("fp32 master, m, v", "persistent", state, 12, "Θ/W (4+4+4 B)", ALWAYS,
                        source=SOURCE))
    return out
