"""Live set ``workspace``: in-allocator kernel workspaces (DESIGN §3.1), measured per cluster.

    cuBLAS + cuBLASLt workspaces   n_hd · profile constants   every phase (the optimizer's too), from the first step on
                                   (n_hd = 2 handles: the forward's thread and autograd's
                                   backward thread; cuBLAS keys a workspace by handle and stream,
                                   and the allocator keeps both)
    FlashAttention backward        w_fa · N·n_h·d_qk bytes    backward of attention regions
                                   (fp32 dq_accum + softmax_d, per element of q)
    GQA dk/dv expansion            N·n_h·(d_qk+d_v)·b         backward, when n_kv < n_h
    MLA (efficient kernel)         4·N·n_h·d_v forward (fp32 output accumulator, max(d_qk,d_v) > 128),
                                   4·N·n_h·(d_qk + 1) backward (fp32 grad-q accumulator + delta)
                                   in place of the FlashAttention terms (planner.budget.attention_mla)

With QK-norm (composed stack) the attention backward's larger sub-step may be RMSNorm's fp32
backward over q, which runs after the kernel (its workspace freed): the two FlashAttention terms
lose that sub-step's lead over the layouts' (``attention.qk_norm_lead``), so the phase holds
``max(layouts + workspace, QK-norm backward)``.

Each value comes from the cluster profile and is marked ``assumed`` there until measured.
"""

from __future__ import annotations

import numpy as np

from planner.budget.attention import qk_norm_lead
from planner.context.ctx import Ctx
from planner.budget.terms import PHASE_KINDS, Term
from planner.units import ceil_div

SOURCE = "cluster profile memory constants (DESIGN §3.1 workspace)"
BLAS_HANDLES = 2
"""``n_hd``: cuBLAS handles that run matmuls in a step, one per thread (the forward's and autograd's
CUDA backward thread), each with its own workspace on the compute stream. The H200 validate run
measured 2 × (32 + 1) MiB allocated at every step start beyond the persistent state."""
EVERY_PHASE = PHASE_KINDS
"""The allocator never frees a cuBLAS workspace: it is allocated in the optimizer phase and at the
step start too (the H200 run: optimizer phase 66.5 MiB above a budget that left it out)."""


def terms(ctx: Ctx) -> list[Term]:
    """Workspace terms of one rank."""
    mem = ctx.cluster.memory
    m, N, b = ctx.model, ctx.tokens_per_rank, ctx.act_bytes
    n_h = m.num_heads
    n_kv = m.num_heads if m.attention == "mla" else m.num_kv_heads
    heads_div = ctx.tp if ctx.stack == "fsdp2" else 1
    hq, hkv = ceil_div(n_h, heads_div), ceil_div(n_kv, heads_div)
    regions = ("attention",) if ctx.stack == "composed" else tuple(
        k for k in ("moe", "dense_mlp") if k in set(ctx.regions))
    w_fa = mem.flash_workspace_bytes_per_elem.value
    fa = N * hq * m.head_dim * int(w_fa)
    exp = N * hq * (m.head_dim + m.v_dim) * b if hkv < hq else 0
    lead = qk_norm_lead(ctx)                    # QK-norm's backward sub-step above FlashAttention's
    fa_net = np.maximum(fa - lead, 0)
    exp_net = np.maximum(exp - np.maximum(lead - fa, 0), 0)
    fa_net, exp_net = (int(v) if np.ndim(v) == 0 else v for v in (fa_net, exp_net))
    under = "; less the lead of QK-norm's backward sub-step over the layouts'" if m.qk_norm else ""
    out = [
        Term("cuBLAS workspace", "workspace", BLAS_HANDLES * int(mem.cublas_workspace_bytes.value), 1,
             "n_hd·memory.cublas_workspace_bytes", EVERY_PHASE, source=SOURCE),
        Term("cuBLASLt workspace", "workspace", BLAS_HANDLES * int(mem.cublaslt_workspace_bytes.value), 1,
             "n_hd·memory.cublaslt_workspace_bytes", EVERY_PHASE, source=SOURCE),
        Term("FlashAttention backward dq_accum/softmax_d", "workspace", fa_net, 1,
             "w_fa·N·n_h·d_qk (bytes)" + under, ("backward",), regions=regions, source=SOURCE),
    ]
    if ctx.stack == "fsdp2":   # FlashAttention's backward buffers: the attention sub-step of fsdp2_layer
        return out[:2]
    if m.attention == "mla":   # the memory-efficient kernel's buffers (planner.budget.attention_mla)
        from planner.budget import attention_mla

        return out[:2] + [
            Term("efficient attention forward fp32 output accumulator (excess over head_to_seq's buffers)",
                 "workspace", attention_mla.output_accumulator_excess_bytes(ctx), 1,
                 "max(0, 4·N·n_h·d_v [max(d_qk, d_v) > 128] − 2·N·n_h·d_v·b [D > 1]) (bytes)",
                 ("forward",), regions=regions, source=attention_mla.SOURCE + " (sdpa.py:56)"),
            Term("efficient attention backward fp32 grad-q accumulator + delta", "workspace",
                 attention_mla.backward_workspace_elems(ctx), 4, "N·n_h·d_qk + N·n_h",
                 ("backward",), regions=regions,
                 source=attention_mla.SOURCE + " (ScaledDotProductEfficientAttentionBackward0)"),
        ]
    if hkv < hq:
        out.append(Term("FlashAttention GQA dk/dv expansion", "workspace", exp_net, 1,
                        "N·n_h·(d_qk+d_v)·b (bytes)" + under, ("backward",), regions=regions, source=SOURCE))
    return out
