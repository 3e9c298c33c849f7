"""FLOPs and GEMM shapes of each region, pass by pass, and the model FLOPs for TFLOP/s (DESIGN §4).

Legend (DESIGN §1): ``n`` tokens a rank runs through a block, ``H`` hidden, ``n_h``/``n_kv`` query
and KV heads, ``d_qk``/``d_v`` head widths, ``I``/``I_d``/``I_s`` expert, dense and shared FFN
widths, ``E``/``k`` experts and top-k, ``V`` vocabulary, ``S`` sequence length, ``tp`` the tensor-
parallel degree (1 in the composed stack). ``Gemm(m, n, k)`` is ``C[m,n] = A[m,k] @ B[k,n]``
(``2mnk`` FLOPs): forward ``Y[n_tok, out] = X[n_tok, in] @ W[in, out]`` is ``(n_tok, out, in)``.

Backward of a forward GEMM ``(m, n, k)`` (``backward``): the input gradient ``dX = dY·Wᵀ``,
``(m, k, n)``, and the weight gradient ``dW = Xᵀ·dY``, ``(k, n, m)``: twice the forward FLOPs.

Per-token GEMMs (forward, per layer; under FSDP2 TP the output (column) or input (row) is ``/tp``):

    GQA/MHA   q (n, n_h·d_qk, H), k (n, n_kv·d_qk, H), v (n, n_kv·d_v, H), o (n, H, n_h·d_v)
    MLA       q_a (n, q_lora, H), q_b (n, n_h·d_qk, q_lora) [or q (n, n_h·d_qk, H)],
              kv_a (n, kv_lora + d_rope, H), kv_b (n, n_h·(d_nope + d_v), kv_lora), o as above
    router    (n, E, H)         shared experts (n, 2·I_s, H), (n, H, I_s)
    dense FFN (n, 2·I_d, H), (n, H, I_d)
    expert    per slot with r routes: up (r, 2I, H), down (r, H, I) (``planner/runtime/expert_mlp.py``)

Causal attention of one sequence: forward ``S²·h·(d_qk + d_v)`` (``QKᵀ`` and ``PV`` over half the
pairs), backward 2.5× that (five matmuls against two). A sliding window ``w`` keeps the band's
share ``2w/S − (w/S)²`` of it.

**Model FLOPs** (``model_flops``, for TFLOP/s/GPU): 3 × the forward FLOPs of every matmul (GEMMs,
attention, the dense head's ``2·n·V·H``), at the mean expert load (``k`` routes per token), per
rank = the global useful FLOPs / W. No recompute, no Ring-DTP replay (``8NHV`` is charged as time
but counted as the dense head's ``6NHV``), no imported-expert duplication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.schema import ModelSpec


@dataclass(frozen=True)
class Gemm:
    """``count`` GEMMs ``C[m,n] = A[m,k] @ B[k,n]`` (numbers may be candidate arrays)."""

    name: str
    m: Any
    n: Any
    k: Any
    count: Any = 1

    @property
    def flops(self):
        """``2·m·n·k·count``."""
        return 2.0 * np.asarray(self.m, dtype=float) * self.n * self.k * self.count


def backward(g: Gemm) -> list[Gemm]:
    """The input- and weight-gradient GEMMs of forward GEMM ``g`` (module docstring)."""
    return [Gemm(g.name + " dX", g.m, g.k, g.n, g.count), Gemm(g.name + " dW", g.k, g.n, g.m, g.count)]


def head_dims(m: ModelSpec) -> tuple[int, int, int, int]:
    """``(n_h, n_kv, d_qk, d_v)``; MLA decompresses keys and values per head (``n_kv = n_h``)."""
    n_kv = m.num_heads if m.attention == "mla" else m.num_kv_heads
    return m.num_heads, n_kv, m.head_dim, m.v_dim


def attention_gemms(m: ModelSpec, n_tok, tp: int = 1) -> list[Gemm]:
    """Forward projection GEMMs of one attention block on ``n_tok`` tokens (heads ``/tp``)."""
    H = m.hidden_size
    n_h, n_kv, d_qk, d_v = head_dims(m)
    if m.attention == "mla":
        a = m.mla
        out = []
        if a.q_lora_rank:
            out += [Gemm("q_a", n_tok, a.q_lora_rank, H), Gemm("q_b", n_tok, n_h * d_qk // tp, a.q_lora_rank)]
        else:
            out.append(Gemm("q", n_tok, n_h * d_qk // tp, H))
        out += [Gemm("kv_a", n_tok, a.kv_lora_rank + a.qk_rope_head_dim, H),
                Gemm("kv_b", n_tok, n_h * (a.qk_nope_head_dim + a.v_head_dim) // tp, a.kv_lora_rank)]
    else:
        out = [Gemm("q", n_tok, n_h * d_qk // tp, H), Gemm("k", n_tok, n_kv * d_qk // tp, H),
               Gemm("v", n_tok, n_kv * d_v // tp, H)]
    out.append(Gemm("o", n_tok, H, n_h * d_v // tp))
    return out


def qkv_elems_per_token(m: ModelSpec) -> int:
    """Elements of q, k and v per token over all heads: ``n_h·d_qk + n_kv·(d_qk + d_v)``."""
    n_h, n_kv, d_qk, d_v = head_dims(m)
    return n_h * d_qk + n_kv * (d_qk + d_v)


def attention_fwd_flops(seq_len, heads, d_qk, d_v, window=None):
    """Causal forward FLOPs of one sequence over ``heads`` heads (band share for a window)."""
    s = np.asarray(seq_len, dtype=float)
    full = s * s * heads * (d_qk + d_v)
    if window:
        f = np.minimum(1.0, window / np.maximum(s, 1.0))
        full = full * (2.0 * f - f * f)
    return full


def moe_dense_gemms(m: ModelSpec, n_tok, tp: int = 1) -> list[Gemm]:
    """Router and shared-expert GEMMs of one MoE block (shared experts column/row-parallel)."""
    out = [Gemm("router", n_tok, m.num_experts, m.hidden_size)]
    if m.shared_expert_ffn:
        I_s = m.shared_expert_ffn
        out += [Gemm("shared up", n_tok, 2 * I_s // tp, m.hidden_size),
                Gemm("shared down", n_tok, m.hidden_size, I_s // tp)]
    return out


def dense_ffn_gemms(m: ModelSpec, n_tok, tp: int = 1) -> list[Gemm]:
    """Gated dense FFN of one dense layer (column/row-parallel over ``tp``)."""
    I_d = m.dense_ffn
    return [Gemm("ffn up", n_tok, 2 * I_d // tp, m.hidden_size), Gemm("ffn down", n_tok, m.hidden_size, I_d // tp)]


def expert_fwd(rows, H: int, I: int, count=1) -> list[Gemm]:
    """One expert slot's forward: ``gu = x·W_up`` ``(r, 2I, H)``, ``o = h·W_down`` ``(r, H, I)``."""
    return [Gemm("expert up", rows, 2 * I, H, count), Gemm("expert down", rows, H, I, count)]


def expert_bwd(rows, H: int, I: int, count=1) -> list[Gemm]:
    """One expert slot's backward, as autograd runs ``mlp`` (and ``ExpertChunk.backward``):
    ``g_down = hᵀ·go`` ``(I, H, r)``, ``gh = go·W_downᵀ`` ``(r, I, H)``, ``g_up = xᵀ·ggu``
    ``(H, 2I, r)``, ``gx = ggu·W_upᵀ`` ``(r, H, 2I)``."""
    return [Gemm("expert g_down", I, H, rows, count), Gemm("expert gh", rows, I, H, count),
            Gemm("expert g_up", H, 2 * I, rows, count), Gemm("expert gx", rows, H, 2 * I, count)]


def per_token_gemm_flops(m: ModelSpec) -> float:
    """Forward GEMM FLOPs per token over all layers (balanced: ``k`` expert routes per token),
    head excluded."""
    attn = sum(float(g.flops) for g in attention_gemms(m, 1))
    total = m.num_layers * attn
    if m.num_moe_layers:
        moe = sum(float(g.flops) for g in moe_dense_gemms(m, 1))
        moe += m.top_k * sum(float(g.flops) for g in expert_fwd(1, m.hidden_size, m.expert_ffn))
        total += m.num_moe_layers * moe
    if m.num_dense_layers:
        total += m.num_dense_layers * sum(float(g.flops) for g in dense_ffn_gemms(m, 1))
    return total


def per_sequence_attention_flops(m: ModelSpec, seq_len):
    """Forward attention FLOPs of one sequence over all layers and heads (windows for local layers)."""
    n_h, _, d_qk, d_v = head_dims(m)
    local = set(m.local_layers) if m.sliding_window else set()
    n_local = len(local)
    out = (m.num_layers - n_local) * attention_fwd_flops(seq_len, n_h, d_qk, d_v)
    if n_local:
        out = out + n_local * attention_fwd_flops(seq_len, n_h, d_qk, d_v, m.sliding_window)
    return out


def model_flops(m: ModelSpec, tokens_per_rank, seq_len):
    """Useful FLOPs per rank for ``tokens_per_rank`` distinct tokens in sequences of ``seq_len``
    (module docstring): ``3·(n·f_tok + (n/S)·f_seq + 2·n·V·H)``."""
    n = np.asarray(tokens_per_rank, dtype=float)
    fwd = n * per_token_gemm_flops(m) + n / np.asarray(seq_len, dtype=float) * per_sequence_attention_flops(
        m, seq_len) + 2.0 * n * m.vocab_size * m.hidden_size
    return 3.0 * fwd
