"""Live set ``attention``: one attention region's working set (DESIGN §3.2 Attention).

Legend (composed stack, Ulysses over ``D``): a rank holds ``N = S/D`` tokens of a sequence in the
sequence layout and all ``S`` tokens of ``n_h/D`` heads in the head layout, so both layouts hold
``N·n_h·d`` elements. ``d_qk`` = query/key head width, ``d_v`` = value head width, ``n_kv`` = KV
heads (``n_kv = n_h`` for MHA and MLA, whose keys are decompressed per head).

    forward[r]   normed input N·H, q/k/v in both layouts, output in both layouts, o-proj output N·H,
                 FlashAttention log-sum-exp N·n_h (fp32)
    backward[r]  the recomputed forward interior + the gradients of q, k, v and the output in
                 both layouts (the two all-to-all buffers travel both ways)

MLA regions: the tensor inventory at the memory-efficient kernel, ``planner.budget.attention_mla``.

Kernel workspaces invisible to fake tensors (FlashAttention's fp32 ``dq_accum``) are in
``workspace``. A sliding window adds the block copies of ``planner.runtime.sdpa._sliding`` in the
local layers' forward (``attention_sliding``).

FSDP2 baseline (per-layer regions): ``planner.budget.fsdp2_layer`` (the layer's attention and FFN
sub-steps, the larger of them per phase).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.budget.attention_sliding import backward_excess_terms, excess_terms
from planner.context.ctx import Ctx
from planner.budget.terms import FWD_BWD, Phase, Term
from planner.units import ceil_div

PROVISIONAL = True
"""Not yet traced: the GQA/MHA backward and the FSDP2 baseline's attention come from the layouts
alone (MLA: ``attention_mla``, an inventory). The composed GQA/MHA forward of global and sliding-window layers is confirmed by the
region trace."""
SRC_DECODER = ("tensor inventory of planner/runtime/attention.py + model_layers.py (RMSNorm, RoPE in "
               "fp32) in a region checkpoint; region trace, tests/trace/test_step_trace.py")
SOURCE = "DESIGN §3.2 Attention (Ulysses); FlashAttention-2 forward/backward tensors"


def _head_dims(ctx: Ctx) -> tuple[int, int, int, int]:
    m = ctx.model
    n_kv = m.num_heads if m.attention == "mla" else m.num_kv_heads
    return m.num_heads, n_kv, m.head_dim, m.v_dim


def terms(ctx: Ctx) -> list[Term]:
    """Attention working-set terms of one rank."""
    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    n_h, n_kv, d_qk, d_v = _head_dims(ctx)
    if ctx.stack == "fsdp2":   # the layer's sub-steps (attention, FFN, their gradients)
        from planner.budget import fsdp2_layer

        return fsdp2_layer.terms(ctx)
    if m.attention != "mla":
        return _gqa_terms(ctx, N, H, b, n_h, n_kv, d_qk, d_v)
    from planner.budget import attention_mla

    return attention_mla.terms(ctx, N, H, b, n_h, d_qk, d_v)


def _backward_substeps(ctx: Ctx):
    """Bytes of the composed GQA backward's two sub-steps: the layouts and their gradients (where
    FlashAttention's backward runs, with its workspace), and QK-norm's fp32 RMSNorm backward over q
    (after it: the kernel's workspace is freed by then)."""
    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    n_h, n_kv, d_qk, d_v = _head_dims(ctx)
    qkv = N * (n_h * d_qk + n_kv * (d_qk + d_v))
    o = N * n_h * d_v
    lay_b = qkv + 2 * o + N * H + 2 * N * n_h + 2 * qkv + 2 * o
    qkn_f = 6 * N * n_h * d_qk if m.qk_norm else 0
    qkn_b = 2 * N * n_kv * d_qk if m.qk_norm else 0
    return np.asarray(lay_b * b), np.asarray(qkn_f * 4 + qkn_b * b)


def qk_norm_lead(ctx: Ctx):
    """How far QK-norm's backward sub-step exceeds the layouts' (bytes, ≥ 0; 0 without QK-norm,
    for MLA and for the FSDP2 baseline): the part of FlashAttention's backward workspace that sits
    under it, which ``workspace`` leaves out (DESIGN §3.1: a phase holds its larger sub-step)."""
    m = ctx.model
    if ctx.stack == "fsdp2" or m.attention == "mla" or not m.qk_norm:
        return 0
    lay, qkn = _backward_substeps(ctx)
    v = np.maximum(qkn - lay, 0)
    return int(v) if np.ndim(v) == 0 else v


def _gqa_terms(ctx: Ctx, N, H, b, n_h, n_kv, d_qk, d_v) -> list[Term]:
    """Composed GQA/MHA attention region: the forward holds the larger of two sub-steps.

    - **q RoPE** (fp32, ``apply_rope``): the normed input ``N·H``, k and v ``N·n_kv·(d_qk+d_v)``, q
      ``N·n_h·d_qk`` (b), its fp32 copy ``N·n_h·d_qk`` and four fp32 half-width temporaries
      ``4·N·n_h·d_qk/2``, and the cos/sin tables ``N·d_qk`` (fp32). QK-norm's output replaces q, so it
      adds nothing here.
    - **exchange + attention**: q, k, v in both Ulysses layouts, the output in both, its lse, the
      o-proj output.

    Backward: the exchange sub-step plus the gradients (layouts alone, provisional).
    """
    import numpy as np

    R = ("attention",)
    m = ctx.model
    qkv = N * (n_h * d_qk + n_kv * (d_qk + d_v))
    o = N * n_h * d_v
    rope_b = N * H + N * n_kv * (d_qk + d_v) + N * n_h * d_qk            # b-byte tensors
    rope_f = N * n_h * d_qk + 2 * N * n_h * d_qk + N * d_qk              # fp32 tensors
    ex_b = N * H + 2 * qkv + 2 * o + N * H
    ex_f = N * n_h
    rope_wins = np.asarray(rope_b * b + rope_f * 4) > np.asarray(ex_b * b + ex_f * 4)
    prov = False

    def pick(a, c):
        v = np.where(rope_wins, a, c)
        return int(v) if np.ndim(v) == 0 else v

    fw = ("forward",)
    out = [
        Term("normed input x_NH", "attention", N * H, b, "N·H", FWD_BWD, regions=R, source=SRC_DECODER,
             provisional=prov),
        Term("k, v, sequence layout", "attention", N * n_kv * (d_qk + d_v), b, "N·n_kv·(d_qk+d_v)", FWD_BWD,
             regions=R, source=SRC_DECODER, provisional=prov),
        Term("q, sequence layout", "attention", N * n_h * d_qk, b, "N·n_h·d_qk", FWD_BWD, regions=R,
             source=SRC_DECODER, provisional=prov),
        Term("q RoPE in fp32: copy, 4 half-width temporaries, cos/sin tables", "attention", pick(rope_f, 0), 4,
             "3·N·n_h·d_qk + N·d_qk  [forward: when the q-RoPE sub-step binds]", fw, regions=R,
             source=SRC_DECODER, provisional=prov),
        Term("q, k, v, head layout (all-to-all receive)", "attention", pick(0, qkv), b,
             "S·(n_h·d_qk + n_kv·(d_qk+d_v))/D  [forward: when the exchange sub-step binds]", fw, regions=R,
             source=SRC_DECODER, provisional=prov),
        Term("attention output, head + sequence layouts; o-proj output", "attention", pick(0, 2 * o + N * H), b,
             "2·N·n_h·d_v + N·H  [forward: when the exchange sub-step binds]", fw, regions=R,
             source=SRC_DECODER, provisional=prov),
        Term("log-sum-exp lse (fp32)", "attention", pick(0, ex_f), 4, "S·n_h/D  [forward: exchange sub-step]",
             fw, regions=R, source=SRC_DECODER, provisional=prov),
    ]
    # backward: the layouts and their gradients, or (QK-norm) RMSNorm's fp32 backward over q
    qkn_f = 6 * N * n_h * d_qk if m.qk_norm else 0
    qkn_b = 2 * N * n_kv * d_qk if m.qk_norm else 0
    lay_bytes, qkn_bytes = _backward_substeps(ctx)
    qkn_wins = qkn_bytes > lay_bytes

    def pick_b(a, c):
        v = np.where(qkn_wins, a, c)
        return int(v) if np.ndim(v) == 0 else v

    bw = ("backward",)
    out = [t if t.phases != FWD_BWD else dataclasses.replace(t, phases=fw) for t in out]

    glob_fw = np.maximum(rope_b * b + rope_f * 4, ex_b * b + ex_f * 4) // b
    out += excess_terms(ctx, n_kv, glob_fw)
    out += [
        Term("backward: normed input, q, k, v both layouts, outputs, lse", "attention",
             pick_b(0, N * H + N * n_h * d_qk + N * n_kv * (d_qk + d_v) + qkv + 2 * o + N * H + 2 * N * n_h), b,
             "N·H + 2·N·(n_h·d_qk + n_kv·(d_qk+d_v)) + 2·N·n_h·d_v + N·H + lse  [when the layouts bind]",
             bw, regions=R, source=SOURCE, provisional=PROVISIONAL),
        Term("grads of q, k, v, output (both layouts)", "attention", pick_b(0, 2 * qkv + 2 * o), b,
             "2·N·(n_h·d_qk + n_kv·(d_qk+d_v)) + 2·N·n_h·d_v  [when the layouts bind]", bw, regions=R,
             source=SOURCE, provisional=PROVISIONAL),
        Term("QK-norm backward over q in fp32 (6 temporaries)", "attention", pick_b(qkn_f, 0), 4,
             "6·N·n_h·d_qk  [when the QK-norm backward binds]", bw, regions=R, source=SRC_DECODER,
             provisional=PROVISIONAL),
        Term("k and its gradient at the QK-norm backward", "attention", pick_b(qkn_b, 0), b,
             "2·N·n_kv·d_qk  [when the QK-norm backward binds]", bw, regions=R, source=SRC_DECODER,
             provisional=PROVISIONAL),
    ]
    # a local layer's backward over its block copies: excess over the global backward terms above and
    # the GQA expansion workspace (a local layer's K/V are expanded before the kernel)
    ph = Phase("backward", 1, "attention")
    glob_bw = sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in out if t.phases == bw), np.int64(0))
    glob_bw = glob_bw + (N * n_h * (d_qk + d_v) * b if n_kv < n_h else 0)
    out += backward_excess_terms(ctx, glob_bw)
    return out
