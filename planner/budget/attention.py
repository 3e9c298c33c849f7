"""Live set ``attention``: one attention region's working set (DESIGN §3.2 Attention).

Legend (composed stack, Ulysses over ``D``): a rank holds ``N = S/D`` tokens of a sequence in the
sequence layout and all ``S`` tokens of ``n_h/D`` heads in the head layout, so both layouts hold
``N·n_h·d`` elements. ``d_qk`` = query/key head width, ``d_v`` = value head width, ``n_kv`` = KV
heads (``n_kv = n_h`` for MHA and MLA, whose keys are decompressed per head).

    forward[r]   normed input N·H, q/k/v in both layouts, output in both layouts, o-proj output N·H,
                 FlashAttention log-sum-exp N·n_h (fp32)
    backward[r]  the larger of three sub-steps (``planner.budget.attention_backward``): the
                 FlashAttention kernel's backward (what the recompute saved: the norms' inputs,
                 RoPE tables, the kernel's q, k, v, output and lse; the gradients of the output, q,
                 k, v), QK-norm's fp32 backward over q, and attention_norm's fp32 backward

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

from planner.budget import attention_backward
from planner.budget.attention_sliding import CHUNKED_LOCAL_TYPES, backward_excess_terms, excess_terms
from planner.context.ctx import Ctx
from planner.budget.terms import FWD_BWD, Phase, Term
from planner.plans.sdpa_layout import SINK_PAD

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


def _backward_terms(ctx: Ctx, N, H, b, n_h, n_kv, d_qk) -> list[Term]:
    """The composed GQA/MHA backward: the sub-step a trace sees binding, of the three of
    ``planner.budget.attention_backward`` (the kernel's workspace is in ``workspace``)."""
    m = ctx.model
    k = attention_backward.kernel_shape(ctx)
    win = attention_backward.binding(ctx)

    def when(*names):
        on = np.zeros(np.shape(win["kernel"]), dtype=bool)
        for n in names:
            on = on | win[n]
        return on

    def pick(on, v):
        v = np.where(on, v, 0)
        return int(v) if np.ndim(v) == 0 else v

    kern, kq, qkn, end = when("kernel"), when("kernel", "qk_norm"), when("qk_norm"), when("end")
    qk = m.qk_norm
    rope = m.model_type not in CHUNKED_LOCAL_TYPES
    bw, R, src = ("backward",), ("attention",), attention_backward.SOURCE
    K, Q, E = "[kernel sub-step]", "[kernel or QK-norm sub-step]", "[QK-norm sub-step]"
    return [
        Term("attention_norm recompute: saved fp32 input x.float()", "attention", pick(kq, N * H), 4,
             f"N·H (fp32)  {Q}", bw, regions=R, source=src),
        Term("attention_norm recompute: saved cast y.to(b) and output", "attention", pick(kq, 2 * N * H), b,
             f"2·N·H  {Q}", bw, regions=R, source=src),
        Term("RoPE cos/sin tables (fp32)", "attention", pick(kern, N * d_qk if rope else 0), 4,
             f"N·d_qk  {K}", bw, regions=R, source=src),
        Term("QK-norm recompute: saved fp32 inputs and rsqrt of q and k", "attention",
             pick(kern, N * (n_h + n_kv) * (d_qk + 1) if qk else 0), 4, f"N·(n_h+n_kv)·(d_qk+1) (fp32)  {K}",
             bw, regions=R, source=src),
        Term("QK-norm recompute: saved casts of q and k", "attention",
             pick(kern, N * (n_h + n_kv) * d_qk if qk else 0), b, f"N·(n_h+n_kv)·d_qk  {K}", bw, regions=R,
             source=src),
        Term("kernel inputs q, k, v (head layout) and its output", "attention", pick(kern, k.q + k.kv + k.out), b,
             f"B·S_k·(h_l·d_k + h_kv·(d_k+d_vk) + h_l·d_vk)  {K}", bw, regions=R, source=src),
        Term("kernel log-sum-exp (fp32)", "attention", pick(kern, k.rows), 4, f"B·S_k·h_l  {K}", bw, regions=R,
             source=src),
        Term("gradients of the kernel's output, q, k, v (head layout)", "attention", pick(kern, k.out + k.q + k.kv),
             b, f"B·S_k·(h_l·d_vk + h_l·d_k + h_kv·(d_k+d_vk))  {K}", bw, regions=R, source=src),
        Term("QK-norm backward over q in fp32 (input + 5 temporaries)", "attention",
             pick(qkn, 6 * N * n_h * d_qk if qk else 0), 4, f"6·N·n_h·d_qk  {E}", bw, regions=R, source=src),
        Term("k and its gradient at the QK-norm backward", "attention", pick(qkn, 2 * N * n_kv * d_qk if qk else 0),
             b, f"2·N·n_kv·d_qk  {E}", bw, regions=R, source=src),
        Term("attention_norm backward: fp32 input + 5 temporaries", "attention", pick(end, 6 * N * H), 4,
             "6·N·H (fp32)  [attention_norm backward sub-step]", bw, regions=R, source=src),
        Term("gradient into attention_norm's output; outgoing boundary gradient", "attention",
             pick(end, 2 * N * H), b, "2·N·H  [attention_norm backward sub-step]", bw, regions=R, source=src),
    ]


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
    saving = ctx.checkpoint == "none"   # autograd keeps the region's tensors: boundaries books the tables
    tables = 0 if saving else N * d_qk
    rope_f = N * n_h * d_qk + 2 * N * n_h * d_qk + tables                 # fp32 tensors
    saved_sinks = saving and bool(m.attention_sinks)   # the kernel's padded q, k, v, output and sliced copy
    sink_b = N * ((2 * n_h + 2 * n_kv) * (d_qk + SINK_PAD) + n_h * d_v) if saved_sinks else 0
    ex_b = N * H + 2 * qkv + 2 * o + N * H + sink_b
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
             "3·N·n_h·d_qk + N·d_qk (tables: boundaries' without checkpointing)  [forward: when the q-RoPE "
             "sub-step binds]", fw, regions=R, source=SRC_DECODER, provisional=prov),
        Term("q, k, v, head layout (all-to-all receive)", "attention", pick(0, qkv), b,
             "S·(n_h·d_qk + n_kv·(d_qk+d_v))/D  [forward: when the exchange sub-step binds]", fw, regions=R,
             source=SRC_DECODER, provisional=prov),
        Term("attention output, head + sequence layouts; o-proj output", "attention", pick(0, 2 * o + N * H), b,
             "2·N·n_h·d_v + N·H  [forward: when the exchange sub-step binds]", fw, regions=R,
             source=SRC_DECODER, provisional=prov),
        Term("log-sum-exp lse (fp32)", "attention", pick(0, ex_f), 4, "S·n_h/D  [forward: exchange sub-step]",
             fw, regions=R, source=SRC_DECODER, provisional=prov),
    ]
    out += [] if not saved_sinks else [
        Term("sinks: the kernel's padded q, k, v and output, the output's sliced copy (saved without "
             "checkpointing)", "attention", pick(0, sink_b), b,
             "N·((2·n_h + 2·n_kv)·(d_qk + SINK_PAD) + n_h·d_v) if sinks and checkpoint = none  "
             "[forward: exchange sub-step]", fw, regions=R,
             source="planner/runtime/sdpa.py _global q3, k3, v3 and output; H200 allocator history, "
             "bench/results/memory_snapshot/gptoss-W16-S32768-none.json forward[3] (sdpa.py:51, 102-104, "
             "attention.py:98, at head_to_seq)"),
    ]
    bw = ("backward",)
    out = [t if t.phases != FWD_BWD else dataclasses.replace(t, phases=fw) for t in out]

    glob_fw = np.maximum(rope_b * b + rope_f * 4, ex_b * b + ex_f * 4) // b
    out += excess_terms(ctx, n_kv, glob_fw)
    out += _backward_terms(ctx, N, H, b, n_h, n_kv, d_qk)
    # a local layer's backward over its block copies: its excess over the global backward terms above
    ph = Phase("backward", 1, "attention")
    glob_bw = sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in out if t.phases == bw), np.int64(0))
    out += backward_excess_terms(ctx, glob_bw)
    return out
