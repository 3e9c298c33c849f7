"""Live set ``gathered``: ZeRO-3 / FSDP2 all-gathered weights and unreduced gradients (DESIGN §3.2).

Composed stack:

    region weights (bf16)      Θ_attn_region + Θ_mlp_region    current region + prefetched next
    unreduced region grads     max(Θ_attn_region, Θ_mlp_region) backward, before reduce-scatter
    embedding gather           V·H                              forward[1]
    embedding grad (dense)     V·H                              backward[1], before reduce-scatter
    head (ZeRO-3, P = 1)       V·H                              head

FSDP2 baseline (``reshard_after_forward=True``, prefetch 1, ``MixedPrecisionPolicy(bf16, fp32)``):

    layer params (bf16)        2·Θ_layer/tp      current + prefetched layer
    unsharded layer grads      Θ_layer/tp        bf16, backward
    fp32 reduce-scatter input  Θ_layer/tp        4 B, backward (reduce_dtype = fp32); backward[L]:
                               max(Θ_layer, V·H)/tp (FSDP2 holds the head's until the layer reduces)
    embedding / head units     V·H/tp            their own FSDP units (+ fp32 grad before RS); the
                               head's all-gather output V·H/tp held through the head phase
"""

from __future__ import annotations

import numpy as np

from planner.budget import regions
from planner.budget.context import Ctx
from planner.budget.terms import FWD_BWD, Term
from planner.units import ceil_div

PROVISIONAL = True
"""Not yet traced against an operator: the composed step (attention region, ZeRO-3 gathers) has no
runtime here yet, so these counts come from the layouts alone."""
SOURCE = "DESIGN §2 MoP layout / FSDP2 layout, §3.2 Gathered"


def _rs_input(n, head_rs, L):
    """Elements of fp32 reduce-scatter input live in ``backward[r]``: this layer's, or in the last
    layer the head unit's, which FSDP2 holds until this layer's own reduce-scatter frees it."""
    def at(phase):
        return np.maximum(n, head_rs) if phase.region == L else n
    return at


def _fsdp2_terms(ctx: Ctx) -> list[Term]:
    m, tp, b = ctx.model, ctx.tp, ctx.act_bytes
    VH = ctx.vocab_size * ctx.hidden_size
    VH_tp = ceil_div(VH, tp)
    out: list[Term] = []
    kinds = [("moe", True)] if m.num_moe_layers else []
    L = ctx.num_boundaries                       # one region per layer
    fsdp = np.asarray(ctx.dp_shard) * np.asarray(ctx.cp)
    head_rs = VH_tp + ctx.hidden_size            # [norm, head] unit's fp32 reduce-scatter input
    if m.num_dense_layers:
        kinds.append(("dense_mlp", False))
    for kind, moe in kinds:
        n = regions.layer_params_local(m, tp=tp, ep=ctx.ep, moe=moe)
        out += [
            Term(f"{kind} layer params, current + prefetch (bf16)", "gathered", 2 * n, b,
                 "2·Θ_layer/tp", FWD_BWD, regions=(kind,), source=SOURCE, provisional=PROVISIONAL),
            Term(f"{kind} layer unsharded grads (bf16)", "gathered", n, b, "Θ_layer/tp", ("backward",),
                 regions=(kind,), source=SOURCE, provisional=PROVISIONAL),
            Term(f"{kind} layer fp32 reduce-scatter input", "gathered", np.maximum(n, head_rs), 4,
                 "Θ_layer/tp; backward[L]: max(Θ_layer, V·H)/tp (the head's, held until this layer reduces)",
                 ("backward",), regions=(kind,), at=_rs_input(n, head_rs, L),
                 source=SOURCE + "; FSDP2 keeps the last reduce-scatter input alive until the next unit's "
                 "post-backward (reduce_scatter_max_input_buffers = 1): in backward[L] the head's fp32 "
                 "gradient (trace: tests/trace/test_fsdp2_trace.py, bf16 cases)", provisional=PROVISIONAL),
        ]
    out += [
        Term("embedding unit (bf16)", "gathered", VH_tp, b, "V·H/tp", FWD_BWD, first_region_only=True,
             source=SOURCE, provisional=PROVISIONAL),
        Term("embedding grad (dense, fp32 reduce)", "gathered", VH_tp, 4, "V·H/tp",
             ("backward",), first_region_only=True, source=SOURCE, provisional=PROVISIONAL),
        Term("head unit (bf16)", "gathered", VH_tp, b, "V·H/tp", ("head",), source=SOURCE, provisional=PROVISIONAL),
        Term("head all-gather output, held (FSDP2 all_gather_state)", "gathered", VH_tp * (fsdp > 1), b,
             "V·H/tp if dp_shard·cp > 1", ("head",),
             source=SOURCE + "; FSDP2 keeps a forward all-gather's output until the next unit's all-gather "
             "(the backward's, for [norm, head]). The head's gradient and its fp32 reduce-scatter input "
             "come after the logits are freed: a sub-step of the head (planner.budget.fsdp2_vocab)",
             provisional=PROVISIONAL),
    ]
    return out


def terms(ctx: Ctx) -> list[Term]:
    """Gathered terms of one rank."""
    if ctx.stack == "fsdp2":
        return _fsdp2_terms(ctx)
    m, b = ctx.model, ctx.act_bytes
    VH = ctx.vocab_size * ctx.hidden_size
    attn = regions.attention_region_params(m)
    mlp = regions.mlp_region_dense_params(m)
    out = [
        Term("region weights, current + prefetched (bf16)", "gathered", attn + mlp, b,
             "Θ_attn_region + Θ_mlp_region", FWD_BWD, source=SOURCE, provisional=PROVISIONAL),
        Term("unreduced region grads (bf16)", "gathered", max(attn, mlp), b,
             "max(Θ_attn_region, Θ_mlp_region)", ("backward",), source=SOURCE, provisional=PROVISIONAL),
        Term("embedding gather (bf16)", "gathered", VH, b, "V·H", ("forward",), first_region_only=True,
             source=SOURCE, provisional=PROVISIONAL),
        Term("embedding grad, dense before reduce-scatter", "gathered", VH, b, "V·H", ("backward",),
             first_region_only=True, source=SOURCE, provisional=PROVISIONAL),
    ]
    P = np.asarray(ctx.vocab_parallel)
    if ctx.vocab == "dense" or bool(np.any(P == 1)):
        rows = VH if ctx.vocab == "dense" else np.where(P == 1, VH, 0)
        out.append(Term("head gather (ZeRO-3, P = 1)", "gathered", rows, b, "V·H if P = 1", ("head",),
                        source=SOURCE, provisional=PROVISIONAL))
    return out
