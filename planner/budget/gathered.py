"""Live set ``gathered``: ZeRO-3 / FSDP2 all-gathered weights and unreduced gradients (DESIGN §3.2).

Composed stack:

    region weights (bf16)      forward[r]: Θ_r·(2 if W>1)       unsharded + held all-gather output
                               backward[r]: Θ_r + Θ_{r−1}       current + prefetched (W > 1)
    unreduced region grads     Θ_region(r) + Θ_unit(r+1)        backward[r]: region r's, and the
                                                                reduce-scatter input of the unit
                                                                before it, which FSDP2 holds
    embedding sub-step         max(0, 2·V·H + N·H − A_f)        forward[1]: all-gather output +
                                                                unsharded table + its output
    embedding re-gathered      V·H                              backward[1]: FSDP2 prefetches the
                                                                table during region 1's backward
    embedding grad sub-step    max(0, 2·V·H [+ V·H/W] − A_b)    backward[1]: dense grad + its
                                                                reduce-scatter input copy (+ its
                                                                shard, freed gradients)
    head (ZeRO-3, P = 1)       V·H                              head

The embedding runs before region 1's attention (forward) and after it (backward), so its tensors
and the region's are never live together: phase ``r = 1`` holds the larger of the two sub-steps.
``A_f``/``A_b`` are region 1's own bytes in that phase (its gathered weights and grads, boundaries,
attention; kernel workspaces left out, which errs high); the embedding terms are the excess over
them.
FSDP2's all-gather copies out of its flat output into the unsharded table (both live), and its
reduce-scatter copies the dense gradient into a flat input (both live): the whole-step trace's
forward[1] and backward[1] peaks (``tests/trace/test_step_trace.py``).

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
from planner.context.ctx import Ctx
from planner.budget.terms import FWD_BWD, Phase, Term
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


def _region1_bytes(ctx: Ctx, kind: str, own: list[Term]):
    """Region 1's bytes in ``kind``[1] beyond the persistent state and the kernel workspaces (left
    out: a FlashAttention workspace freed before the embedding's backward then makes the budget
    higher by at most its size, never lower, and a fake-tensor trace, blind to workspaces, sees the
    same excess)."""
    from planner.budget import attention, boundaries

    ph = Phase(kind, 1, ctx.regions[0])
    ts = [*own, *attention.terms(ctx), *boundaries.terms(ctx)]
    return sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in ts), np.int64(0))


def _embedding_substeps(ctx: Ctx, own: list[Term]) -> list[Term]:
    b, N, H = ctx.act_bytes, ctx.tokens_per_rank, ctx.hidden_size
    VH = ctx.vocab_size * H

    def excess(total_bytes, kind):
        v = np.maximum(np.asarray(total_bytes, dtype=np.int64) - _region1_bytes(ctx, kind, own), 0)
        v = -(-v // b)
        return int(v) if np.ndim(v) == 0 else v

    prefetch = Term("embedding table, re-gathered by FSDP2's backward prefetch", "gathered", VH, b, "V·H",
                    ("backward",), first_region_only=True, provisional=True,
                    source=SOURCE + "; H200 validate run: backward[1] − backward[3] ≈ V·H (Qwen3 614 vs "
                    "594 MiB), gpt-oss backward[1] 0.99-1.01 with it")
    own = [*own, prefetch]
    from planner.budget.persistent import embedding_grad_shard

    fwd = excess((2 * VH + N * H) * b, "forward")
    bwd = excess((2 * VH + embedding_grad_shard(ctx)) * b, "backward")
    return [prefetch,
        Term("embedding sub-step: all-gather output + unsharded table + output (excess over region 1)",
             "gathered", fwd, b, "max(0, 2·V·H + N·H − A_f)", ("forward",), first_region_only=True,
             source=SOURCE + "; whole-step trace forward[1]"),
        Term("embedding grad sub-step: dense grad + reduce-scatter input (excess over region 1)",
             "gathered", bwd, b, "max(0, 2·V·H [+ ceil(V·H/W), freed] − A_b)", ("backward",), first_region_only=True,
             source=SOURCE + "; whole-step trace backward[1]"),
    ]


def _unit_params(ctx: Ctx, P) -> list:
    """Dense parameters of the FSDP2 unit of each region (forward order), then of the unit after the
    last region: ``[norm, head]`` when the head is ZeRO-3 (``P = 1`` or a dense head), else the norm."""
    m = ctx.model
    per = {"attention": regions.attention_region_params(m), "moe": regions.moe_region_dense_params(m),
           "dense_mlp": regions.dense_region_params(m) if m.num_dense_layers else 0}
    VH = ctx.vocab_size * ctx.hidden_size
    head = VH if ctx.vocab == "dense" else np.where(P == 1, VH, 0)
    return [per[k] for k in ctx.regions] + [ctx.hidden_size + head]


def _region_weights(ctx: Ctx, P) -> list[Term]:
    """Gathered region weights. ``forward[r]``: region ``r``'s unsharded parameters and, when
    ``W > 1``, the all-gather output they were copied out of, which FSDP2 keeps until the next
    unit's all-gather (no forward prefetch). ``backward[r]``: region ``r``'s parameters and the
    all-gather output of region ``r−1``'s backward prefetch (``W > 1``; before region 1 the
    embedding's, a term of its own)."""
    units = _unit_params(ctx, P)[:-1]
    two = np.where(np.asarray(ctx.world_size) > 1, 1, 0)
    fwd = [np.asarray(u) * (1 + two) for u in units]
    bwd = [np.asarray(units[r - 1]) + (np.asarray(units[r - 2]) * two if r >= 2 else 0)
           for r in range(1, len(units) + 1)]
    big = fwd[0]
    for c in fwd[1:] + bwd:
        big = np.maximum(big, c)

    def at(ph: Phase):
        v = (fwd if ph.kind == "forward" else bwd)[ph.region - 1]
        return int(v) if np.ndim(v) == 0 else v

    return [Term("region weights: unsharded + all-gather output (forward), + prefetched region (backward)",
                 "gathered", int(big) if np.ndim(big) == 0 else big, ctx.act_bytes,
                 "forward[r]: Θ_region(r)·(2 if W > 1 else 1); backward[r]: Θ_region(r) + Θ_region(r−1) if W > 1",
                 FWD_BWD, at=at, provisional=PROVISIONAL,
                 source=SOURCE + "; H200 allocator history of planner validate: gpt-oss-W8 forward[3] holds "
                 "101.3 MiB at the attention region's call (the 50.6 MiB all-gather output and the 50.6 MiB "
                 "of unsharded parameters), its MoE forward[2] none of region 3's; qwen3-W1 forward[1] 36 MiB "
                 "(no all-gather output at W = 1); gpt-oss-W8 backward[4] holds region 3's 50.6 MiB "
                 "all-gather output")]


def _unreduced_grads(ctx: Ctx, P) -> Term:
    """``backward[r]``: region ``r``'s unsharded gradients, and the reduce-scatter input of the unit
    whose backward ran before it (region ``r+1``; after the last region the ``[norm, head]`` unit),
    which FSDP2 keeps until the next reduce-scatter (``reduce_scatter_max_input_buffers``)."""
    units = _unit_params(ctx, P)
    cnt = [np.asarray(units[r - 1]) + np.asarray(units[r]) for r in range(1, len(units))]
    big = cnt[0]
    for c in cnt[1:]:
        big = np.maximum(big, c)

    def at(ph: Phase):
        v = cnt[ph.region - 1]
        return int(v) if np.ndim(v) == 0 else v

    return Term("unreduced grads: region r's, and the held reduce-scatter input of region r+1 (bf16)",
                "gathered", int(big) if np.ndim(big) == 0 else big, ctx.act_bytes,
                "Θ_region(r) + Θ_unit(r+1)  (unit L_b+1: final norm [+ V·H when the head is ZeRO-3])",
                ("backward",), at=at, provisional=PROVISIONAL,
                source=SOURCE + "; H200 allocator history of planner validate: qwen3-W1 backward[4] holds "
                "2 × V·H·b (the [norm, head] unit's reduce-scatter input and output), gpt-oss-W8 backward[2] "
                "holds region 3's 50.6 MiB reduce-scatter input beside region 1's all-gather buffer")


def terms(ctx: Ctx) -> list[Term]:
    """Gathered terms of one rank."""
    if ctx.stack == "fsdp2":
        return _fsdp2_terms(ctx)
    m, b = ctx.model, ctx.act_bytes
    VH = ctx.vocab_size * ctx.hidden_size
    attn = regions.attention_region_params(m)
    mlp = regions.mlp_region_dense_params(m)
    P = np.asarray(ctx.vocab_parallel)
    out = [
        *_region_weights(ctx, P),
        _unreduced_grads(ctx, P),
    ]
    out += _embedding_substeps(ctx, out)
    if ctx.vocab == "dense" or bool(np.any(P == 1)):
        rows = VH if ctx.vocab == "dense" else np.where(P == 1, VH, 0)
        out.append(Term("head gather (ZeRO-3, P = 1)", "gathered", rows, b, "V·H if P = 1", ("head",),
                        source=SOURCE, provisional=PROVISIONAL))
    return out
