"""Live set ``gathered`` of the FSDP2 baseline: unsharded parameters, all-gather outputs FSDP2 holds
and the fp32 reduce-scatter inputs, per FSDP unit (``planner/runtime/fsdp2.py``: the embedding,
each layer with its routed experts as a unit of their own, ``[norm, head]``).

Legend: ``Θ_r`` the layer's parameters one rank gathers (dense part over ``tp``, its ``E/ep``
experts), ``Θ_r^d`` its dense part alone (attention, router, shared experts, norms), ``F =
dp_shard·cp`` the dense units' mesh, ``F·tp/ep`` the experts' mesh (replicated over ``tp``), ``[c]`` 1 when ``c`` holds,
``V·H/tp`` the embedding and head units. Counts from the GPU allocator history of ``planner
validate``'s own step (``bench/memory_snapshot.py``, H200, torch 2.11):

    layer params (param dtype)   Θ_r                forward[r], backward[r]: the current layer only
                                                    (``_fsdp_param alloc_storage``: one layer's
                                                    blocks in every layer phase; no forward prefetch)
    backward prefetch            Θ_{r−1}^d·[F>1]    backward[r ≥ 2]: the previous layer's all-gather
                                                    output, issued before its copy-out
                                                    (``_fsdp_collectives allocate``, gpt-oss W32
                                                    backward[2]: 50.8 MiB = its dense part); on a
                                                    one-rank mesh nothing until the copy at its
                                                    pre-backward (``planner.budget.fsdp2_reduce``)
                                 V·H/tp·[F>1]       backward[1]: the embedding's (1104.6 MiB)
    held reduce-scatter input    V·H/tp + H (fp32)  backward[L]: the head's, until the layer's first
                                 Θ^d_{r+1} (fp32)   reduction; backward[r < L]: layer r+1's layer
                                                    unit's (reduce_scatter_max_input_buffers = 1:
                                                    each reduction releases the previous input, and
                                                    the layer unit reduces after its experts;
                                                    DeepSeek-V2-Lite W = 1 backward[1] holds no
                                                    2112 MiB experts' input). The reductions
                                                    themselves: ``planner.budget.fsdp2_reduce``
    head unit (param dtype)      V·H/tp             head (``reshard_after_forward=False``). Its
                                                    forward all-gather output is freed at the root's
                                                    post-forward, before the loss's backward
                                                    (DeepSeek W64 head: one 400 MiB block); the
                                                    chunked head runs inside that forward, so it
                                                    holds it too [F>1] (Qwen3 W8: 2 × 593.5 MiB)

The all-gather outputs FSDP2 holds in the forward (``AllGatherState``, until the next unit's
all-gather, on meshes of more than one rank) and the layer's own gradient reduce-scatter are
sub-steps of the layer (``planner.budget.fsdp2_layer``); the embedding's gradient is a sub-step of
backward[1] there too.
"""

from __future__ import annotations

import numpy as np

from planner.budget import regions
from planner.context.ctx import Ctx
from planner.budget.terms import FWD_BWD, Phase, Term
from planner.units import ceil_div

SOURCE = ("FSDP2 units of planner/runtime/fsdp2.py; GPU allocator history of planner validate's step "
          "(bench/memory_snapshot.py, H200)")


def fsdp_degree(ctx: Ctx):
    """``F = dp_shard·cp``: the dense units' mesh."""
    return np.asarray(ctx.dp_shard) * np.asarray(ctx.cp)


def expert_degree(ctx: Ctx):
    """``F·tp/ep``: the routed experts' mesh (``efsdp·tp``: replicated over ``tp``, sharded over it)."""
    return fsdp_degree(ctx) * np.asarray(ctx.tp) // np.maximum(np.asarray(ctx.ep), 1)


def layer_dense_params(ctx: Ctx, kind: str):
    """``Θ_r^d``: the layer's dense part (attention, router, shared experts, norms) over ``tp``."""
    m = ctx.model
    ffn = regions.moe_region_dense_params(m) if kind == "moe" else regions.dense_region_params(m)
    return ceil_div(regions.attention_region_params(m) + ffn, ctx.tp)


def layer_expert_params(ctx: Ctx, kind: str):
    """The layer's ``E/ep`` routed experts, whole under ``tp`` (0 for a dense layer)."""
    if kind != "moe":
        return 0
    m = ctx.model
    return (m.num_experts // np.asarray(ctx.ep)) * m.expert_params()


def layer_params(ctx: Ctx, kind: str):
    """``Θ_r``: everything one rank gathers for a layer of ``kind``."""
    return regions.layer_params_local(ctx.model, tp=ctx.tp, ep=ctx.ep, moe=kind == "moe")


def head_rs_input(ctx: Ctx):
    """Elements of the ``[norm, head]`` unit's fp32 reduce-scatter input."""
    return ceil_div(ctx.vocab_size * ctx.hidden_size, ctx.tp) + ctx.hidden_size


def prefetch_params(ctx: Ctx, r: int):
    """Elements of the previous unit's all-gather output that backward[r] prefetches: layer
    ``r−1``'s dense part, the embedding's table at ``r = 1``; none on a one-rank mesh (nothing to
    prefetch into: ``planner.budget.fsdp2_reduce``)."""
    F = fsdp_degree(ctx)
    if r == 1:
        return ceil_div(ctx.vocab_size * ctx.hidden_size, ctx.tp) * (F > 1)
    return layer_dense_params(ctx, ctx.regions[r - 2]) * (F > 1)


def prefetch_in_attention(ctx: Ctx):
    """Whether the prefetch is issued inside the layer's attention backward rather than when its
    FFN backward starts: FSDP2 prefetches the unit before the current one in post-forward order,
    and under ``tp > 1`` the QK-norms are FSDP units of their own (``fsdp2_layout.tp_replicated_params``)
    that run before the experts, so the previous layer (or the embedding) waits for their
    pre-backward (Qwen3 W8 tp2 backward[1]: no embedding all-gather output beside the experts'
    backward, ``bench/results/memory_snapshot/fsdp2-qwen3-W8-tp2.json``)."""
    return (np.asarray(ctx.tp) > 1) & bool(ctx.model.qk_norm)


def held_rs_input(ctx: Ctx, r: int):
    """``held(r)``: fp32 elements of the reduce-scatter input FSDP2 still holds when backward[r]
    starts, the last one allocated (``reduce_scatter_max_input_buffers = 1``): the ``[norm, head]``
    unit's at ``r = L``; else layer ``r+1``'s layer unit's, ``Θ^d_{r+1}``, which reduces after that
    layer's experts and so released theirs (DeepSeek-V2-Lite W = 1 backward[1]: no 2112 MiB experts'
    input left, ``bench/results/memory_snapshot/fsdp2-dsv2-W1-selective.json``)."""
    kinds = ctx.regions
    if r == len(kinds):
        return head_rs_input(ctx)
    return layer_dense_params(ctx, kinds[r])


def _hsdp_all_reduce_buffers(ctx: Ctx) -> Term:
    """HSDP (``dp_replicate > 1``) with gradients kept across micro-steps: FSDP2 all-reduces each unit's
    fp32 reduce-scatter output over the replicas and keeps it (``FSDPParamGroup._all_reduce_state``)
    until the backward ends (``finalize_backward``), so that the next unit's reduce-scatter cannot reuse
    the block while the all-reduce runs. With an existing gradient the shard is accumulated into it
    (``+=``) and that buffer is extra: in backward[r] one fp32 shard per unit already reduced, the
    ``[norm, head]`` unit's and every layer ``j > r``'s, as the freed lifetime's gradient shards. With
    the gradients freed the new shard is a view of that buffer, already counted (``persistent``)."""
    from planner.budget.fsdp2_persistent import reduced_shards, unit_shards

    reduced = reduced_shards(ctx, unit_shards(ctx))
    on = (np.asarray(ctx.dp_replicate) > 1) & (ctx.grad_lifetime == "accumulate")

    def at(ph: Phase):
        return reduced[ph.region - 1] * on

    return Term("HSDP all-reduce buffers of the units reduced so far (fp32, accumulate)", "gathered",
                reduced[0] * on, 4,
                "dp_replicate > 1, accumulate: [norm, head] + layers j > r in backward[r] (padded fp32 shards)",
                ("backward",), at=at,
                source=SOURCE + "; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce "
                "(all_reduce_input held) and _fsdp_param_group.py AllReduceState; H200 planner validate of "
                "gpt-oss-20b HSDP 4 × 8 selective accumulate backward[1]: 661.7 MiB above the budget without "
                "it, the head's 276.2 and layer 2's 392.5 MiB (validate_heldout_r4.json)")


def terms(ctx: Ctx) -> list[Term]:
    kinds = ctx.regions
    b = ctx.act_bytes
    F = fsdp_degree(ctx)
    VH_tp = ceil_div(ctx.vocab_size * ctx.hidden_size, ctx.tp)
    theta = {k: layer_params(ctx, k) for k in set(kinds)}

    def params(ph: Phase):
        return theta[ph.region_kind]

    def prefetch(ph: Phase):
        return prefetch_params(ctx, ph.region) * ~prefetch_in_attention(ctx)

    def held_rs(ph: Phase):
        return held_rs_input(ctx, ph.region)

    big = max(theta.values(), key=lambda v: int(np.max(v)))
    return [
        Term("layer params, current layer (param dtype)", "gathered", big, b, "Θ_r", FWD_BWD, at=params,
             source=SOURCE),
        Term("backward prefetch: previous unit's all-gather output", "gathered",
             np.maximum(VH_tp, big), b,
             "backward[r ≥ 2]: Θ_{r−1}^d·[F>1]; backward[1]: V·H/tp·[F>1] (the embedding)",
             ("backward",),
             at=prefetch, source=SOURCE),
        Term("held fp32 reduce-scatter input of the previous unit", "gathered",
             np.maximum(head_rs_input(ctx), big), 4,
             "backward[L]: V·H/tp + H (the head's); backward[r < L]: Θ^d_{r+1} (layer r+1's layer unit, "
             "reduced after its experts)", ("backward",), at=held_rs,
             source=SOURCE),
        _hsdp_all_reduce_buffers(ctx),
        Term("head unit (param dtype)", "gathered", VH_tp, b, "V·H/tp", ("head",), source=SOURCE),
        Term("head all-gather output held (chunked head)", "gathered",
             VH_tp * (F > 1) * (ctx.head == "chunked"), b, "V·H/tp·[F>1] (chunked head)", ("head",),
             source=SOURCE + "; the chunked head computes its gradients inside the root's forward, before "
             "FSDP2 frees the last all-gather output (Qwen3 W8 chunked head: 2 × 593.5 MiB at the norm)"),
    ]
