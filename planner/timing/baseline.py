"""The FSDP2 baseline's step (DESIGN §2), one region per layer (``step.py`` holds the outer shape).

Layout (torchtitan style): ``W = dp_shard·cp·tp``; a rank holds ``N = S/cp`` tokens of a sequence
(sequence-parallel ``N/tp`` outside the TP blocks); attention heads and the FFN widths over ``tp``;
experts over ``ep`` (standard all-to-all EP, ``dispatch.py``, on the ``N/tp`` sequence-parallel
tokens; no expert TP); FSDP over the ``dp_shard·cp`` ranks (experts over ``dp_shard·cp/ep``).

Per layer and micro-step:

- TP (``tp > 1``): an all-gather of ``N·H·b`` before and a reduce-scatter of it after each of the
  attention and the FFN block (shared experts / dense FFN), reversed in backward.
- CP (``cp > 1``): ring attention: ``cp`` causal blocks of ``S/cp`` per rank (``cp·t(S/cp)``), the
  ``cp−1`` K/V hops (``N·n_kv/tp·(d_qk+d_v)·b`` bytes) beside the blocks; backward sends K/V and
  their gradients.
- FSDP: the layer's bf16 all-gather (dense part ``/tp``, and the ``E/ep`` local experts) in
  forward, again in backward (``reshard_after_forward=True``), and the fp32 reduce-scatter of the
  gradients (``reduce_dtype=fp32``), each prefetched beside the neighbouring layer's compute:
  forward ``max(F, G)``, backward ``max(R + B, G + RS)``. With ``CPUOffloadPolicy`` each gather
  first copies the fp32 shard up and each reduce-scatter copies the fp32 gradient shard down.
  ``G`` and ``RS`` include FSDP2's own copies at the HBM rate (``GATHER_*_BYTES``,
  ``REDUCE_*_BYTES``): the fp32 → bf16 cast and the copy-in of the shard, the copy-out of the
  gathered parameters, the bf16 → fp32 ``chunk_cat`` of the gradients, the input-to-output copy of
  a one-rank group and, when gradients are kept, the fp32 accumulation; at W = 1 they are all of
  ``G`` and ``RS``.
- Host (``baseline_host.py``): each layer's forward and backward, the head, the optimizer and the
  embedding take GPU seconds **plus** the host seconds outside the expert loops that
  ``calibration.step_host`` measures (they add up: the dispatch's synchronising copies drain the GPU
  at every MoE layer, and the hooks and planning run while it waits). The expert loops are the
  dispatch model's, which paces each block at the slower of its host launches and its kernels.
- Optimizer: fused AdamW on the ``Θ/W`` fp32 shards on the GPU, or on the host at the CPU AdamW
  rate (``CPUOffloadPolicy``; fp32 grads arrive with the reduce-scatter, no casts).
"""

from __future__ import annotations

import numpy as np

from planner.budget import regions as R
from planner.context.ctx import Ctx
from planner.timing import baseline_host as BH
from planner.timing import flops as F
from planner.timing.comm import collective_s, host_copy_s, ranks_per_node
from planner.timing.regions import ELEM_BWD_FACTOR, attention_region, gemms_s, knobs, merge_passes, moe_profile
from planner.timing.compute import Lookups, elementwise_s
from planner.timing.dispatch import moe_dispatch_s
from planner.timing.offload import cpu_threads_per_gpu, gpu_adamw_s, host_adamw_s
from planner.timing.ops import dense_head_s
from planner.units import ceil_div


GATHER_SHARD_BYTES = 10
"""Per parameter of an FSDP2 all-gather's local shard: the fp32 → bf16 cast of
``MixedPrecisionPolicy(param_dtype=bf16)`` (reads 4, writes 2) and ``all_gather_copy_in``'s
``_foreach_copy_`` into the flat input (2 + 2)."""
GATHER_FULL_BYTES = 4
"""Per gathered parameter: ``split_with_sizes_copy`` out of the flat output (2 + 2)."""
REDUCE_FULL_BYTES = 6
"""Per unsharded gradient element: ``chunk_cat`` of the bf16 gradients into the fp32 reduce input
(``reduce_dtype=fp32``: reads 2, writes 4)."""
REDUCE_SOLO_BYTES = 8
"""Per element when the reduce group has one rank: FSDP2 copies the input to the output instead of
a reduce-scatter (4 + 4)."""
GRAD_ACCUMULATE_BYTES = 12
"""Per sharded parameter when the gradients are kept (``accumulate``): ``grad += new`` (fp32,
reads 8, writes 4)."""


def _tp_pair(lk: Lookups, tp, nbytes):
    """All-gather + reduce-scatter of ``nbytes`` (gathered size) over ``tp`` (0 for ``tp = 1``)."""
    return collective_s(lk, "all_gather", tp, nbytes) + collective_s(lk, "reduce_scatter", tp, nbytes)


def build(ctx: Ctx, lk: Lookups, micro, opt):
    """Book the FSDP2 baseline's micro-step and optimizer parts; returns (tokens, model FLOPs) per
    rank per micro-step (``N/tp`` distinct tokens)."""
    m, b, W, H = ctx.model, ctx.act_bytes, ctx.world_size, ctx.hidden_size
    N, tp, cp, dp, ep = (np.asarray(getattr(ctx, f)) for f in ("tokens_per_rank", "tp", "cp", "dp_shard", "ep"))
    tp_s = int(np.unique(tp)[0]) if np.unique(tp).size == 1 else tp
    fsdp = dp * cp
    n_sp = N / tp
    ranks = ranks_per_node(lk, W)
    recompute = {"full": 1.0, "selective": 0.0, "none": 0.0}[ctx.ac]

    at = attention_region(ctx, lk, N, 1, tp=tp_s, cp=cp)
    n_h, n_kv, d_qk, d_v = F.head_dims(m)
    kv = np.asarray(N, dtype=float) * n_kv / tp * (d_qk + d_v) * b
    hop = collective_s(lk, "p2p_ring", cp, kv)
    cp_f = np.where(cp > 1, (cp - 1) * np.maximum(0.0, hop - at["core_f"] / cp), 0.0)
    hop_b = collective_s(lk, "p2p_ring", cp, 2 * kv)
    cp_b = np.where(cp > 1, (cp - 1) * np.maximum(0.0, hop_b - at["core_b"] / cp), 0.0)
    tp_att = _tp_pair(lk, tp, np.asarray(N, dtype=float) * H * b)
    F_l = {"compute_dense": at["gemm_f"], "compute_attention": at["core_f"], "elementwise": at["elem_f"],
           "cp_ring": cp_f, "tp_collectives": tp_att}
    B_l = {"compute_dense": at["gemm_b"], "compute_attention": at["core_b"], "elementwise": at["elem_b"],
           "cp_ring": cp_b, "tp_collectives": tp_att}

    host = BH.row(lk, m, ctx.ac)
    if host is not None and np.any(np.asarray(W) > 1):
        lk.assume("FSDP2 host seconds outside the expert loops at W > 1: those calibration.step_host measured "
                  "on one GPU (FSDP2's hooks, the dispatch's planning); no multi-GPU step measured")
    layers = []
    dense_attn = R.attention_region_params(m)
    if m.num_moe_layers:
        d_f, d_b = gemms_s(lk, F.moe_dense_gemms(m, n_sp))
        op = moe_dispatch_s(lk, "ep", n_sp, m.num_experts, m.top_k, ep, 1, H, m.expert_ffn, b,
                            profile=moe_profile(ctx), knobs=knobs(ctx), comm=True)
        # the dispatch paces its expert blocks at the slower of host and GPU: the loops' host time is
        # in these seconds; the host model adds what runs outside the loops (baseline_host.py)
        e_f, e_b = op["elem_fwd"], op["elem_bwd"]
        elem = elementwise_s(lk, n_sp * (5 * H * b + 12 * m.num_experts))
        shared = _tp_pair(lk, tp, np.asarray(N, dtype=float) * H * b) if m.shared_expert_ffn else 0.0
        f = {"compute_dense": d_f, "compute_experts": op["compute_fwd"], "elementwise": elem + e_f,
             "a2a_dispatch": op["comm_fwd"], "tp_collectives": shared}
        bw = {"compute_dense": d_b, "compute_experts": op["compute_bwd"],
              "elementwise": ELEM_BWD_FACTOR * elem + e_b, "a2a_dispatch": op["comm_bwd"],
              "tp_collectives": shared}
        dense = dense_attn + R.moe_region_dense_params(m)
        experts = m.num_experts // ep * m.expert_params()
        layers.append(("moe", m.num_moe_layers, f, bw, dense, experts, m.num_experts // ep))
    if m.num_dense_layers:
        d_f, d_b = gemms_s(lk, F.dense_ffn_gemms(m, N, tp_s))
        elem = elementwise_s(lk, np.asarray(N, dtype=float) * (5 * H / tp + 5 * m.dense_ffn / tp) * b)
        pair = _tp_pair(lk, tp, np.asarray(N, dtype=float) * H * b)
        layers.append(("dense", m.num_dense_layers,
                       {"compute_dense": d_f, "elementwise": elem, "tp_collectives": pair},
                       {"compute_dense": d_b, "elementwise": ELEM_BWD_FACTOR * elem, "tp_collectives": pair},
                       dense_attn + R.dense_region_params(m), 0, 0))

    for kind, n, f, bw, dense, experts, local in layers:
        fwd = {k: f.get(k, 0.0) + F_l.get(k, 0.0) for k in dict.fromkeys([*f, *F_l])}  # insertion order: no hash-seed-dependent sums
        bwd = {k: bw.get(k, 0.0) + B_l.get(k, 0.0) for k in dict.fromkeys([*bw, *B_l])}
        rec = fwd if recompute else {"elementwise": fwd["elementwise"]} if ctx.ac == "selective" else {}
        gath, red = _fsdp_comm(lk, ctx, dense / tp, experts, fsdp, ep, b, ranks)
        micro.overlap(fwd, gath, "fsdp_gather", n, "forward")
        micro.overlap(merge_passes(rec, bwd, bool(rec)), gath + red, "fsdp_reduce", n, "backward")
        micro.note_recompute(rec, n)
        if host is not None:   # GPU + host (baseline_host.py)
            h_f, h_b = BH.layer(host, kind)
            micro.add("host_exposed", h_f, n, "forward")
            micro.add("host_exposed", h_b, n, "backward")

    # head and embedding (FSDP units of V·H/tp)
    V = ctx.vocab_size
    cols = ceil_div(V, tp)
    h = dense_head_s(lk, N, H, V, b, cols=cols)
    tp_head = _tp_pair(lk, tp, np.asarray(N, dtype=float) * H * b)
    g_head, r_head = _fsdp_comm(lk, ctx, cols * H, 0, fsdp, ep, b, ranks)
    micro.overlap({"compute_head": h["gemm_fwd"] + h["gemm_bwd"],
                         "elementwise": h["fwd"] + h["bwd"] - h["gemm_fwd"] - h["gemm_bwd"], "tp_collectives": tp_head},
                        g_head + r_head, "fsdp_head", phase="head")
    g_emb, r_emb = _fsdp_comm(lk, ctx, cols * H, 0, fsdp, ep, b, ranks)
    micro.add("fsdp_embedding", g_emb + r_emb)
    if host is not None:
        micro.add("host_exposed", BH.outside(host, "head"), phase="head")
        micro.add("host_exposed", BH.outside(host, "embedding"))

    theta = ceil_div(ctx.num_params, W)
    if ctx.cpu_offload:
        opt.add("optimizer_cpu_host", host_adamw_s(lk, theta, cpu_threads_per_gpu(lk), casts=False, ranks=ranks))
        opt.add("optimizer_gpu", 0.0)
    else:
        opt.add("optimizer_gpu", gpu_adamw_s(lk, theta))
        opt.add("optimizer_cpu_host", 0.0)
    if host is not None:
        opt.add("host_exposed", BH.outside(host, "optimizer"))
    return n_sp, F.model_flops(m, n_sp, ctx.seq_len)


def _fsdp_comm(lk: Lookups, ctx: Ctx, dense_params, expert_params, fsdp, ep, b: int, ranks: int):
    """(gather, reduce) seconds of one FSDP unit: bf16 all-gathers of the dense part over
    ``dp_shard·cp`` and the experts over ``dp_shard·cp/ep``, fp32 reduce-scatters; with CPU offload
    the fp32 shard copies (up before a gather, down after a reduce-scatter)."""
    dense = np.asarray(dense_params, dtype=float)
    exp = np.asarray(expert_params, dtype=float)
    g_exp = np.maximum(fsdp // np.maximum(ep, 1), 1)
    gather = collective_s(lk, "all_gather", fsdp, dense * b) + collective_s(lk, "all_gather", g_exp, exp * b)
    reduce = collective_s(lk, "reduce_scatter", fsdp, dense * 4) + collective_s(lk, "reduce_scatter", g_exp, exp * 4)
    shards = dense / fsdp + exp / g_exp
    solo = np.where(fsdp == 1, dense, 0.0) + np.where(g_exp == 1, exp, 0.0)   # groups of one: a copy_
    acc = GRAD_ACCUMULATE_BYTES if ctx.grad_lifetime == "accumulate" and not ctx.cpu_offload else 0
    if ctx.grad_lifetime == "accumulate" and ctx.cpu_offload:
        lk.assume("FSDP2 CPU offload with kept gradients: the fp32 accumulation into the host gradient runs on "
                  "the host and is not booked")
    gather = gather + elementwise_s(lk, GATHER_SHARD_BYTES * shards + GATHER_FULL_BYTES * (dense + exp))
    reduce = reduce + elementwise_s(lk, REDUCE_FULL_BYTES * (dense + exp) + REDUCE_SOLO_BYTES * solo + acc * shards)
    if ctx.cpu_offload:
        shard = 4.0 * (dense / fsdp + exp / g_exp)
        up, down = host_copy_s(lk, "h2d", shard, ranks=ranks), host_copy_s(lk, "d2h", shard, ranks=ranks)
        gather, reduce = gather + up, reduce + down
    return gather, reduce
