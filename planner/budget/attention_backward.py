"""The composed stack's GQA/MHA attention backward of a global layer, per rank: its three sub-steps.

Legend (DESIGN §1, Ulysses over ``D``): ``h_l = n_h/D`` query and ``h_kv = n_kv/D`` key/value heads
of the head layout, ``B`` sequences of ``S = N·D/B`` tokens; with attention sinks
(``planner.runtime.sdpa._global``) the kernel sees ``S_k = S + 1`` rows (the sink key, a dummy
query) of ``d_k = d_qk + 8`` channels, v padded to ``d_vk = d_k``; else ``S_k = S``, ``d_k = d_qk``,
``d_vk = d_v``. ``⌈x⌉ₘ`` rounds up to a multiple of ``m``.

    kernel    FlashAttention's backward (ScaledDotProductFlashAttentionBackward0). Saved by the
              recompute: attention_norm's fp32 input N·H (fp32), its cast and output 2·N·H (b)
              (model_layers.py:72/74), the RoPE cos/sin tables N·d_qk (fp32), QK-norm's fp32
              inputs and rsqrt N·(n_h+n_kv)·(d_qk+1) (fp32) and casts N·(n_h+n_kv)·d_qk (b), the
              kernel's q, k, v and output B·S_k·(h_l·d_k + h_kv·(d_k+d_vk) + h_l·d_vk) (b) and lse
              B·S_k·h_l (fp32). Gradients: the output's, dq, dk, dv (the same sizes, b).
              Kernel workspace (``workspace``, invisible to a trace): fp32 dq_accum
              B·⌈S_k⌉₁₂₈·h_l·⌈d_k⌉₃₂ and softmax_d B·⌈S_k⌉₁₂₈·h_l, dk/dv expanded to h_l heads
              (GQA) B·S_k·h_l·(d_k+d_vk) (b), and where the kernel's inputs are head-major in memory
              (sinks: torch.cat along the sequence) contiguous copies of its output and its output's
              gradient 2·B·S_k·h_l·d_vk (b).
    qk_norm   QK-norm's fp32 RMSNorm backward over q, after the kernel: its fp32 input and five
              fp32 temporaries 6·N·n_h·d_qk, k and its gradient 2·N·n_kv·d_qk (b), attention_norm's
              saved tensors.
    end       attention_norm's backward: its fp32 input and five fp32 temporaries 6·N·H (fp32), the
              gradient into its output (the q, k, v projections' input gradients) and the outgoing
              boundary gradient 2·N·H (b) (as ``ffn``'s norm backward; the whole-step trace of
              gpt-oss at W = 8 and 64 peaks there, at N = 4096).

The phase holds ``max(kernel + workspace, qk_norm, end)``: the kernel's workspace is freed before
the other two, so ``workspace`` carries only its excess over the larger of them
(``kernel_workspace``). The boundaries the phase holds are the incoming boundary gradient and the
SCO prefetch (``planner.budget.boundaries``): the restored region input is freed once the recompute
has consumed it.

Evidence (H200 allocator history, bench/results/memory_snapshot/): gpt-oss-W8 backward[3] (sinks,
no QK-norm, kernel sub-step): ScaledDotProductFlashAttentionBackward0 9 blocks, 1144.4 MiB (dq_accum
384.4 = 4·131200·8·96 B, softmax_d 4, dq, dk and dv expanded, the output and gradient copies 5 × 144,
dk, dv 2 × 18), sdpa.py:102-104 q, k, v 144 + 18 + 18, sdpa.py:51 output + lse 144 + 4,
SliceBackward0 (the output's gradient) 144, model_layers.py:72/74 180 + 90 + 90, rope_tables 2 + 2,
one sco.py:245 restore (the prefetch) 90, ToCopyBackward0 (the incoming gradient) 90.
qwen3-W64 backward[3] (QK-norm sub-step): PowBackward0 3 × 512, MulBackward0 512, MeanBackward1 512,
model_layers.py:72 < attention.py:140 512, model_layers.py:72/74 256 + 128 + 128, ToCopyBackward0
128 (incoming gradient) + 32, head_to_seq 32, one sco.py:245 restore 128.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.budget.attention_sliding import CHUNKED_LOCAL_TYPES
from planner.context.ctx import Ctx
from planner.plans.sdpa_layout import SINK_PAD
from planner.units import ceil_div

SOURCE = ("tensor inventory of planner/runtime/attention.py, sdpa.py, model_layers.py under the region "
          "checkpoint's recompute and FlashAttention-2's mha_bwd; H200 allocator history (module docstring)")
FP32 = 4
"""Bytes of the fp32 tensors (RMSNorm's and RoPE's math, FlashAttention's accumulators)."""
SEQ_TILE = 128
"""FlashAttention-2 backward rounds the query rows of ``dq_accum``/``softmax_d`` up to 128."""


def head_round(d):
    """FlashAttention-2's rounded head width of ``dq_accum``: to 32 up to 128, else to 64."""
    d = np.asarray(d)
    m = np.where(d <= 128, 32, 64)
    return -(-d // m) * m


@dataclass(frozen=True)
class KernelShape:
    """The FlashAttention call of a global layer, per rank (module legend)."""

    B: object
    S_k: object
    h_l: object
    h_kv: object
    d_k: int
    d_vk: int
    head_major: bool
    """The kernel's inputs are head-major in memory (sinks): it copies its output and gradient."""

    @property
    def q(self):
        return self.B * self.S_k * self.h_l * self.d_k

    @property
    def kv(self):
        return self.B * self.S_k * self.h_kv * (self.d_k + self.d_vk)

    @property
    def out(self):
        return self.B * self.S_k * self.h_l * self.d_vk

    @property
    def rows(self):
        return self.B * self.S_k * self.h_l


def kernel_shape(ctx: Ctx) -> KernelShape:
    m, N, D, B = ctx.model, ctx.tokens_per_rank, ctx.seq_parallel, ctx.seqs_per_microbatch
    n_kv = m.num_heads if m.attention == "mla" else m.num_kv_heads
    S = np.asarray(N) * D // B
    sink = bool(m.attention_sinks)
    d_k = m.head_dim + (SINK_PAD if sink else 0)
    d_vk = d_k if sink else m.v_dim
    return KernelShape(B, S + (1 if sink else 0), ceil_div(m.num_heads, D), ceil_div(n_kv, D), d_k, d_vk, sink)


def _scalar(v):
    return int(v) if np.ndim(v) == 0 else v


def norm_end_bytes(ctx: Ctx):
    """The **end** sub-step: attention_norm's fp32 RMSNorm backward, its fp32 input and five fp32
    temporaries ``6·N·H`` and the gradient into its output with the outgoing boundary gradient
    ``2·N·H`` (b) (module docstring; MLA's attention_norm is the same RMSNorm)."""
    N, H = ctx.tokens_per_rank, ctx.hidden_size
    return 6 * N * H * FP32 + 2 * N * H * ctx.act_bytes


def substeps(ctx: Ctx) -> dict[str, object]:
    """Bytes of each sub-step as a trace sees it (``kernel``, ``qk_norm``, ``end``) and of the
    kernel's workspace (``accum``, ``expansion``, ``copies``)."""
    m, N, H, b = ctx.model, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    n_h, n_kv, d = m.num_heads, m.num_kv_heads, m.head_dim
    k = kernel_shape(ctx)
    norm_saved = N * H * FP32 + 2 * N * H * b
    rope = N * d * FP32 if m.model_type not in CHUNKED_LOCAL_TYPES else 0
    qkn_saved = N * (n_h + n_kv) * ((d + 1) * FP32 + d * b) if m.qk_norm else 0
    kernel = norm_saved + rope + qkn_saved + (k.q + k.kv + k.out) * b + k.rows * FP32 + (k.out + k.q + k.kv) * b
    qkn = (6 * N * n_h * d * FP32 + 2 * N * n_kv * d * b + norm_saved) if m.qk_norm else 0
    end = norm_end_bytes(ctx)
    sr = -(-np.asarray(k.S_k) // SEQ_TILE) * SEQ_TILE
    accum = k.B * sr * k.h_l * (head_round(k.d_k) + 1) * FP32
    expansion = np.where(np.asarray(k.h_kv) < np.asarray(k.h_l), k.B * k.S_k * k.h_l * (k.d_k + k.d_vk) * b, 0)
    copies = 2 * k.out * b if k.head_major else 0
    return {n: _scalar(np.asarray(v, dtype=np.int64)) for n, v in
            dict(kernel=kernel, qk_norm=qkn, end=end, accum=accum, expansion=expansion, copies=copies).items()}


def binding(ctx: Ctx) -> dict[str, object]:
    """Per sub-step, whether it is the one a trace sees binding (``kernel`` wins ties)."""
    s = substeps(ctx)
    kern, qkn, end = (np.asarray(s[n]) for n in ("kernel", "qk_norm", "end"))
    k_wins = (kern >= qkn) & (kern >= end)
    q_wins = ~k_wins & (qkn >= end)
    return {"kernel": k_wins, "qk_norm": q_wins, "end": ~k_wins & ~q_wins}


def kernel_workspace(ctx: Ctx) -> dict[str, object]:
    """The kernel's workspace terms net of the lead the larger later sub-step has over the kernel's
    (``accum``, ``expansion``, ``copies``, in that order of absorption), so that the phase holds
    ``max(kernel + workspace, qk_norm, end)``."""
    s = substeps(ctx)
    lead = np.maximum(np.maximum(np.asarray(s["qk_norm"]), np.asarray(s["end"])) - np.asarray(s["kernel"]), 0)
    out = {}
    for n in ("accum", "expansion", "copies"):
        v = np.asarray(s[n])
        out[n] = _scalar(np.maximum(v - lead, 0))
        lead = np.maximum(lead - v, 0)
    return out
