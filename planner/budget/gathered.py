"""Live set ``gathered``: ZeRO-3 / FSDP2 all-gathered weights and unreduced gradients (DESIGN §3.2).

Composed stack:

    region weights (bf16)      Θ_attn_region + Θ_mlp_region    current region + prefetched next
    unreduced region grads     max(Θ_attn_region, Θ_mlp_region) backward, before reduce-scatter
    embedding sub-step         max(0, 2·V·H + N·H − A_f)        forward[1]: all-gather output +
                                                                unsharded table + its output
    embedding re-gathered      V·H                              backward[1]: FSDP2 prefetches the
                                                                table during region 1's backward
    embedding grad sub-step    max(0, 2·V·H − A_b)              backward[1]: dense grad + its
                                                                reduce-scatter input copy
    head (ZeRO-3, P = 1)       V·H                              head

The embedding runs before region 1's attention (forward) and after it (backward), so its tensors
and the region's are never live together: phase ``r = 1`` holds the larger of the two sub-steps.
``A_f``/``A_b`` are region 1's own bytes in that phase (its gathered weights and grads, boundaries,
attention; kernel workspaces left out, which errs high); the embedding terms are the excess over
them.
FSDP2's all-gather copies out of its flat output into the unsharded table (both live), and its
reduce-scatter copies the dense gradient into a flat input (both live): the whole-step trace's
forward[1] and backward[1] peaks (``tests/trace/test_step_trace.py``).

FSDP2 baseline: ``planner.budget.fsdp2_gathered`` (per FSDP unit; the layer's sub-steps in
``planner.budget.fsdp2_layer``).
"""

from __future__ import annotations

import numpy as np

from planner.budget import regions
from planner.budget.context import Ctx
from planner.budget.terms import FWD_BWD, Phase, Term
from planner.units import ceil_div

PROVISIONAL = True
"""Not yet traced against an operator: the composed step (attention region, ZeRO-3 gathers) has no
runtime here yet, so these counts come from the layouts alone."""
SOURCE = "DESIGN §2 MoP layout / FSDP2 layout, §3.2 Gathered"


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
    fwd = excess((2 * VH + N * H) * b, "forward")
    bwd = excess(2 * VH * b, "backward")
    return [prefetch,
        Term("embedding sub-step: all-gather output + unsharded table + output (excess over region 1)",
             "gathered", fwd, b, "max(0, 2·V·H + N·H − A_f)", ("forward",), first_region_only=True,
             source=SOURCE + "; whole-step trace forward[1]"),
        Term("embedding grad sub-step: dense grad + reduce-scatter input (excess over region 1)",
             "gathered", bwd, b, "max(0, 2·V·H − A_b)", ("backward",), first_region_only=True,
             source=SOURCE + "; whole-step trace backward[1]"),
    ]


def terms(ctx: Ctx) -> list[Term]:
    """Gathered terms of one rank."""
    if ctx.stack == "fsdp2":
        from planner.budget import fsdp2_gathered

        return fsdp2_gathered.terms(ctx)
    m, b = ctx.model, ctx.act_bytes
    VH = ctx.vocab_size * ctx.hidden_size
    attn = regions.attention_region_params(m)
    mlp = regions.mlp_region_dense_params(m)
    out = [
        Term("region weights, current + prefetched (bf16)", "gathered", attn + mlp, b,
             "Θ_attn_region + Θ_mlp_region", FWD_BWD, source=SOURCE, provisional=PROVISIONAL),
        Term("unreduced region grads (bf16)", "gathered", max(attn, mlp), b,
             "max(Θ_attn_region, Θ_mlp_region)", ("backward",), source=SOURCE, provisional=PROVISIONAL),
    ]
    out += _embedding_substeps(ctx, out)
    P = np.asarray(ctx.vocab_parallel)
    if ctx.vocab == "dense" or bool(np.any(P == 1)):
        rows = VH if ctx.vocab == "dense" else np.where(P == 1, VH, 0)
        out.append(Term("head gather (ZeRO-3, P = 1)", "gathered", rows, b, "V·H if P = 1", ("head",),
                        source=SOURCE, provisional=PROVISIONAL))
    return out
