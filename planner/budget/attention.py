"""Live set ``attention``: one attention region's working set (DESIGN §3.2 Attention).

Legend (composed stack, Ulysses over ``D``): a rank holds ``N = S/D`` tokens of a sequence in the
sequence layout and all ``S`` tokens of ``n_h/D`` heads in the head layout, so both layouts hold
``N·n_h·d`` elements. ``d_qk`` = query/key head width, ``d_v`` = value head width, ``n_kv`` = KV
heads (``n_kv = n_h`` for MHA and MLA, whose keys are decompressed per head).

    forward[r]   normed input N·H, the roped q/k/v, FlashAttention's log-sum-exp N·n_h (fp32), and
                 the larger of the q-RoPE sub-step (fp32 copy and temporaries) and the exchange
                 sub-step's larger moment (``exchange_moments``: ``head_to_seq``'s copy at D > 1 with
                 the head layout, the kernel output, its contiguous copy and the receive; or the
                 o-projection's input and output)
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


MOMENTS_SOURCE = ("tensor inventory of planner/runtime/attention.py (Attention.forward, UlyssesCore, head_to_seq) "
                  "and sdpa.py _global; H200 allocator history: bench/results/memory_snapshot/"
                  "gptoss-W16-S32768-none.json forward[3] (D = 8, peak at head_to_seq: attention.py:54 head layout, "
                  "sdpa.py:51 output and lse, :102-104, attention.py:98 contiguous copy, :64 receive, :66 copy, no "
                  "o-projection output yet), gptoss-W1-S8192-none.json forward[3]-[4] (D = 1: no head layout, the "
                  "q-RoPE sub-step binds; layer 1 keeps sdpa.py:51, :102-104 and attention.py:146)")


@dataclasses.dataclass(frozen=True)
class ExchangeMoments:
    """Elements (b) of the exchange sub-step beyond the normed input and the sequence-layout q, k, v,
    at the larger of its two moments (``exchange_moments``); ``padded_qkv`` is in every moment."""

    head_qkv: object
    kernel_out: object
    exchange_out: object
    proj_out: object
    padded_qkv: object
    saved_sinks: bool
    total: object


def exchange_moments(ctx: Ctx, N, H, n_h, n_kv, d_qk, d_v) -> ExchangeMoments:
    """The exchange sub-step of a global GQA/MHA layer (``planner.runtime.attention`` /
    ``sdpa._global``), besides the normed input and the roped sequence-layout q, k, v:

        head_to_seq (D > 1)  the head-layout q, k, v (``UlyssesCore``'s locals), the kernel output
                             (``d_k`` wide: ``d_qk + SINK_PAD`` with sinks, else ``d_v``), its
                             contiguous copy (with ``B > 1`` sequences also ``head_to_seq``'s
                             send copy: with one, the permute is contiguous), the all-to-all
                             receive and the sequence-layout copy (the o-projection's input):
                             S·(…)/D + N·n_h·(d_k + (3 + [B > 1])·d_v)
        o-projection         the o-projection's input N·n_h·d_v and output N·H; the kernel output
                             where it is still held (D = 1: the returned view; checkpoint = none: a
                             save); at D > 1 without sinks and checkpointing the head-layout q, k,
                             v (the kernel's saved inputs); the rest is freed when the core returns

    With sinks and ``checkpoint = none`` both also hold the kernel's padded q, k, v (saves):
    ``N·(n_h + 2·n_kv)·(d_qk + SINK_PAD)``. At ``D = 1`` the head layout is a view: no copy."""
    m = ctx.model
    sinks, saving = bool(m.attention_sinks), ctx.checkpoint == "none"
    ul = np.asarray(ctx.seq_parallel) > 1
    qkv = N * (n_h * d_qk + n_kv * (d_qk + d_v))
    o = N * n_h * d_v
    o_k = N * n_h * (d_qk + SINK_PAD if sinks else d_v)
    padded = N * (n_h + 2 * n_kv) * (d_qk + SINK_PAD) if sinks and saving else 0
    copies = np.where(np.asarray(ctx.seqs_per_microbatch) > 1, 3, 2) * o   # contiguous, [send], receive
    at_h2s = np.where(ul, qkv + o_k + copies, 0) + o + padded
    head_at_proj = np.where(ul & (saving and not sinks), qkv, 0)
    kernel_at_proj = np.where(ul & (not saving), 0, o_k)
    at_proj = head_at_proj + kernel_at_proj + o + N * H + padded
    h2s = ul & (np.asarray(at_h2s) > np.asarray(at_proj))

    def pick(a, c):
        return _int(np.where(h2s, a, c))

    return ExchangeMoments(pick(np.where(ul, qkv, 0), head_at_proj), pick(o_k, kernel_at_proj),
                           pick(copies, 0), pick(0, N * H), _int(padded), sinks and saving,
                           pick(at_h2s, at_proj))


def _int(v):
    return int(v) if np.ndim(v) == 0 else v


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
    - **exchange + attention**: the normed input, the roped q, k, v (sequence layout:
      ``Attention.forward``'s locals until it returns), the lse, and the larger of two moments
      (``exchange_moments``): ``head_to_seq``'s copy (``D > 1``) and the o-projection.

    Backward: the exchange sub-step plus the gradients (layouts alone, provisional).
    """
    import numpy as np

    R = ("attention",)
    qkv = N * (n_h * d_qk + n_kv * (d_qk + d_v))
    rope_b = N * H + N * n_kv * (d_qk + d_v) + N * n_h * d_qk            # b-byte tensors
    saving = ctx.checkpoint == "none"   # autograd keeps the region's tensors: boundaries books the tables
    tables = 0 if saving else N * d_qk
    rope_f = N * n_h * d_qk + 2 * N * n_h * d_qk + tables                 # fp32 tensors
    mo = exchange_moments(ctx, N, H, n_h, n_kv, d_qk, d_v)
    ex_b = N * H + qkv + mo.total
    ex_f = N * n_h
    rope_wins = np.asarray(rope_b * b + rope_f * 4) > np.asarray(ex_b * b + ex_f * 4)
    prov = False

    def pick(a, c):
        v = np.where(rope_wins, a, c)
        return int(v) if np.ndim(v) == 0 else v

    fw = ("forward",)
    EX = "[forward: exchange sub-step, "
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
        Term("q, k, v, head layout (all-to-all receive)", "attention", pick(0, mo.head_qkv), b,
             "S·(n_h·d_qk + n_kv·(d_qk+d_v))/D if D > 1 (at the o-projection only as the saved kernel inputs: "
             f"no sinks, checkpoint = none)  {EX}either moment]", fw, regions=R, source=MOMENTS_SOURCE,
             provisional=prov),
        Term("kernel output (sinks: d_qk + SINK_PAD wide)", "attention", pick(0, mo.kernel_out), b,
             f"N·n_h·d_k (d_k = d_qk + SINK_PAD with sinks, else d_v; at the o-projection if D = 1 or "
             f"checkpoint = none)  {EX}either moment]", fw, regions=R, source=MOMENTS_SOURCE, provisional=prov),
        Term("attention output: contiguous copy, head_to_seq's send (B > 1) and receive (D > 1)", "attention",
             pick(0, mo.exchange_out), b, f"(2 + [B > 1])·N·n_h·d_v if D > 1  {EX}head_to_seq moment]", fw, regions=R,
             source=MOMENTS_SOURCE, provisional=prov),
        Term("o-projection input (sequence-layout copy of the output)", "attention", pick(0, N * n_h * d_v), b,
             f"N·n_h·d_v  {EX}either moment]", fw, regions=R, source=MOMENTS_SOURCE, provisional=prov),
        Term("o-projection output", "attention", pick(0, mo.proj_out), b, f"N·H  {EX}o-projection moment]",
             fw, regions=R, source=MOMENTS_SOURCE, provisional=prov),
        Term("log-sum-exp lse (fp32)", "attention", pick(0, ex_f), 4, "S·n_h/D  [forward: exchange sub-step]",
             fw, regions=R, source=SRC_DECODER, provisional=prov),
    ]
    out += [] if not mo.saved_sinks else [
        Term("sinks: the kernel's padded q, k, v (saved without checkpointing)", "attention",
             pick(0, mo.padded_qkv), b, f"N·(n_h + 2·n_kv)·(d_qk + SINK_PAD) if sinks and checkpoint = none  "
             f"{EX}either moment]", fw, regions=R,
             source="planner/runtime/sdpa.py _global q3, k3, v3; H200 allocator history, "
             "bench/results/memory_snapshot/gptoss-W16-S32768-none.json forward[3] (sdpa.py:102-104, at "
             "head_to_seq) and gptoss-W1-S8192-none.json forward[4]"),
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
