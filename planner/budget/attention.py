"""Live set ``attention``: one attention region's working set (DESIGN §3.2 Attention).

Legend (composed stack, Ulysses over ``D``): a rank holds ``N = S/D`` tokens of a sequence in the
sequence layout and all ``S`` tokens of ``n_h/D`` heads in the head layout, so both layouts hold
``N·n_h·d`` elements. ``d_qk`` = query/key head width, ``d_v`` = value head width, ``n_kv`` = KV
heads (``n_kv = n_h`` for MHA and MLA, whose keys are decompressed per head).

    forward[r]   normed input N·H, q/k/v in both layouts, output in both layouts, o-proj output N·H,
                 FlashAttention log-sum-exp N·n_h (fp32), MLA latents
    backward[r]  the recomputed forward interior + the gradients of q, k, v and the output in
                 both layouts (the two all-to-all buffers travel both ways)

Kernel workspaces invisible to fake tensors (FlashAttention's fp32 ``dq_accum``) are in
``workspace``. A sliding window changes no memory under Ulysses.

FSDP2 baseline (per-layer regions): heads over ``tp`` (sequence-parallel input all-gathered to
``N·H``), tokens ``N = S/cp``; context parallelism adds the ring's K/V send/receive buffers.
"""

from __future__ import annotations

from planner.budget.context import Ctx
from planner.budget.terms import FWD_BWD, Term
from planner.units import ceil_div

PROVISIONAL = True
"""Not yet traced against an operator: the composed step (attention region, ZeRO-3 gathers) has no
runtime here yet, so these counts come from the layouts alone."""
SOURCE = "DESIGN §3.2 Attention (Ulysses); FlashAttention-2 forward/backward tensors"


def _head_dims(ctx: Ctx) -> tuple[int, int, int, int]:
    m = ctx.model
    n_kv = m.num_heads if m.attention == "mla" else m.num_kv_heads
    return m.num_heads, n_kv, m.head_dim, m.v_dim


def terms(ctx: Ctx) -> list[Term]:
    """Attention working-set terms of one rank."""
    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    n_h, n_kv, d_qk, d_v = _head_dims(ctx)
    if ctx.stack == "fsdp2":
        tp = ctx.tp
        regions = tuple(k for k in ("moe", "dense_mlp") if k in set(ctx.regions))
        hq, hkv = ceil_div(n_h, tp), ceil_div(n_kv, tp)
        qkv = N * (hq * d_qk + hkv * (d_qk + d_v))
        out = [
            Term("normed input, all-gathered (sequence parallel)", "attention", N * H, b, "N·H", FWD_BWD,
                 regions=regions, source=SOURCE, provisional=PROVISIONAL),
            Term("q, k, v", "attention", qkv, b, "N·(n_h·d_qk + n_kv·(d_qk+d_v))/tp", FWD_BWD,
                 regions=regions, source=SOURCE, provisional=PROVISIONAL),
            Term("attention output", "attention", N * hq * d_v, b, "N·n_h·d_v/tp", FWD_BWD,
                 regions=regions, source=SOURCE, provisional=PROVISIONAL),
            Term("log-sum-exp (fp32)", "attention", N * hq, 4, "N·n_h/tp", FWD_BWD, regions=regions,
                 source=SOURCE, provisional=PROVISIONAL),
            Term("o-proj partial output (before reduce-scatter)", "attention", N * H, b, "N·H", FWD_BWD,
                 regions=regions, source=SOURCE, provisional=PROVISIONAL),
            Term("grads of q, k, v, output", "attention", qkv + N * hq * d_v, b,
                 "N·(n_h·(d_qk+d_v) + n_kv·(d_qk+d_v))/tp", ("backward",), regions=regions, source=SOURCE, provisional=PROVISIONAL),
            Term("context-parallel K/V ring buffers", "attention", 2 * N * hkv * (d_qk + d_v) * (ctx.cp > 1),
                 b, "2·N·n_kv·(d_qk+d_v)/tp if cp > 1", FWD_BWD, regions=regions, source=SOURCE, provisional=PROVISIONAL),
        ]
        return out
    R = ("attention",)
    qkv = N * (n_h * d_qk + n_kv * (d_qk + d_v))
    o = N * n_h * d_v
    out = [
        Term("normed input x_NH", "attention", N * H, b, "N·H", FWD_BWD, regions=R, source=SOURCE, provisional=PROVISIONAL),
        Term("q, k, v, sequence layout (all-to-all send)", "attention", qkv, b,
             "N·(n_h·d_qk + n_kv·(d_qk+d_v))", FWD_BWD, regions=R, source=SOURCE, provisional=PROVISIONAL),
        Term("q, k, v, head layout (all-to-all receive)", "attention", qkv, b,
             "S·(n_h·d_qk + n_kv·(d_qk+d_v))/D", FWD_BWD, regions=R, source=SOURCE, provisional=PROVISIONAL),
        Term("attention output, head + sequence layouts", "attention", 2 * o, b, "2·N·n_h·d_v", FWD_BWD,
             regions=R, source=SOURCE, provisional=PROVISIONAL),
        Term("log-sum-exp lse (fp32)", "attention", N * n_h, 4, "S·n_h/D", FWD_BWD, regions=R,
             source=SOURCE, provisional=PROVISIONAL),
        Term("o-proj output", "attention", N * H, b, "N·H", FWD_BWD, regions=R, source=SOURCE, provisional=PROVISIONAL),
        Term("grads of q, k, v, output (both layouts)", "attention", 2 * qkv + 2 * o, b,
             "2·N·(n_h·d_qk + n_kv·(d_qk+d_v)) + 2·N·n_h·d_v", ("backward",), regions=R, source=SOURCE, provisional=PROVISIONAL),
    ]
    if m.attention == "mla" and m.mla is not None:
        a = m.mla
        lat = N * ((a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim)
        out.append(Term("MLA latents c_q, c_kv, k_rope", "attention", lat, b,
                        "N·(q_lora + kv_lora + d_rope)", FWD_BWD, regions=R, source=SOURCE, provisional=PROVISIONAL))
        out.append(Term("MLA latent grads", "attention", lat, b, "N·(q_lora + kv_lora + d_rope)",
                        ("backward",), regions=R, source=SOURCE, provisional=PROVISIONAL))
    return out
