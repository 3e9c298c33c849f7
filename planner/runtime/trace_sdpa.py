"""What the flash / memory-efficient SDPA kernels allocate, for fake-tensor traces (DESIGN §8).

On a CPU-only build, fake tensors dispatch ``scaled_dot_product_attention`` to the CPU kernels,
and for head widths the CPU flash kernel refuses (MLA's ``d_qk = 192 ≠ d_v = 128``) to the math
backend, which materialises ``S²`` scores the CUDA kernels never hold. ``cuda_like_sdpa()``
replaces it, for the duration of a trace, by an autograd function that allocates what the CUDA
flash / memory-efficient kernels hand to the caching allocator as tensors:

    forward    out_BhSdv (input dtype, in memory [B, S, h, d_v] as the CUDA kernels return it, so
               the caller's transpose back is a view), lse_BhS (fp32, saved)
    backward   dq, dk, dv (input dtype, k/v at their own head count)

Their internal workspaces (FlashAttention's fp32 ``dq_accum`` and ``softmax_d``, the GQA dk/dv
expansion, and the contiguous copies of the output and its gradient it makes when its inputs are
head-major in memory, as with sinks: ``planner.budget.attention_backward``) are not tensors the
caller sees; they are ``workspace`` live-set terms, which a trace cannot see and ``planner
validate`` measures on the GPU.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


class _FlashLike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask):
        B, h, S, _ = q.shape
        out = q.new_empty(B, S, h, v.shape[-1]).transpose(1, 2)   # the CUDA kernels' layout
        lse = q.new_empty(B, h, S, dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask_shape = None if mask is None else mask.shape
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if attn_mask is not None and attn_mask.requires_grad:
        raise NotImplementedError("trace SDPA: a mask that needs a gradient")
    return _FlashLike.apply(q, k, v, attn_mask)


@contextlib.contextmanager
def cuda_like_sdpa():
    """Inside: ``F.scaled_dot_product_attention`` allocates as the CUDA kernels do (docstring)."""
    orig = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = orig
