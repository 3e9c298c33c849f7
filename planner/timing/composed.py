"""The composed (MoP) stack's step, region by region (``step.py`` holds the outer shape).

Per rank and micro-step (DESIGN §2): ``N`` tokens in the sequence layout; attention over the
whole sequence ``S`` with ``n_h/D`` heads after the Ulysses all-to-all; MoE regions through the
dispatch operator (``dispatch.py``) over ``E_p``; the head through the vocabulary operator
(``ops.py``); dense weights ZeRO-3 over ``W``; expert gradients reduce-scattered over the
``W/E_p`` replicas of a shard, the head shard's over ``W/P``.

Region inventories (forward; backward = the GEMMs' gradients, attention backward, the all-to-alls
reversed; elementwise backward = ``ELEM_BWD_FACTOR`` × forward):

    attention   norm, q/k/v (or MLA) projections on N tokens, Ulysses all-to-all of q, k, v
                (``N·(n_h·d_qk + n_kv·(d_qk+d_v))·b`` bytes) and of the output back (``N·n_h·d_v·b``),
                causal flash attention per sequence, o projection, residual;
                elementwise ``(5H + 2(n_h+n_kv)·d_qk + 2·qkv + 2·n_h·d_v)·b`` per token (norm 2H,
                residual 3H, rotary on q and k, the all-to-all layout copies)
    moe         norm, router GEMM and softmax/top-k (``12·E`` B per token), shared experts,
                the dispatch operator, residual
    dense_mlp   norm, gated FFN GEMMs, SwiGLU (``5·I_d·b``), residual
"""

from __future__ import annotations

import numpy as np

from planner.budget import regions as R
from planner.context.ctx import Ctx
from planner.budget.optimizer import rank_params
from planner.timing import flops as F
from planner.timing.comm import collective_s, ranks_per_node
from planner.timing.compute import Lookups, elementwise_s
from planner.timing.dispatch import moe_dispatch_s
from planner.timing.offload import cpu_offload_adamw_s, cpu_threads_per_gpu, gpu_adamw_s, sco_exposed_s, stream_adamw_s
from planner.timing.ops import dense_head_s, ring_dtp_s, vocab_parallel_s
from planner.timing.regions import ELEM_BWD_FACTOR, attention_region, gemms_s, knobs, merge_passes, moe_profile


def build(ctx: Ctx, lk: Lookups, micro, opt):
    """Book the composed stack's micro-step and optimizer parts; returns (tokens, model FLOPs) per
    rank per micro-step."""
    m, b, W, H = ctx.model, ctx.act_bytes, ctx.world_size, ctx.hidden_size
    N, D, E_p = (np.asarray(getattr(ctx, f)) for f in ("tokens_per_rank", "seq_parallel", "expert_parallel"))
    ckpt = ctx.checkpoint != "none"
    ranks = ranks_per_node(lk, W)

    at = attention_region(ctx, lk, N, D)
    F_att = {"compute_dense": at["gemm_f"], "compute_attention": at["core_f"], "elementwise": at["elem_f"],
             "a2a_ulysses": at["a2a_f"]}
    B_att = {"compute_dense": at["gemm_b"], "compute_attention": at["core_b"], "elementwise": at["elem_b"],
             "a2a_ulysses": at["a2a_b"]}
    p_att = R.attention_region_params(m)
    regions = {"attention": (F_att, B_att, collective_s(lk, "all_gather", W, p_att * b),
                             collective_s(lk, "reduce_scatter", W, p_att * b))}

    if m.num_moe_layers:
        d_f, d_b = gemms_s(lk, F.moe_dense_gemms(m, N))
        op = moe_dispatch_s(lk, ctx.dispatch, N, m.num_experts, m.top_k, E_p, ctx.num_chunks, H, m.expert_ffn, b,
                            profile=moe_profile(ctx), knobs=knobs(ctx), comm=True,
                            residue=getattr(ctx, "dispatch_residue", "source"))
        elem = elementwise_s(lk, np.asarray(N, dtype=float) * (5 * H * b + 12 * m.num_experts))
        F_moe = {"compute_dense": d_f, "compute_experts": op["compute_fwd"], "elementwise": elem + op["elem_fwd"],
                 "a2a_dispatch": op["comm_fwd"], "llep_imports": op["imports"] / 2}
        B_moe = {"compute_dense": d_b, "compute_experts": op["compute_bwd"],
                 "elementwise": ELEM_BWD_FACTOR * elem + op["elem_bwd"], "a2a_dispatch": op["comm_bwd"],
                 "llep_imports": op["imports"] / 2}
        p_moe = R.moe_region_dense_params(m)
        exp_layer = m.num_experts * m.expert_params() * b / E_p
        rs = collective_s(lk, "reduce_scatter", W, p_moe * b) + collective_s(lk, "reduce_scatter", W // E_p, exp_layer)
        regions["moe"] = (F_moe, B_moe, collective_s(lk, "all_gather", W, p_moe * b), rs)
    if m.num_dense_layers:
        d_f, d_b = gemms_s(lk, F.dense_ffn_gemms(m, N))
        elem = elementwise_s(lk, np.asarray(N, dtype=float) * (5 * H + 5 * m.dense_ffn) * b)
        p_d = R.dense_region_params(m)
        regions["dense_mlp"] = ({"compute_dense": d_f, "elementwise": elem},
                                {"compute_dense": d_b, "elementwise": ELEM_BWD_FACTOR * elem},
                                collective_s(lk, "all_gather", W, p_d * b),
                                collective_s(lk, "reduce_scatter", W, p_d * b))

    counts = {"moe": m.num_moe_layers, "dense_mlp": m.num_dense_layers}
    t_fwd, t_rb = {}, {}
    G_att, RS_att = regions["attention"][2], regions["attention"][3]
    for kind, n in counts.items():
        if not n:
            continue
        Ff, Bf, Gf, RSf = regions[kind]
        # forward: attention beside the FFN region's gather, the FFN region beside the next gather
        ta = micro.overlap(F_att, Gf, "zero3_gather", n, "forward")
        t_fwd[kind] = micro.overlap(Ff, G_att, "zero3_gather", n, "forward")
        # backward: recompute + backward beside the next region's gather and the reduce-scatter of
        # the region just finished (both of the other kind)
        t_rb[kind] = micro.overlap(merge_passes(Ff, Bf, ckpt), G_att + RS_att, "zero3_reduce", n, "backward")
        tb_a = micro.overlap(merge_passes(F_att, B_att, ckpt), Gf + RSf, "zero3_reduce", n, "backward")
        if ckpt:
            micro.note_recompute(Ff, n)
            micro.note_recompute(F_att, n)
        t_fwd.setdefault("attention", ta)
        t_rb.setdefault("attention", tb_a)

    t_head = _head(ctx, lk, micro, N)
    VHb = ctx.vocab_size * H * b
    micro.add("zero3_embedding", collective_s(lk, "all_gather", W, VHb) + collective_s(lk, "reduce_scatter", W, VHb))
    if ctx.checkpoint == "sco":
        sco = sco_exposed_s(lk, ctx.regions, ctx.num_offloaded, N * H * b, t_fwd, t_rb, t_head, ranks=ranks)
        micro.add("sco_exposed", sco["offload"] + sco["overhead"], phase="forward")
        micro.add("sco_exposed", sco["restore"], phase="backward")
    _optimizer(ctx, lk, opt, ranks)
    return N, F.model_flops(m, N, ctx.seq_len)


def _head(ctx: Ctx, lk: Lookups, micro, N):
    """Book the head phase; returns its seconds."""
    b, W, H, V = ctx.act_bytes, ctx.world_size, ctx.hidden_size, ctx.vocab_size
    P = np.asarray(ctx.vocab_parallel)
    zero3 = collective_s(lk, "all_gather", W, V * H * b) + collective_s(lk, "reduce_scatter", W, V * H * b)
    if ctx.vocab == "dense":
        h = dense_head_s(lk, N, H, V, b)
        comm, hops = zero3, 0.0
    elif ctx.vocab == "ring_dtp":
        h = ring_dtp_s(lk, N, H, V, P, ctx.vocab_blocks, b, comm=True)
        hops = h["hops_fwd"] + h["hops_bwd"]
        shard = -(-V // P) * H * b
        comm = np.where(P == 1, zero3, collective_s(lk, "reduce_scatter", W // P, shard))
    else:
        h = vocab_parallel_s(lk, N, H, V, P, b, comm=True)
        hops = h["comm_fwd"] + h["comm_bwd"]
        comm = collective_s(lk, "reduce_scatter", W // P, -(-V // P) * H * b)
    compute = {"compute_head": h["gemm_fwd"] + h["gemm_bwd"],
               "elementwise": h["fwd"] + h["bwd"] - h["gemm_fwd"] - h["gemm_bwd"] - hops,
               "ring_hops" if ctx.vocab == "ring_dtp" else "vocab_comm": hops}
    return micro.overlap(compute, comm, "zero3_head", phase="head")


def _optimizer(ctx: Ctx, lk: Lookups, opt, ranks: int) -> None:
    theta = rank_params(ctx)
    zero = 0.0
    if ctx.optimizer == "stream_offload":
        r = stream_adamw_s(lk, theta, ctx.bucket_params, ctx.staging_slots, ranks=ranks)
        opt.add("optimizer_stream", r["total"])
    elif ctx.optimizer == "cpu_offload":
        r = cpu_offload_adamw_s(lk, theta, cpu_threads_per_gpu(lk), act_bytes=ctx.act_bytes, ranks=ranks)
        opt.add("optimizer_cpu_copies", r["d2h"] + r["h2d"])
        opt.add("optimizer_cpu_host", r["host"])
    else:
        opt.add("optimizer_gpu", gpu_adamw_s(lk, theta, working_bf16=ctx.act_bytes < 4))
        opt.add("optimizer_stream", zero)
        opt.add("optimizer_cpu_host", zero)
