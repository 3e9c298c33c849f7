"""Live set ``attention``, MLA regions of the composed stack: the tensor inventory of
``planner.runtime.attention.MLAttention`` + ``UlyssesCore`` at the memory-efficient kernel
(DESIGN §3.2 Attention). MLA runs on the efficient kernel (``d_qk ≠ d_v``).

Legend: ``N`` tokens per rank, ``H`` hidden, ``n_h`` heads (``n_h/D`` of all ``S`` tokens in the
head layout, the same element count), ``d_qk = d_nope + d_rope``, ``d_v``, ``r_kv`` kv latent
rank, ``r_q`` q latent rank (0 without), ``[D>1]`` Ulysses' head layout exists, ``b`` act bytes.

    forward[r] (at the kernel, runtime/attention.py MLAttention.forward)
      normed input                    N·H                          model_layers.py:74
      kv latent (wkv_a output)        N·(r_kv + d_rope)            attention.py:194
      k_nope | v (wkv_b output)       N·n_h·(d_nope + d_v)         attention.py:196 (v is a view)
      q, k after RoPE (cat)           2·N·n_h·d_qk                 attention.py:199, :201
      roped k_pe; cos/sin (fp32)      N·d_rope·b + N·d_rope·4      attention.py:200, model_layers.py:82
      q, k, v head layout [D>1]       N·n_h·(2·d_qk + d_v)         seq_to_head's receive buffers
      kernel output; lse (fp32)       N·n_h·d_v·b + N·n_h·4        sdpa.py:56
      head_to_seq [D>1]               2·N·n_h·d_v                  its receive + the sequence-layout
                                      copy, after the kernel; the kernel's fp32 output accumulator
                                      (``workspace``) counts as its excess over them (the phase
                                      holds the larger)
    backward[r] (at ScaledDotProductEfficientAttentionBackward0)
      RMSNorm recomputes (saved)      (N·H + N·r_kv + N·r_q)·(4 + 2·b)   fp32 input, cast, output
                                      (model_layers.py:72, :74)
      kernel's saved inputs           W = 1: q, k and the k_nope|v block  N·n_h·(2·d_qk + d_nope + d_v)
                                      D > 1: the head layout              N·n_h·(2·d_qk + d_v)
      kernel output; lse              N·n_h·d_v·b + N·n_h·4
      grad of the output              N·n_h·d_v                    MmBackward0 of wo
      grads of q, k, v                N·n_h·(2·d_qk + d_v)         the backward node's outputs
      cos/sin (fp32, saved)           N·d_rope·4

The sequence-layout q, k and the k_nope|v block are saved by nothing when ``D > 1`` (the
all-to-all Function saves no input), so they are freed once the recompute returns. Before that, at
``head_to_seq``'s copy (attention.py:66), the recompute holds the whole forward, the restored region
input and none of the region's gradients: the **recompute** sub-step (``D > 1``), which replaces the
kernel's (the output's and q, k, v's gradients) where it holds more (``recompute_binds``); the
kernel's buffers count only their excess over its lead (``backward_workspace_bytes``), so the phase
holds ``max(kernel + workspace, recompute)``.

    backward[r], recompute sub-step (D > 1), beside the rows above but the gradients
      kv latent, roped k_pe, k_nope|v   N·(r_kv + 2·d_rope) + N·n_h·(d_nope + d_v)   attention.py:194,
      block, sequence-layout q, k         + 2·N·n_h·d_qk                             :200, :196, :199, :201
      head_to_seq receive + copy        2·N·n_h·d_v                                  attention.py:64, :66
      restored region input             N·H (boundaries)                             sco.py restore
      region r's weight gradients       0 (gathered: − Θ_region(r)) The kernels' own buffers (the
forward's fp32 output accumulator, the backward's fp32 grad-q accumulator and ``delta``) are
``workspace`` terms. Source: the H200 allocator history of ``planner validate`` on
DeepSeek-V2-Lite, W = 1, S = 65536 (every row above by its allocating line or autograd node).
"""

from __future__ import annotations

import numpy as np

from planner.budget.terms import Term
from planner.context.ctx import Ctx

SOURCE = ("tensor inventory of planner/runtime/attention.py MLAttention + UlyssesCore at the efficient "
          "kernel; H200 allocator history, deepseek-v2-lite W = 1 S = 65536")
PROVISIONAL = False


def _int(v):
    return int(v) if np.ndim(v) == 0 else v


def output_accumulator_elems(ctx: Ctx):
    """Elements of the efficient kernel's fp32 forward output accumulator ``N·n_h·d_v`` (present when
    ``max(d_qk, d_v) > 128``: the CUTLASS kernel then iterates over the value width and accumulates
    in fp32, ``kNeedsOutputAccumulatorBuffer``); 0 for other attention."""
    m = ctx.model
    if ctx.stack != "composed" or m.attention != "mla" or max(m.head_dim, m.v_dim) <= 128:
        return 0
    return ctx.tokens_per_rank * m.num_heads * m.v_dim


def head_to_seq_elems(ctx: Ctx):
    """``head_to_seq`` of the kernel output (``D > 1``): its receive buffer and the sequence-layout
    copy ``reshape`` makes of the permuted receive, ``2·N·n_h·d_v`` (b); the send is the output itself
    (one sequence: already in the send order)."""
    m = ctx.model
    return 2 * ctx.tokens_per_rank * m.num_heads * m.v_dim * np.where(np.asarray(ctx.seq_parallel) > 1, 1, 0)


def output_accumulator_excess_bytes(ctx: Ctx):
    """Bytes by which the forward's fp32 output accumulator (at the kernel) exceeds ``head_to_seq``'s
    buffers (after the kernel, the accumulator freed): the phase holds the larger of the two."""
    v = np.maximum(np.asarray(output_accumulator_elems(ctx)) * 4 - head_to_seq_elems(ctx) * ctx.act_bytes, 0)
    return _int(v)


def backward_workspace_elems(ctx: Ctx):
    """fp32 elements of the efficient backward's grad-q accumulator ``N·n_h·d_qk`` and its ``delta``
    ``N·n_h`` (the ScaledDotProductEfficientAttentionBackward0 node's two buffers beside its grads)."""
    m, N = ctx.model, ctx.tokens_per_rank
    return N * m.num_heads * m.head_dim + N * m.num_heads


def backward_workspace_bytes(ctx: Ctx):
    """The backward's kernel buffers (``backward_workspace_elems``, fp32) net of the recompute
    sub-step's lead over the kernel's, so the phase holds ``max(kernel + workspace, recompute)``."""
    lead = np.maximum(np.asarray(recompute_lead_bytes(ctx)), 0)
    return _int(np.maximum(np.asarray(backward_workspace_elems(ctx)) * 4 - lead, 0))


def recompute_binds(ctx: Ctx):
    """Whether the backward's **recompute** sub-step (``D > 1``) holds more than its **kernel**
    sub-step, as a trace sees them (kernel workspace left out). The recompute's peak is
    ``head_to_seq``'s sequence-layout copy (attention.py:66) with the whole forward still live: the
    sequence-layout q, k (attention.py:199, :201), the k_nope | v block (:196), the kv latent
    (:194), roped k_pe, the head layout and the output, and the restored region input (sco.py
    restore) the recompute reads; the region's own weight gradients are not made yet. The kernel
    sub-step holds the output's gradient and the gradients of q, k, v instead (whole-step trace of
    deepseek-v2-lite, W = 8, N = 4096: backward[3] peaks at attention.py:66 of the recompute)."""
    return np.asarray(recompute_lead_bytes(ctx)) > 0


def recompute_lead_bytes(ctx: Ctx):
    """Bytes by which the recompute sub-step exceeds the kernel sub-step at ``D > 1`` (may be
    negative); ``-1`` at ``D = 1``, where the recompute holds nothing the kernel's saved tensors
    (the sequence-layout q, k and k_nope | v block themselves) do not.

        recompute − kernel = (recompute-only + 2·N·n_h·d_v + N·H − Θ_attn − N·n_h·d_v − N·n_h·(2·d_qk + d_v))·b
    """
    from planner.budget.regions import attention_region_params

    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    n_h, d_qk, d_v = m.num_heads, m.head_dim, m.v_dim
    rec = recompute_only_elems(ctx) + 2 * N * n_h * d_v + N * H - attention_region_params(m)
    ker = N * n_h * d_v + N * n_h * (2 * d_qk + d_v)
    lead = (np.asarray(rec) - np.asarray(ker)) * b
    return _int(np.where(np.asarray(ctx.seq_parallel) > 1, lead, -1))


def recompute_only_elems(ctx: Ctx):
    """Elements the recompute holds that the kernel sub-step does not (``D > 1``): the kv latent,
    roped k_pe, the k_nope | v block and the sequence-layout q, k (module docstring's forward rows)."""
    m, N = ctx.model, ctx.tokens_per_rank
    a, n_h, d_qk, d_v = m.mla, m.num_heads, m.head_dim, m.v_dim
    d_rope = a.qk_rope_head_dim
    return N * (a.kv_lora_rank + 2 * d_rope) + N * n_h * (d_qk - d_rope + d_v) + 2 * N * n_h * d_qk


def terms(ctx: Ctx, N, H, b, n_h, d_qk, d_v) -> list[Term]:
    """Composed MLA attention region (module docstring)."""
    a = ctx.model.mla
    R, fw, bw = ("attention",), ("forward",), ("backward",)
    d_rope, r_kv, r_q = a.qk_rope_head_dim, a.kv_lora_rank, a.q_lora_rank or 0
    d_nope = d_qk - d_rope
    ul = np.where(np.asarray(ctx.seq_parallel) > 1, 1, 0)
    heads = N * n_h * (2 * d_qk + d_v)
    o = N * n_h * d_v
    h2s = head_to_seq_elems(ctx)

    rec = recompute_binds(ctx)

    def pick(on, v):
        v = np.where(on, v, 0)
        return _int(v)

    RC, KS = "[recompute sub-step]", "[kernel sub-step]"

    def t(name, count, nbytes, formula, phases):
        return Term(name, "attention", _int(count), nbytes, formula, phases, regions=R, source=SOURCE,
                    provisional=PROVISIONAL)

    return [
        t("normed input x_NH", N * H, b, "N·H", fw),
        t("kv latent (wkv_a output)", N * (r_kv + d_rope), b, "N·(r_kv + d_rope)", fw),
        t("k_nope | v block (wkv_b output)", N * n_h * (d_nope + d_v), b, "N·n_h·(d_nope + d_v)", fw),
        t("q, k after RoPE, sequence layout", 2 * N * n_h * d_qk, b, "2·N·n_h·d_qk", fw),
        t("roped k_pe", N * d_rope, b, "N·d_rope", fw),
        t("RoPE cos/sin tables (fp32)", N * d_rope, 4, "N·d_rope", ("forward", "backward")),
        t("q, k, v, head layout (all-to-all receive)", heads * ul, b, "N·n_h·(2·d_qk + d_v) if D > 1", fw),
        t("kernel output", o, b, "N·n_h·d_v", ("forward", "backward")),
        t("log-sum-exp lse (fp32)", N * n_h, 4, "N·n_h", ("forward", "backward")),
        t("head_to_seq receive + sequence-layout copy of the output", h2s, b, "2·N·n_h·d_v if D > 1", fw),
        t("RMSNorm recomputes: saved fp32 input, cast and output (attention_norm, kv_norm, q_norm)",
          (N * H + N * r_kv + N * r_q) * (4 + 2 * b), 1, "(N·H + N·r_kv + N·r_q)·(4 + 2·b) (bytes)", bw),
        t("kernel's saved q, k, v: the head layout (D > 1) or q, k and the k_nope | v block (D = 1)",
          heads + (1 - ul) * N * n_h * d_nope, b, "N·n_h·(2·d_qk + d_v) [+ N·n_h·d_nope if D = 1]", bw),
        t("grad of the attention output (wo backward)", pick(~rec, o), b, f"N·n_h·d_v  {KS}", bw),
        t("grads of q, k, v (efficient backward)", pick(~rec, heads), b, f"N·n_h·(2·d_qk + d_v)  {KS}", bw),
        t("recompute: kv latent, roped k_pe, k_nope | v block, sequence-layout q and k (D > 1)",
          pick(rec, recompute_only_elems(ctx)), b,
          f"N·(r_kv + 2·d_rope) + N·n_h·(d_nope + d_v) + 2·N·n_h·d_qk  {RC}", bw),
        t("recompute: head_to_seq receive + sequence-layout copy of the output (D > 1)", pick(rec, h2s), b,
          f"2·N·n_h·d_v  {RC}", bw),
    ]
