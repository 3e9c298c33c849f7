"""Sliding-window attention's block copies (composed stack, Ulysses head layout), per rank.

``planner.runtime.sdpa._sliding`` runs a local layer (token ``i`` sees ``i-w < j <= i``) as ``n_b =
ceil(S/w)`` query blocks of ``w``; block ``t`` sees the keys of blocks ``t-1`` and ``t``. Legend:
``h' = n_h/D`` heads of the head layout, ``R = B·n_b·w·h'`` padded query rows, ``w_q = w_k = d_qk
(+8 with sinks)``, ``w_v = d_v`` (``d_qk + 8`` with sinks: v is padded to q's width), ``L_k = 2w
(+1 sink)`` rounded up to 16 (``L_p``). Tensors, in the order the code makes them:

    held   sinks: q, k, v with the sink channels  R·(w_q + w_k + w_v)
           else:  k, v expanded to h' heads        R·(d_qk + d_v)   (only when n_kv < n_h)
    qb     query blocks (a copy)                   R·w_q
    kv     key/value blocks t-1, t: sinks: the     R·(2w+1)/w·(w_k + w_v)
           concatenated copies; else views of a    (R + B·w·h')·(w_k + w_v)
           front-padded copy
    pad    kv padded to L_p (copies)               R·L_p/w·(w_k + w_v)
    mask   bool [n_b, w, L_p] + additive bias      B·n_b·w·L_p (1 byte) + (b bytes)
    out    attention output and its unblocked copy 2·R·w_v

The peak is the larger of the pad step (``held + qb + kv + pad``) and the kernel step (``held + qb
+ pad + mask + out``); the region also holds the normed input ``N·H`` and q, k, v in both Ulysses
layouts ``2·N·(n_h·d_qk + n_kv·(d_qk+d_v))`` (one layout at ``D = 1``). The term is the excess of
that sub-step over the global layer's forward, in the forward of the local layers' regions only
(checked against the region trace, ``tests/trace/test_step_trace.py``, gpt-oss layer 0). The
backward's recompute holds the same copies, but the H200 run's gpt-oss backward[1] is matched
(0.99-1.01) without them, and the region trace's sliding backward (635 MiB at N = 4096 against
385 for the formula) is not yet explained: no backward term yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.context.ctx import Ctx
from planner.budget.terms import Phase, Term
from planner.plans.sdpa_layout import MASK_ALIGN, SINK_PAD
from planner.units import ceil_div

CHUNKED_LOCAL_TYPES = ("llama4",)
"""Model types whose local layers are chunked (``planner.runtime.model_layers.FAMILIES``: reshaped
into ``w``-chunks, no block copies); a unit test checks the two lists agree."""
SOURCE = ("tensor inventory of planner/runtime/sdpa.py _sliding; region trace, "
          "tests/trace/test_step_trace.py")


def local_regions(ctx: Ctx) -> frozenset[int]:
    """1-based attention regions ``r = 2·layer + 1`` of the sliding-window layers."""
    m = ctx.model
    if m.sliding_window is None or m.model_type in CHUNKED_LOCAL_TYPES or m.attention == "mla":
        return frozenset()
    return frozenset(2 * i + 1 for i in m.local_layers)


@dataclass(frozen=True)
class BlockGeometry:
    """The block layout of ``planner.runtime.sdpa._sliding`` on one rank (module legend)."""

    R: object
    """Padded query rows ``B·n_b·w·h'``."""
    B: object
    nb: object
    hl: object
    w: int
    w_q: int
    w_k: int
    w_v: int
    lk_p: int
    sink: bool


def block_geometry(ctx: Ctx) -> BlockGeometry:
    """``R``, ``n_b``, ``h'``, the channel widths and ``L_p`` of the local layers' block copies."""
    m, N = ctx.model, ctx.tokens_per_rank
    n_h, d_qk, d_v, w = m.num_heads, m.head_dim, m.v_dim, int(m.sliding_window)
    D, B = ctx.seq_parallel, ctx.seqs_per_microbatch
    S = np.asarray(N) * D // B                         # tokens of one sequence (head layout)
    hl = ceil_div(n_h, D)
    nb = -(-S // w)
    sink = bool(m.attention_sinks)
    wq = wk = d_qk + (SINK_PAD if sink else 0)
    wv = d_qk + SINK_PAD if sink else d_v
    lk_p = -(-(2 * w + int(sink)) // MASK_ALIGN) * MASK_ALIGN
    return BlockGeometry(B * nb * w * hl, B, nb, hl, w, wq, wk, wv, lk_p, sink)


def sliding_peak(ctx: Ctx, n_kv: int):
    """Elements (b bytes; the bool mask counted at ``1/b``) of the block copies at their peak, and
    of the whole sliding sub-step of the region."""
    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    n_h, d_qk, d_v, D = m.num_heads, m.head_dim, m.v_dim, ctx.seq_parallel
    g = block_geometry(ctx)
    R, w, wq, wk, wv, lk_p = g.R, g.w, g.w_q, g.w_k, g.w_v, g.lk_p
    if g.sink:
        held = R * (wq + wk + wv)
        kv = R * (2 * w + 1) // w * (wk + wv)
    else:
        held = R * (d_qk + d_v) if n_kv < n_h else 0
        kv = (R + g.B * w * g.hl) * (wk + wv)
    qb = R * wq
    pad = R * lk_p // w * (wk + wv)
    mask = g.B * g.nb * w * lk_p + ceil_div(g.nb * w * lk_p, b)
    out = 2 * R * wv
    peak = np.maximum(held + qb + kv + pad, held + qb + pad + mask + out)
    qkv = N * (n_h * d_qk + n_kv * (d_qk + d_v))
    layouts = np.where(np.asarray(D) > 1, 2, 1)        # D = 1: no all-to-all, one layout
    return peak, N * H + layouts * qkv + peak


def sliding_backward(ctx: Ctx):
    """Bytes of a local layer's backward sub-step (the memory-efficient kernel's backward over the
    block copies), beyond the kernel's fp32 accumulator (``workspace``) and the boundaries:

        saved by the recompute   qb R·w_q, padded kv blocks P = R·L_p/w·(w_k + w_v), the additive
                                 bias B·n_b·w·L_p, the output R·w_v (b) and its lse R (fp32)
        gradients                dq and a second R·w_q block, dk/dv P, the output's R·w_v (the
                                 slice's backward) (b), the kernel's delta R (fp32)
        region                   the attention_norm's saved fp32 input N·H, its cast and output
                                 2·N·H (b: model_layers.py:74, two blocks in the H200 history); the
                                 cos/sin tables N·d_qk (fp32)"""
    N, H, b, d_qk = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes, ctx.model.head_dim
    g = block_geometry(ctx)
    R, w = g.R, g.w
    P = R * g.lk_p // w * (g.w_k + g.w_v)
    bias = g.B * g.nb * w * g.lk_p
    return (b * (3 * R * g.w_q + 2 * P + 2 * R * g.w_v + bias) + 4 * 2 * R + N * H * (4 + 2 * b) + 4 * N * d_qk)


def backward_excess_terms(ctx: Ctx, global_backward) -> list[Term]:
    """The local layers' backward sub-step's excess over ``global_backward`` (bytes: the global
    layer's attention backward and its GQA expansion workspace, which a local layer, whose K/V are
    already expanded, does not make). Empty without local layers."""
    regions = local_regions(ctx)
    if not regions:
        return []
    b = ctx.act_bytes
    extra = np.maximum(np.asarray(sliding_backward(ctx)) - np.asarray(global_backward), 0)
    extra = -(-extra // b)
    extra = int(extra) if np.ndim(extra) == 0 else extra

    def at(ph: Phase):
        return extra if ph.region in regions else 0

    text = ("max(0, b·(3·R·w_q + 2·R·L_p/w·(w_k+w_v) + 2·R·w_v + B·n_b·w·L_p) + 8·R + N·H·(4+2b) + 4·N·d_qk "
            "− global backward)/b  [local layers; planner/budget/attention_sliding.py]")
    return [Term("sliding window backward: block copies, their gradients, the norm's saved input "
                 "(excess over a global layer)", "attention", extra, b, text, ("backward",),
                 regions=("attention",), at=at,
                 source=SOURCE + "; H200 allocator history of planner validate, gpt-oss-W8 backward[1]: "
                 "sdpa.py:151 2 × 306 MiB, :113 144, :159 68, :56 144 + 4, SliceBackward0 144, "
                 "EfficientAttentionBackward0 306 + 306 + 144 + 144 + 4 (+ its 512 MiB accumulator), "
                 "model_layers.py:72/74 180 + 90 + 90")]


def excess_terms(ctx: Ctx, n_kv: int, global_forward) -> list[Term]:
    """The sliding sub-step's excess over ``global_forward`` (elements of the global layer's
    forward at b bytes) in the forward of local layers' regions. Empty without local layers."""
    regions = local_regions(ctx)
    if not regions:
        return []
    _, total = sliding_peak(ctx, n_kv)
    extra = np.maximum(np.asarray(total) - np.asarray(global_forward), 0)
    extra = int(extra) if np.ndim(extra) == 0 else extra

    def at(ph: Phase):
        return extra if ph.region in regions else 0

    text = ("max(0, N·H + (2 if D > 1 else 1)·N·(n_h·d_qk + n_kv·(d_qk+d_v)) + max(held + qb + kv + pad, "
            "held + qb + pad + mask + 2·R·w_v) − global forward)  [local layers; planner/budget/attention_sliding.py]")
    return [
        Term("sliding window: block copies of q, k, v (excess over a global layer)", "attention", extra,
             ctx.act_bytes, text, ("forward",), regions=("attention",), at=at, source=SOURCE),
    ]
