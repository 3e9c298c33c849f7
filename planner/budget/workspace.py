"""Live set ``workspace``: in-allocator kernel workspaces (DESIGN §3.1), measured per cluster.

    cuBLAS workspace               n_hd · memory.cublas_workspace_bytes, every phase (the optimizer's
                                   too), from the first step on (n_hd = 2 handles: the forward's
                                   thread and autograd's backward thread; cuBLAS keys a workspace by
                                   handle and stream, and the allocator keeps both)
    cuBLASLt workspace             n_lt · memory.cublaslt_workspace_bytes, every phase, where
                                   n_lt = [a biased linear] · (1 + [the backward re-runs it])
                                   (``blaslt_handles``: the rule and its PyTorch source)
    FlashAttention backward        global attention layers (composed stack), the kernel's own
                                   buffers (planner.budget.attention_backward; S_k, d_k, h_l there):
                                   fp32 dq_accum + softmax_d 4·B·⌈S_k⌉₁₂₈·h_l·(⌈d_k⌉₃₂ + 1),
                                   dk/dv expanded to h_l heads B·S_k·h_l·(d_k+d_vk)·b when GQA,
                                   contiguous copies of the output and its gradient 2·B·S_k·h_l·d_vk·b
                                   when its inputs are head-major (sinks)
    sliding-window layers          w_fa · N·n_h·d_qk bytes (the memory-efficient kernel's fp32
                                   accumulator; w_fa measured on the flash backward)
    MLA (efficient kernel)         4·N·n_h·d_v forward (fp32 output accumulator, max(d_qk,d_v) > 128),
                                   backward: the CUTLASS workspace (grad_k/grad_v staging for
                                   the split keys, grad-q tiles) and delta, fp32
                                   (attention_mla.backward_workspace_elems)
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
CUDA backward thread), each with its own workspace on the compute stream. The H200 allocator
histories hold two 32 MiB blocks at every step start beyond the persistent state (the forward's
first matmul and the backward's), whatever the model."""
EVERY_PHASE = PHASE_KINDS
"""The allocator never frees a cuBLAS workspace: it is allocated in the optimizer phase and at the
step start too (the H200 run: optimizer phase 66.5 MiB above a budget that left it out)."""
LT_SOURCE = ("PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp (read at pytorch/pytorch@26a3905, not checked "
             "against the 2.11 tag the H200 runs; bench/results/blas_workspaces measured the counts below) "
             "getCUDABlasLtWorkspace (a map of its "
             "own keyed by handle and stream unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=1; each entry "
             "getCUDABlasLtWorkspaceSize() = min(CUBLASLT_WORKSPACE_SIZE, 1024 KiB default, the cuBLAS "
             "workspace)); aten/src/ATen/native/cuda/Blas.cpp isInputCompliesAddmmCudaLt (the Lt path: "
             "addmm with beta = 1 and a contiguous 1-D bias, i.e. F.linear with a bias; mm/bmm/baddbmm "
             "take it only under preferred_blas_library('cublaslt'), the default being cuBLAS); H200 "
             "allocator histories (bench/results/memory_snapshot): 1 MiB blocks at the first biased "
             "linear of each thread, none for Qwen3 and DeepSeek-V2-Lite; the calibration's 1 MiB (not 0) "
             "says the H200's torch keeps the two maps apart")


def biased_linear(m) -> bool:
    """Whether the decoder runs an ``F.linear`` with a bias (``addmm`` on cuBLASLt's bias epilogue):
    q/k/v/o with ``attention_bias`` outside MLA (the runtime builds MLA projections bias-free) or a
    router with ``router_bias``. DeepSeek-V3's ``router_bias`` is the selection correction added
    after a bias-free linear; it is booked too (erring high by ``blaslt_bytes``: the family table
    that tells the two apart is the runtime's, ``planner.runtime.model_layers.FAMILIES``)."""
    return bool((m.attention_bias and m.attention != "mla") or (m.router_bias and m.is_moe))


def blaslt_handles(ctx: Ctx) -> int:
    """``n_lt``: the (handle, stream) pairs that hold a cuBLASLt workspace.

    The workspace is allocated at a thread's first cuBLASLt call and kept (``LT_SOURCE``); in a
    training step only a biased linear makes that call (its backward is two ``mm``s and a sum). The
    forward's thread runs every biased linear; autograd's backward thread runs one only when the
    backward re-runs the forward of a region that holds one: the composed stack (every region
    checkpointed) and FSDP2 ``ac = full``. FSDP2 ``ac = selective`` saves ``addmm`` outputs
    (torchtitan's op list, ``planner.runtime.fsdp2_layout.sac_save_ops``) and ``ac = none``
    recomputes nothing. H200: gpt-oss-20b composed and FSDP2 tp = 8 (ac full) each allocated two
    1 MiB blocks (forward and backward threads), Qwen3-30B-A3B and DeepSeek-V2-Lite none."""
    if not biased_linear(ctx.model):
        return 0
    return 1 + int(ctx.stack == "composed" or ctx.ac == "full")


def blaslt_bytes(ctx: Ctx) -> int:
    """Bytes of the cuBLASLt workspaces one rank holds from its first step on: ``n_lt`` times the
    profile's ``memory.cublaslt_workspace_bytes`` (1 MiB on the H200)."""
    return blaslt_handles(ctx) * int(ctx.cluster.memory.cublaslt_workspace_bytes.value)


def terms(ctx: Ctx) -> list[Term]:
    """Workspace terms of one rank."""
    mem = ctx.cluster.memory
    m, N = ctx.model, ctx.tokens_per_rank
    regions = ("attention",) if ctx.stack == "composed" else tuple(
        k for k in ("moe", "dense_mlp") if k in set(ctx.regions))
    out = [
        Term("cuBLAS workspace", "workspace", BLAS_HANDLES * int(mem.cublas_workspace_bytes.value), 1,
             "n_hd·memory.cublas_workspace_bytes", EVERY_PHASE, source=SOURCE),
    ]
    if blaslt_handles(ctx):
        out.append(Term("cuBLASLt workspace", "workspace", blaslt_bytes(ctx), 1,
                        "n_lt·memory.cublaslt_workspace_bytes; n_lt = [biased linear]·(1 + [backward re-runs it: "
                        "composed, or FSDP2 ac = full])", EVERY_PHASE, source=SOURCE + "; " + LT_SOURCE))
    if ctx.stack == "fsdp2":   # FlashAttention's backward buffers: the attention sub-step of fsdp2_layer
        return out
    if m.attention == "mla":   # the memory-efficient kernel's buffers (planner.budget.attention_mla)
        from planner.budget import attention_mla

        return out + [
            Term("efficient attention forward fp32 output accumulator (excess over head_to_seq's buffers)",
                 "workspace", attention_mla.output_accumulator_excess_bytes(ctx), 1,
                 "max(0, 4·N·n_h·d_v [max(d_qk, d_v) > 128] − 2·N·n_h·d_v·b [D > 1]) (bytes)",
                 ("forward",), regions=regions, source=attention_mla.SOURCE + " (sdpa.py:56)"),
            Term("efficient attention backward fp32 workspace (grad_k/grad_v staging, grad-q tiles) + delta",
                 "workspace", attention_mla.backward_workspace_bytes(ctx), 1,
                 "max(0, 4·(B·h_l·(n_sk·64·(⌈d_qk⌉₁₂₈ + ⌈d_v⌉₁₂₈) + ⌈S/128⌉·⌈d_qk/64⌉·(128·64 + 4)) + N·n_h) "
                 "− the recompute sub-step's lead over the kernel's) (bytes); n_sk = min(⌈S/64⌉, ⌊200/(B·h_l)⌋)",
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
