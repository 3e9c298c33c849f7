"""Live set ``workspace``: in-allocator kernel workspaces (DESIGN §3.1), measured per cluster.

    cuBLAS + cuBLASLt workspaces   n_hd · profile constants   every phase (the optimizer's too), from the first step on
                                   (n_hd = 2 handles: the forward's thread and autograd's
                                   backward thread; cuBLAS keys a workspace by handle and stream,
                                   and the allocator keeps both)
    FlashAttention backward        global attention layers (composed stack), the kernel's own
                                   buffers (planner.budget.attention_backward; S_k, d_k, h_l there):
                                   fp32 dq_accum + softmax_d 4·B·⌈S_k⌉₁₂₈·h_l·(⌈d_k⌉₃₂ + 1),
                                   dk/dv expanded to h_l heads B·S_k·h_l·(d_k+d_vk)·b when GQA,
                                   contiguous copies of the output and its gradient 2·B·S_k·h_l·d_vk·b
                                   when its inputs are head-major (sinks)
    sliding-window layers          w_fa · N·n_h·d_qk bytes (the memory-efficient kernel's fp32
                                   accumulator; w_fa measured on the flash backward)
    MLA (efficient kernel)         4·N·n_h·d_v forward (fp32 output accumulator, max(d_qk,d_v) > 128),
                                   4·N·n_h·(d_qk + 1) backward (fp32 grad-q accumulator + delta)
                                   in place of the FlashAttention terms (planner.budget.attention_mla)

The FlashAttention terms are freed before the later sub-steps of the attention backward (QK-norm's
and attention_norm's fp32 RMSNorm backwards): they lose the larger later sub-step's lead over the
kernel's (``attention_backward.kernel_workspace``), so the phase holds ``max(kernel + workspace,
QK-norm backward, attention_norm backward)``. ``w_fa`` (the profile's
``flash_workspace_bytes_per_elem``, 8.03 on the H200: dq_accum 4 + softmax_d 4/d + the two copies
2·b at the calibration's head-major layout) is read by the sliding-window term and the FSDP2 layer.

Each value comes from the cluster profile and is marked ``assumed`` there until measured.
"""

from __future__ import annotations

import numpy as np

from planner.budget import attention_backward
from planner.budget.attention_sliding import local_regions
from planner.context.ctx import Ctx
from planner.budget.terms import PHASE_KINDS, Term

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
    m, N = ctx.model, ctx.tokens_per_rank
    regions = ("attention",) if ctx.stack == "composed" else tuple(
        k for k in ("moe", "dense_mlp") if k in set(ctx.regions))
    out = [
        Term("cuBLAS workspace", "workspace", BLAS_HANDLES * int(mem.cublas_workspace_bytes.value), 1,
             "n_hd·memory.cublas_workspace_bytes", EVERY_PHASE, source=SOURCE),
        Term("cuBLASLt workspace", "workspace", BLAS_HANDLES * int(mem.cublaslt_workspace_bytes.value), 1,
             "n_hd·memory.cublaslt_workspace_bytes", EVERY_PHASE, source=SOURCE),
    ]
    if ctx.stack == "fsdp2":   # FlashAttention's backward buffers: the attention sub-step of fsdp2_layer
        return out
    if m.attention == "mla":   # the memory-efficient kernel's buffers (planner.budget.attention_mla)
        from planner.budget import attention_mla

        return out + [
            Term("efficient attention forward fp32 output accumulator (excess over head_to_seq's buffers)",
                 "workspace", attention_mla.output_accumulator_excess_bytes(ctx), 1,
                 "max(0, 4·N·n_h·d_v [max(d_qk, d_v) > 128] − 2·N·n_h·d_v·b [D > 1]) (bytes)",
                 ("forward",), regions=regions, source=attention_mla.SOURCE + " (sdpa.py:56)"),
            Term("efficient attention backward fp32 grad-q accumulator + delta", "workspace",
                 attention_mla.backward_workspace_bytes(ctx), 1,
                 "max(0, 4·(N·n_h·d_qk + N·n_h) − the recompute sub-step's lead over the kernel's) (bytes)",
                 ("backward",), regions=regions,
                 source=attention_mla.SOURCE + " (ScaledDotProductEfficientAttentionBackward0)"),
        ]
    local = local_regions(ctx)
    net = attention_backward.kernel_workspace(ctx)

    def on_global(v):
        return lambda ph: 0 if ph.region in local else v

    lead = "; less the lead of the later QK-norm / attention_norm backward sub-step over the kernel's"
    src = SOURCE + "; " + attention_backward.SOURCE
    out += [
        Term("FlashAttention backward fp32 dq_accum + softmax_d", "workspace", net["accum"], 1,
             "4·B·⌈S_k⌉₁₂₈·h_l·(⌈d_k⌉₃₂ + 1) (bytes)" + lead, ("backward",), regions=regions,
             at=on_global(net["accum"]), source=src),
        Term("FlashAttention GQA dk/dv expansion", "workspace", net["expansion"], 1,
             "B·S_k·h_l·(d_k+d_vk)·b if h_kv < h_l (bytes)" + lead, ("backward",), regions=regions,
             at=on_global(net["expansion"]), source=src),
        Term("FlashAttention contiguous copies of the output and its gradient (head-major inputs: sinks)",
             "workspace", net["copies"], 1, "2·B·S_k·h_l·d_vk·b with sinks (bytes)" + lead, ("backward",),
             regions=regions, at=on_global(net["copies"]), source=src),
    ]
    if local:
        w_fa = mem.flash_workspace_bytes_per_elem.value
        acc = np.ceil(np.asarray(N * m.num_heads * m.head_dim) * w_fa).astype(np.int64)
        acc = int(acc) if np.ndim(acc) == 0 else acc
        out.append(Term("memory-efficient kernel backward fp32 accumulator (sliding-window layers)", "workspace",
                        acc, 1, "w_fa·N·n_h·d_qk (bytes)  [local layers]", ("backward",), regions=regions,
                        at=lambda ph: acc if ph.region in local else 0,
                        source=SOURCE + "; H200 gpt-oss-W8 backward[1]: ScaledDotProductEfficientAttentionBackward0 "
                        "512.1 MiB block"))
    return out
