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
      o-projection moment             D > 1, h_l = n_h/D > 1:      head_to_seq's receive + its
                                      N·n_h·d_v + max(N·n_h·d_v, N·H)  sequence-layout copy
                                                                   (attention.py:64, :65), then the
                                                                   copy + wo's output (:204)
                                      D > 1, h_l = 1:              the receive (``o`` views it: the
                                      2·N·n_h·d_v + N·H            reshape at :65 is a view), wo's
                                                                   input copy and output (:204)
                                      D = 1: N·H                   wo's output (its input views the
                                                                   kernel output)
                                      after the kernel; the kernel's fp32 output accumulator
                                      (``workspace``) counts as its excess over them (the phase
                                      holds the larger)
    backward[r] (at ScaledDotProductEfficientAttentionBackward0)
      RMSNorm recomputes (saved)      (N·H + N·r_kv + N·r_q)·(4 + 2·b)   fp32 input, cast, output
                                      (model_layers.py:72, :74)
      kernel's saved inputs           W = 1: q, k and the k_nope|v block  N·n_h·(2·d_qk + d_nope + d_v)
                                      D > 1: the head layout              N·n_h·(2·d_qk + d_v)
      kernel output; lse              N·n_h·d_v·b + N·n_h·4
      grad of the output              N·n_h·d_v                    MmBackward0 of wo (D = 1); its
                                                                   head layout, seq_to_head's receive
                                                                   in _HeadToSeq.backward (D > 1)
      grads of q, k, v                N·n_h·(2·d_qk + d_v)         the backward node's outputs
      wo's weight gradient            H·n_h·d_v  (gathered)        MmBackward0; wq's, wkv_a's,
                                                                   wkv_b's and the norms' come after
                                                                   the kernel
      cos/sin (fp32, saved)           N·d_rope·4
    kernel buffers (``workspace``, fp32): the CUTLASS backward's workspace (the 128×64 kernel
    ``fmha_cutlassB_bf16_aligned_128x64_k65536_sm80`` that max(d_qk, d_v) > 128 selects:
    ``kernel_backward.h`` ``workspace_size``) and ``delta``, per sequence and head of the kernel
    (``B·h_l``, ``S`` queries and keys):
      grad_k, grad_v staging          n_sk·64·(⌈d_qk⌉₁₂₈ + ⌈d_v⌉₁₂₈)   n_sk = min(⌈S/64⌉, ⌊200/(B·h_l)⌋)
                                                                   (the split-keys heuristic of
                                                                   ``_efficient_attention_backward``)
      grad_q tiles                    ⌈S/128⌉·⌈d_qk/64⌉·(128·64 + 4)   GradQTempStorage: the tile and
                                                                   its lock, counter and pad
      delta                           S

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
      region r's weight gradients       0 (gathered: − Θ_wo)

Without checkpointing (``checkpoint = none``) there is no recompute: autograd keeps the region's
saved tensors (the rows above but the recompute's), the sequence-layout q, k and k_nope | v block
are freed after the forward at ``D > 1``, and the backward peaks in the kernel sub-step. The
kernels' own buffers (the forward's fp32 output accumulator, the backward's workspace and
``delta``) are ``workspace`` terms. Source: the H200 allocator histories of ``planner validate``
on DeepSeek-V2-Lite (bench/results/memory_snapshot/): W = 1, S = 65536 (every row above by its
allocating line or autograd node); checkpoint = none at W = 1, S = 8192 and at W = 32, S = 32768
(D = 16, h_l = 1): forward[3] peaks at wo's output (attention.py:204) beside its input copy and
head_to_seq's receive (:64); backward[3] in ScaledDotProductEfficientAttentionBackward0 with its
workspace (44838912 B at B·h_l = 1, S = 32768; 119586816 B at W = 1, 16 heads, S = 8192; 32249856 B
at W = 8, S = 8192, h_l = 2: exactly the rows above), dq, dk, dv, delta, seq_to_head's receive
of the output's gradient (attention.py:54 < :47), wo's weight gradient (MmBackward0) and one
incoming N·H gradient.
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


def needs_output_accumulator(model) -> bool:
    """MLA on the efficient kernel with ``max(d_qk, d_v) > 128``: the CUTLASS kernel then iterates
    over the value width and accumulates its output in fp32 (``kNeedsOutputAccumulatorBuffer``)."""
    return model.attention == "mla" and max(model.head_dim, model.v_dim) > 128


def output_accumulator_elems(ctx: Ctx):
    """Elements of the efficient kernel's fp32 forward output accumulator ``N·n_h·d_v`` in the
    composed stack (``needs_output_accumulator``); 0 for other attention (the FSDP2 baseline's is
    ``planner.budget.fsdp2_ring``'s fp32 output)."""
    m = ctx.model
    if ctx.stack != "composed" or not needs_output_accumulator(m):
        return 0
    return ctx.tokens_per_rank * m.num_heads * m.v_dim


def head_to_seq_elems(ctx: Ctx):
    """``head_to_seq`` of the kernel output (``D > 1``): its receive buffer and the sequence-layout
    copy of the permuted receive, ``2·N·n_h·d_v`` (b); the send is the output itself (one sequence:
    already in the send order). The recompute's moment (its last saved tensor is wo's input, packed
    before wo runs)."""
    m = ctx.model
    return 2 * ctx.tokens_per_rank * m.num_heads * m.v_dim * np.where(np.asarray(ctx.seq_parallel) > 1, 1, 0)


def o_projection_elems(ctx: Ctx):
    """The forward's moment after the kernel (b elements beside the kernel output). Without
    checkpointing, where autograd keeps the head layout and the kernel output through the
    o-projection (module docstring): ``D > 1`` with ``h_l = n_h/D > 1``, head_to_seq's receive and
    copy, then the copy and wo's output, ``N·n_h·d_v + max(N·n_h·d_v, N·H)``; ``h_l = 1``, where the
    copy is made only at wo's input reshape while ``o`` still views the receive, ``2·N·n_h·d_v +
    N·H``; ``D = 1``, wo's output ``N·H``. In a checkpointed forward nothing keeps the head layout
    once the Ulysses core returns: its moment is head_to_seq's (``head_to_seq_elems``)."""
    if ctx.checkpoint != "none":
        return head_to_seq_elems(ctx)
    m, N, H = ctx.model, ctx.tokens_per_rank, ctx.hidden_size
    D = np.asarray(ctx.seq_parallel)
    o, out = N * m.num_heads * m.v_dim, N * H
    one_head = -(-m.num_heads // D) == 1
    return _int(np.where(D > 1, o + np.where(one_head, o + out, np.maximum(o, out)), out))


def output_accumulator_excess_bytes(ctx: Ctx):
    """Bytes by which the forward's fp32 output accumulator (at the kernel) exceeds the o-projection
    moment's buffers (after the kernel, the accumulator freed): the phase holds the larger of the two."""
    v = np.maximum(np.asarray(output_accumulator_elems(ctx)) * 4 - np.asarray(o_projection_elems(ctx)) * ctx.act_bytes,
                   0)
    return _int(v)


BWD_BLOCK_I, BWD_BLOCK_J = 128, 64
"""Query / key block of the efficient backward kernel MLA's widths select (``max(d_qk, d_v) > 128``:
``fmha_cutlassB_bf16_aligned_128x64_k65536_sm80``)."""
GRAD_Q_TILE_N = 64
"""Columns of one grad-q tile (``MatmulGradQ::ThreadblockShape::kN``)."""
GRAD_Q_TILE_HEADER = 4
"""fp32 words before each grad-q tile (``GradQTempStorage``: lock, counter, pad to 128 bits)."""
SPLIT_KEYS_CAP = 200
"""``num_splits_key ≤ 200 / (B·h)`` where grad_k / grad_v stage in the workspace."""


def _up(x, m):
    return -(-np.asarray(x) // m) * m


def backward_workspace_elems(ctx: Ctx):
    """fp32 elements of the efficient backward's workspace and ``delta`` (the
    ScaledDotProductEfficientAttentionBackward0 node's buffers beside its gradients), per kernel call of
    ``B`` sequences of ``S`` tokens, ``h_l`` heads (``attention_backward.kernel_shape``):
    ``B·h_l·(n_sk·64·(⌈d_qk⌉₁₂₈ + ⌈d_v⌉₁₂₈) + ⌈S/128⌉·⌈d_qk/64⌉·(128·64 + 4)) + B·h_l·S`` with
    ``n_sk = min(⌈S/64⌉, ⌊200/(B·h_l)⌋)`` (at least 1; module docstring)."""
    from planner.budget.attention_backward import kernel_shape

    m, k = ctx.model, kernel_shape(ctx)
    d_qk, d_v = m.head_dim, m.v_dim
    bh, S = np.asarray(k.B * k.h_l), np.asarray(k.S_k)
    n_sk = -(-S // BWD_BLOCK_J)
    n_sk = np.where((bh >= 256) & (S <= 2 * BWD_BLOCK_J), 1, n_sk)
    n_sk = np.maximum(np.minimum(n_sk, SPLIT_KEYS_CAP // bh), 1)
    stage = n_sk * BWD_BLOCK_J * (_up(d_qk, BWD_BLOCK_I) + _up(d_v, BWD_BLOCK_I)) if max(d_qk, d_v) > BWD_BLOCK_I else 0
    tiles = -(-S // BWD_BLOCK_I) * -(-d_qk // GRAD_Q_TILE_N) * (BWD_BLOCK_I * GRAD_Q_TILE_N + GRAD_Q_TILE_HEADER)
    return _int(bh * _up(stage + tiles, 4) + bh * S)


def backward_workspace_bytes(ctx: Ctx):
    """The backward's kernel buffers (``backward_workspace_elems``, fp32) net of the recompute
    sub-step's lead over the kernel's, so the phase holds ``max(kernel + workspace, recompute)``."""
    lead = np.maximum(np.asarray(recompute_lead_bytes(ctx)), 0)
    return _int(np.maximum(np.asarray(backward_workspace_elems(ctx)) * 4 - lead, 0))


def kernel_grad_params(ctx: Ctx) -> int:
    """Weight-gradient elements of an MLA region made by its kernel sub-step: wo's ``H·n_h·d_v`` (its
    backward runs first; wq's, wkv_a's, wkv_b's and the norms' come after the kernel)."""
    m = ctx.model
    return ctx.hidden_size * m.num_heads * m.v_dim


def kernel_substep_bytes(ctx: Ctx):
    """The region's bytes at its kernel sub-step as the ``attention`` terms, wo's weight gradient and
    the kernel's buffers book them (trace and workspace together): the norms' saves, the RoPE tables,
    the kernel's saved inputs, output and lse, the output's and q, k, v's gradients
    (module docstring's backward rows)."""
    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    a, n_h, d_qk, d_v = m.mla, m.num_heads, m.head_dim, m.v_dim
    ul = np.where(np.asarray(ctx.seq_parallel) > 1, 1, 0)
    heads, o = N * n_h * (2 * d_qk + d_v), N * n_h * d_v
    norms = (N * H + N * a.kv_lora_rank + N * (a.q_lora_rank or 0)) * (4 + 2 * b)
    saved = (heads + (1 - ul) * N * n_h * (d_qk - a.qk_rope_head_dim) + o) * b + N * n_h * 4 + N * a.qk_rope_head_dim * 4
    grads = (o + heads + kernel_grad_params(ctx)) * b
    return _int(norms + saved + grads + np.asarray(backward_workspace_elems(ctx)) * 4)


def end_excess_bytes(ctx: Ctx):
    """Bytes by which the **end** sub-step, attention_norm's backward with every weight gradient of
    the region made (``attention_backward.norm_end_bytes`` + ``Θ_attn·b``; the kernel's saved
    tensors freed), exceeds the larger of the kernel and recompute sub-steps (at small ``N``, where
    the region's weights outweigh its activations)."""
    from planner.budget.attention_backward import norm_end_bytes
    from planner.budget.regions import attention_region_params

    end = np.asarray(norm_end_bytes(ctx)) + attention_region_params(ctx.model) * ctx.act_bytes
    kern = np.asarray(kernel_substep_bytes(ctx))
    ws = np.asarray(backward_workspace_elems(ctx)) * 4
    booked = kern - ws + np.maximum(ws, np.asarray(recompute_lead_bytes(ctx)))
    return _int(np.maximum(end - booked, 0))


def recompute_binds(ctx: Ctx):
    """Whether the backward's **recompute** sub-step (``D > 1``) holds more than its **kernel**
    sub-step, as a trace sees them (kernel workspace left out). The recompute's peak is
    ``head_to_seq``'s sequence-layout copy (attention.py:66) with the whole forward still live: the
    sequence-layout q, k (attention.py:199, :201), the k_nope | v block (:196), the kv latent
    (:194), roped k_pe, the head layout and the output, and the restored region input (sco.py
    restore) the recompute reads; the region's own weight gradients are not made yet. The kernel
    sub-step holds the output's gradient, the gradients of q, k, v and wo's weight gradient instead
    (whole-step trace of deepseek-v2-lite, W = 8, N = 4096: backward[3] peaks at attention.py:66 of
    the recompute). Never without checkpointing (no recompute)."""
    return np.asarray(recompute_lead_bytes(ctx)) > 0


def recompute_lead_bytes(ctx: Ctx):
    """Bytes by which the recompute sub-step exceeds the kernel sub-step at ``D > 1`` (may be
    negative); ``-1`` at ``D = 1``, where the recompute holds nothing the kernel's saved tensors
    (the sequence-layout q, k and k_nope | v block themselves) do not, and without checkpointing,
    where there is no recompute.

        recompute − kernel = (recompute-only + 2·N·n_h·d_v + N·H − N·n_h·d_v − N·n_h·(2·d_qk + d_v) − Θ_wo)·b
    """
    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    n_h, d_qk, d_v = m.num_heads, m.head_dim, m.v_dim
    rec = recompute_only_elems(ctx) + 2 * N * n_h * d_v + N * H
    ker = N * n_h * d_v + N * n_h * (2 * d_qk + d_v) + kernel_grad_params(ctx)
    lead = (np.asarray(rec) - np.asarray(ker)) * b
    recomputes = (np.asarray(ctx.seq_parallel) > 1) & (ctx.checkpoint != "none")
    return _int(np.where(recomputes, lead, -1))


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
    # without checkpointing autograd keeps the tables, counted with the region's saves in forward
    # (saved_composed.attention_norm_counts), as GQA's (planner.budget.attention)
    tables = ("backward",) if ctx.checkpoint == "none" else ("forward", "backward")

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
        t("RoPE cos/sin tables (fp32)", N * d_rope, 4, "N·d_rope  [forward: boundaries' when checkpoint = none]",
          tables),
        t("q, k, v, head layout (all-to-all receive)", heads * ul, b, "N·n_h·(2·d_qk + d_v) if D > 1", fw),
        t("kernel output", o, b, "N·n_h·d_v", ("forward", "backward")),
        t("log-sum-exp lse (fp32)", N * n_h, 4, "N·n_h", ("forward", "backward")),
        t("o-projection moment: head_to_seq's receive and copy of the output (D > 1), wo's output",
          o_projection_elems(ctx), b,
          "checkpoint = none: D > 1: N·n_h·d_v + (N·n_h·d_v + N·H if h_l = 1 else max(N·n_h·d_v, N·H)), "
          "D = 1: N·H; checkpointed: 2·N·n_h·d_v if D > 1", fw),
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
        t("attention_norm backward with every region weight gradient made (excess over the kernel / "
          "recompute sub-step)", end_excess_bytes(ctx), 1,
          "max(0, 6·N·H·4 + 2·N·H·b + Θ_attn·b − max(kernel + workspace, recompute)) (bytes)", bw),
    ]
