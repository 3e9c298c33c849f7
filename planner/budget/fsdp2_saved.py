"""What autograd keeps of one FSDP2 baseline layer (``planner/runtime/fsdp2.py`` on the shared
decoder), per rank: the attention's saved tensors without SAC (``attention_saved_counts``) and the
outputs torchtitan's op-level SAC keeps (``sac_saved_counts``), from the per-token inventory of
``planner.budget.boundaries.saved_per_token`` and the GPU allocator history of ``planner validate``'s
step (``bench/memory_snapshot.py``, H200). Used for the current layer's sub-steps
(``planner.budget.fsdp2_layer``) and the layers before it (``planner.budget.fsdp2_boundaries``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.budget import boundaries
from planner.budget.attention_sliding import CHUNKED_LOCAL_TYPES
from planner.context.ctx import Ctx
from planner.plans import llep, routing
from planner.plans.sdpa_layout import MASK_ALIGN, SINK_PAD
from planner.units import ceil_div


def dims(ctx: Ctx):
    """``(h_q, h_kv, d_qk, d_v)``: this rank's heads under ``tp`` and the head widths."""
    m = ctx.model
    n_kv = m.num_heads if m.attention == "mla" else m.num_kv_heads
    return ceil_div(m.num_heads, ctx.tp), ceil_div(n_kv, ctx.tp), m.head_dim, m.v_dim


def _rot_dim(ctx: Ctx) -> int:
    m = ctx.model
    return m.mla.qk_rope_head_dim if m.attention == "mla" and m.mla is not None else m.head_dim


def local_layers(ctx: Ctx) -> frozenset[int]:
    """1-based layers (= baseline regions) whose attention runs ``planner.runtime.sdpa._sliding``."""
    m = ctx.model
    if m.sliding_window is None or m.model_type in CHUNKED_LOCAL_TYPES or m.attention == "mla":
        return frozenset()
    return frozenset(i + 1 for i in m.local_layers)


@lru_cache(maxsize=4096)
def _busiest_rows(profile: str, tokens: int, num_experts: int, top_k: int, ep: int) -> int:
    load = routing.profile_counts(profile, tokens, num_experts, top_k, ep).sum(0)
    return int(llep.standard_assignment(load, ep).load.max())


def routed_rows(ctx: Ctx):
    """``Q``: routed rows the busiest rank's experts receive in one MoE layer under the plan's
    routing profile (the profile the dispatch live set and the emulated step use), standard EP over
    ``ep`` ranks (``llep.standard_assignment``: expert ``e`` on rank ``e // (E/ep)``); ``N·k`` rows
    when balanced. Arrays of ``N`` or ``ep`` broadcast."""
    prof = routing.profile_name(ctx.routing, ctx.routing_hot_share, ctx.routing_hot_experts)
    N_a, ep_a = np.broadcast_arrays(ceil_div(np.asarray(ctx.tokens_per_rank, np.int64), ctx.tp),
                                    np.asarray(ctx.ep, np.int64))
    out = np.asarray([_busiest_rows(prof, n, ctx.num_experts, ctx.top_k, ep)
                      for n, ep in zip(N_a.reshape(-1).tolist(), ep_a.reshape(-1).tolist())],
                     np.int64).reshape(N_a.shape)
    return int(out) if out.ndim == 0 else out


def routed_rows_excess(ctx: Ctx):
    """``Q − N·k``: the busiest rank's routed rows beyond the balanced ``N·k`` of
    ``boundaries.saved_per_token``'s per-token MoE inventory (0 balanced, clipped at 0)."""
    return np.maximum(np.asarray(routed_rows(ctx)) - ceil_div(np.asarray(ctx.tokens_per_rank), ctx.tp) * ctx.top_k, 0)


def attention_saved_counts(ctx: Ctx, selective: bool, local: bool):
    """``(b-byte elements, fp32 elements)`` autograd keeps of one layer's attention.

    The per-token inventory of ``boundaries.saved_per_token`` times ``N_sp``, the RoPE cos/sin
    tables ``N·d_rot`` (fp32), and without SAC what the GPU allocator history shows beyond it:
    QK-norm's RMSNorm over q and k keeps its fp32 copy, rsqrt and normed output,
    ``N·(h_q+h_kv)·(d_qk (fp32) + 1 (fp32) + d_qk (b))`` (Qwen3 W8 backward[2]: 576 + 4.5 + 288 MiB at
    ``model_layers.py`` RMSNorm under ``attention.py`` q_norm/k_norm); MLA keeps the keys' no-RoPE
    part twice (in the ``kv_b`` output that v views and in the concatenated k), ``N·h_q·d_nope``, and
    its latent norms' fp32 copies ``N·(kv_lora + q_lora)`` (DeepSeek W64 backward[1]: ``attention.py``
    kv 256 + k 192 MiB, the kv-norm's 64 MiB fp32 copy); attention sinks pad q, k, v and
    the output by ``SINK_PAD`` channels and copy the sliced output for the o-projection,
    ``N·(SINK_PAD·(2·h_q + 2·h_kv) + h_q·d_v)`` (gpt-oss W32 backward[2]: ``sdpa.py`` _global q3/k3/v3
    288 + 36 + 36 MiB, ``attention.py`` o-proj input 256 MiB); a sliding-window layer saves its
    blocks instead of q, k, v and o (``planner.plans.sdpa_layout``; ``R = B·n_b·w·h_q``): query blocks
    ``R·w_q``, key/value blocks padded to ``L_p``, ``R·L_p/w·(w_k+w_v)``, the additive mask
    ``B·n_b·w·L_p``, the blocked output ``R·w_v`` and its unblocked copy ``N·h_q·d_v`` (gpt-oss W32
    backward[1]: 288, 1224, 17, 288 and 256 MiB at ``sdpa.py`` _blocks/_sliding); under context
    parallelism the ring attention's output is copied for the o-projection, ``N·h_q·d_v`` (Qwen3 W8
    cp8 backward[1]: ``attention.py`` 128 MiB).
    """
    m = ctx.model
    N, N_sp = ctx.tokens_per_rank, ceil_div(ctx.tokens_per_rank, ctx.tp)
    hq, hkv, d_qk, d_v = dims(ctx)
    eb, ef = boundaries.saved_per_token(ctx, "attention", selective)
    cb, cf = eb * N_sp, ef * N_sp + N * _rot_dim(ctx)
    if selective:
        return cb, cf
    if m.qk_norm:
        cb, cf = cb + N * (hq + hkv) * d_qk, cf + N * (hq + hkv) * (d_qk + 1)
    if m.attention == "mla" and m.mla is not None:
        a = m.mla
        cb = cb + N * hq * a.qk_nope_head_dim
        cf = cf + N * (a.kv_lora_rank + (a.q_lora_rank or 0))
    sink = bool(m.attention_sinks)
    if local and m.sliding_window:
        w, B = int(m.sliding_window), ctx.seqs_per_microbatch
        S = np.asarray(N) // B
        nb = -(-S // w)
        R = B * nb * w * hq
        wq = wk = d_qk + (SINK_PAD if sink else 0)
        wv = d_qk + SINK_PAD if sink else d_v
        lk_p = -(-(2 * w + int(sink)) // MASK_ALIGN) * MASK_ALIGN
        blocks = R * wq + R * lk_p // w * (wk + wv) + B * nb * w * lk_p + R * wv + N * hq * d_v
        cb = cb - N * (hq * d_qk + hkv * (d_qk + d_v)) - N * hq * d_v + blocks
    elif sink:
        cb = cb + N * (SINK_PAD * (2 * hq + 2 * hkv) + hq * d_v)
    elif np.any(np.asarray(ctx.cp) > 1):   # the ring attention's output is copied for the o-projection
        cb = cb + N * hq * d_v * (np.asarray(ctx.cp) > 1)
    return cb, cf


def sac_saved_counts(ctx: Ctx, kind: str):
    """``(b-byte, fp32)`` elements op-level SAC keeps of one layer (``planner.runtime.fsdp2_layout
    .sac_policy``, torchtitan's): the SDPA output ``N·h_q·d_v`` and its lse ``N·h_q`` (fp32), and
    the outputs of the odd-numbered matmuls of the layer in order, the router's excluded and the
    routed experts' grouped MLP not an ``aten.mm`` (GQA: q, v of ``q, k, v, o``; MLA: the first and
    third of ``[q_a,] q(_b), kv_a, kv_b, o``; then the dense FFN's or shared experts' ``gate, up,
    down``). The checkpoint input is counted apart. Qwen3 W8 selective forward[2]: per layer
    ``attention.py`` q 128 and v 16 MiB, ``sdpa.py`` 128 + 2 MiB, no k, o-proj or expert rows."""
    m = ctx.model
    N, H = ctx.tokens_per_rank, ctx.hidden_size
    hq, hkv, d_qk, d_v = dims(ctx)
    if m.attention == "mla" and m.mla is not None:
        a = m.mla
        mms = ([ceil_div(a.q_lora_rank, ctx.tp)] if a.q_lora_rank else []) + [
            hq * d_qk, a.kv_lora_rank + a.qk_rope_head_dim, hq * (a.qk_nope_head_dim + d_v), H]
    else:
        mms = [hq * d_qk, hkv * d_qk, hkv * d_v, H]
    I = ceil_div(ctx.dense_ffn, ctx.tp) if kind == "dense_mlp" else ceil_div(m.shared_expert_ffn or 0, ctx.tp)
    if I:
        mms += [I, I, H]
    kept = sum(w for j, w in enumerate(mms) if j % 2 == 0)
    return N * (kept + hq * d_v), N * hq
