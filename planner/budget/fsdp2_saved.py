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


def rot_dim(ctx: Ctx) -> int:
    """``d_rot``: the channels RoPE rotates per head (MLA's ``qk_rope_head_dim``, else the head width)."""
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


def qk_norm_counts(ctx: Ctx) -> tuple:
    """``(b elements, fp32 elements)`` QK-norm's RMSNorm over q and k keeps without SAC: its normed
    output, fp32 copy and rsqrt, ``N·(h_q+h_kv)·(d_qk (b), d_qk + 1 (fp32))`` (0 without QK-norm)."""
    if not ctx.model.qk_norm:
        return 0, 0
    hq, hkv, d_qk, _ = dims(ctx)
    N = ctx.tokens_per_rank
    return N * (hq + hkv) * d_qk, N * (hq + hkv) * (d_qk + 1)


def attention_saved_counts(ctx: Ctx, selective: bool, local: bool, seq_group: int = 1):
    """``(b-byte elements, fp32 elements)`` autograd keeps of one layer's attention.

    ``seq_group``: ``D``, the composed stack's Ulysses degree (1: the baseline, and the composed
    step at ``D = 1``). With ``D > 1`` the kernel runs on the head layout (all ``S = D·N/B`` tokens
    of ``h_q/D`` heads; the same element counts per rank), the o-projection keeps the sequence-layout
    copy that ``head_to_seq`` makes, ``N·h_q·d_v``, and MLA's ``k_nope | v`` block is freed once
    ``v`` is copied for the exchange (H200 allocator history of the composed step without
    checkpointing, ``bench/results/memory_snapshot/dsv2-W8-S8192-no-checkpoint.json``: per MLA
    region ``attention.py`` seq_to_head q, k, v 6 + 6 + 4 MiB, head_to_seq 4 MiB, no ``kv_b``
    output).

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
    cb, cf = eb * N_sp, ef * N_sp + N * rot_dim(ctx)
    if selective:
        return cb, cf
    qb, qf = qk_norm_counts(ctx)
    cb, cf = cb + qb, cf + qf + N * boundaries.latent_norm_fp32(ctx)
    D = seq_group
    if m.attention == "mla" and m.mla is not None:
        cb = cb + N * hq * m.mla.qk_nope_head_dim * (np.asarray(D) == 1)
    sink = bool(m.attention_sinks)
    if local and m.sliding_window:
        w, B = int(m.sliding_window), ctx.seqs_per_microbatch
        S = np.asarray(N) * D // B
        nb = -(-S // w)
        R = B * nb * w * hq // D
        wq = wk = d_qk + (SINK_PAD if sink else 0)
        wv = d_qk + SINK_PAD if sink else d_v
        lk_p = -(-(2 * w + int(sink)) // MASK_ALIGN) * MASK_ALIGN
        blocks = R * wq + R * lk_p // w * (wk + wv) + B * nb * w * lk_p + R * wv + N * hq * d_v
        cb = cb - N * (hq * d_qk + hkv * (d_qk + d_v)) - N * hq * d_v + blocks
    elif sink:
        cb = cb + N * (SINK_PAD * (2 * hq + 2 * hkv) + hq * d_v)
    else:   # the o-projection's input is a copy: head_to_seq's (D > 1), the ring attention's (cp > 1)
        cb = cb + N * hq * d_v * ((np.asarray(D) > 1) | (np.asarray(ctx.cp) > 1))
    return cb, cf


SAC_SOURCE = (
    "planner.runtime.fsdp2_layout.sac_policy (addmm, topk and the SDPA kernels in its save list; only mm/linear "
    "alternate); CPU whole-step trace (tests/trace/test_fsdp2_trace.py, gpt-oss case: every addmm output of "
    "q, k, v, o and the router, and topk, saved); H200 allocator marks of planner validate's step, gpt-oss-20b "
    "W8 S8192 ac = selective (bench/results/allocator_modes/fsdp2-gptoss-W8-selective-expandable.json): the "
    "forward[2] − forward[1] start marks exceed the budget that alternated the biased projections by "
    "64880640 B = 7920 B/token = k 1024 + o-proj 5760 + sink-padded SDPA output 1024 + router logits 64 + "
    "top-k 48; Qwen3 W8 selective forward[2]: attention.py q 128 and v 16 MiB, sdpa.py 128 + 2 MiB")


FFN_MMS = ("gate", "up", "down", "shared gate")
"""The FFN's matmuls in layer order (dense FFN or shared experts): ``stage`` leaves out the ones a
sub-step runs before."""


def sac_saved_parts(ctx: Ctx, kind: str, local: bool = False, current: bool = False,
                    stage: str | None = None) -> list[tuple]:
    """``[(name, count, elem_bytes, formula)]`` (``elem_bytes`` None: ``b``): what op-level SAC
    keeps of one layer (``planner.runtime.fsdp2_layout.sac_policy``, torchtitan's; ``SAC_SOURCE``).

    - the matmul outputs: a biased projection is an ``addmm``, always saved (q, k, v, o under
      ``attention_bias``, MLA's are bias-free); the bias-free ones are ``mm``s, of which every second
      is saved, counted in layer order over ``[q_a,] q(_b), kv_a, kv_b, o`` (MLA) or ``q, k, v, o``
      (GQA), then the dense FFN's or shared experts' ``gate, up, down`` and the shared-expert gate
      (width 1); the router's bias-free ``mm`` is recomputed and the routed experts' grouped MLP
      (``mm.out``) is not in the list;
    - the router's ``addmm`` logits ``N_sp·E`` under ``router_bias`` (DeepSeek-V3's ``router_bias``
      is a selection correction after a bias-free linear: booked too, erring high) and its ``topk``:
      values ``N_sp·k`` (fp32 probabilities) and ids ``N_sp·k`` (int64); the group-limited router's
      two group top-ks are not counted; ``current``: the layer whose dispatch is running, whose
      top-k values ``D`` already counts (``ROUTER_WEIGHTS``), so they are left out;
    - the SDPA output and its lse (fp32) over the kernel's rows: ``N`` (global), ``N + B`` with
      sinks (the dummy query row), ``B·n_b·w`` on a sliding-window layer (lse rows rounded up to 32
      per block, the memory-efficient kernel's), each row ``h_q·d_o`` wide, ``d_o = d_qk + SINK_PAD``
      with sinks (v is padded to q's width), else ``d_v``.

    ``stage``: the current layer's sub-step, before which its FFN's later matmul outputs do not exist
    yet: ``"dispatch"`` (the routed experts run before the shared experts: none of theirs),
    ``"mlp"`` (inside the gated MLP: its gate and up, not its down projection nor the shared gate).
    H200 allocator history (``bench/results/memory_snapshot/fsdp2-dsv2-W1-selective.json``,
    forward[1] inside layer 0's dense FFN: q, kv_b, the SDPA output, four ``N·I_d`` blocks and no
    ``N·H`` down output) and the held-out DeepSeek-V2-Lite runs (``validate_heldout.json``:
    forward[1] was ``N·H·b`` over, forward[2] ``N·(I_s + H)·b`` over).

    The checkpoint input is counted apart (``planner.budget.fsdp2_boundaries``)."""
    m = ctx.model
    N, H = ctx.tokens_per_rank, ctx.hidden_size
    N_sp = ceil_div(N, ctx.tp)
    hq, hkv, d_qk, d_v = dims(ctx)
    biased = bool(m.attention_bias) and m.attention != "mla"
    if m.attention == "mla" and m.mla is not None:
        a = m.mla
        mms = ([("q_a", ceil_div(a.q_lora_rank, ctx.tp))] if a.q_lora_rank else []) + [
            ("q", hq * d_qk), ("kv_a", a.kv_lora_rank + a.qk_rope_head_dim),
            ("kv_b", hq * (a.qk_nope_head_dim + d_v)), ("o", H)]
    else:
        mms = [("q", hq * d_qk), ("k", hkv * d_qk), ("v", hkv * d_v), ("o", H)]
    mms = [(n, w, biased) for n, w in mms]
    I = ceil_div(ctx.dense_ffn, ctx.tp) if kind == "dense_mlp" else ceil_div(m.shared_expert_ffn or 0, ctx.tp)
    if I:
        mms += [("gate", I, False), ("up", I, False), ("down", H, False)]
        if kind == "moe" and m.shared_expert_gate:
            mms.append(("shared gate", 1, False))
    later = {"dispatch": set(FFN_MMS), "mlp": {"down", "shared gate"}}.get(stage, set())
    kept, j = [], 0
    for n, w, bias in mms:
        if (bias or j % 2 == 0) and n not in later:
            kept.append((n, w))
        j += 0 if bias else 1
    out = [("SAC-saved matmul outputs (" + ", ".join(n for n, _ in kept) + ")", N * sum(w for _, w in kept),
            None, "N·(" + " + ".join(n for n, _ in kept) + " widths) (addmm every one, mm every second)")]
    if kind == "moe":
        E, k = ctx.num_experts, ctx.top_k
        if m.router_bias:
            out.append(("SAC-saved router logits (addmm)", N_sp * E, None, "N_sp·E [router_bias]"))
        if not current:
            out.append(("SAC-saved top-k values (fp32)", N_sp * k, 4, "N_sp·k"))
        out.append(("SAC-saved top-k ids (int64)", N_sp * k, 8, "N_sp·k"))
    sink = bool(m.attention_sinks)
    d_o = d_qk + SINK_PAD if sink else d_v
    if local and m.sliding_window:
        w, B = int(m.sliding_window), ctx.seqs_per_microbatch
        nb = -(-(np.asarray(N) // B) // w)
        rows, lse_rows = B * nb * w, B * nb * (-(-w // 32) * 32)
        how, how_l = "B·n_b·w", "B·n_b·⌈w/32⌉·32"
    else:
        rows = N + ctx.seqs_per_microbatch * sink
        lse_rows, how = rows, "N + B·[sinks]"
        how_l = how
    out += [("SAC-saved SDPA output", rows * hq * d_o, None,
             f"{how}·h_q·" + ("(d_qk + SINK_PAD)" if sink else "d_v")),
            ("SAC-saved SDPA lse (fp32)", lse_rows * hq, 4, f"{how_l}·h_q")]
    return out


def sac_saved_counts(ctx: Ctx, kind: str, local: bool = False, current: bool = False):
    """``(b-byte, fp32)`` elements of ``sac_saved_parts`` (an int64 counts as two fp32)."""
    cb = cf = 0
    for _, count, eb, _ in sac_saved_parts(ctx, kind, local, current):
        if eb is None:
            cb = cb + count
        else:
            cf = cf + count * (eb // 4)
    return cb, cf
