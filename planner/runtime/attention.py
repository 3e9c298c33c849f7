"""Attention blocks of the decoder (GQA/MHA and MLA) and the two attention cores: local and
Ulysses all-to-all over the sequence group of ``D`` ranks (DESIGN §2).

Legend: ``B`` sequences, ``T`` tokens of each on this rank (``T = S/D`` under Ulysses), ``S``
sequence length, ``h``/``h_kv`` query / key-value heads, ``d``/``d_v`` query-key / value widths,
``q_BThd``, ``k_BThd``, ``v_BThd`` in the sequence layout, ``q_BhSd`` in the head layout.

Ulysses (``UlyssesCore``): q, k, v go from the sequence layout (``T`` tokens, all heads) to the
head layout (all ``S`` tokens, ``h/D`` heads; ``h_kv/D`` for GQA, so ``D`` must divide ``h_kv``)
with one ``all_to_all_single`` each, attention runs on the full sequence, and the output goes back
with one more; backward runs the reverse all-to-alls. RoPE is applied before the exchange, at the
rank's own positions. Bytes sent per rank per pass: ``(D-1)/D`` of q, k, v and of the output.
"""

from __future__ import annotations

import torch
from torch import nn

from planner.runtime import shim
from planner.runtime.model_layers import (RMSNorm, apply_rope, family, init_linear, init_normal,
                                           rope_tables, rope_theta)
from planner.runtime.sdpa import causal_attention


class _SeqToHead(torch.autograd.Function):
    """``[B, T, h, d]`` (sequence layout) → ``[B, D·T, h/D, d]`` (head layout) over ``group``."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return seq_to_head(x, group)

    @staticmethod
    def backward(ctx, g):
        return head_to_seq(g.contiguous(), ctx.group), None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return head_to_seq(x, group)

    @staticmethod
    def backward(ctx, g):
        return seq_to_head(g.contiguous(), ctx.group), None


def seq_to_head(x_BThd: torch.Tensor, group) -> torch.Tensor:
    D = shim.group_size(group)
    B, T, h, d = x_BThd.shape
    send = x_BThd.reshape(B, T, D, h // D, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)                          # [D(source), B, T, h/D, d]
    shim.all_to_all_single(recv, send, None, None, group)
    return recv.permute(1, 0, 2, 3, 4).reshape(B, D * T, h // D, d)


def head_to_seq(x_BShd: torch.Tensor, group) -> torch.Tensor:
    D = shim.group_size(group)
    B, S, hl, d = x_BShd.shape
    T = S // D
    send = x_BShd.reshape(B, D, T, hl, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)                          # [D(source: head block), B, T, h/D, d]
    shim.all_to_all_single(recv, send, None, None, group)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, T, D * hl, d)


class LocalCore:
    """Attention of the whole sequence on this rank (``D = 1``)."""

    group = None

    def __call__(self, q_BThd, k_BThd, v_BThd, *, scale, window, local_kind, sink_h):
        o = causal_attention(q_BThd.transpose(1, 2), k_BThd.transpose(1, 2), v_BThd.transpose(1, 2),
                             scale=scale, window=window, local_kind=local_kind, sink_h=sink_h)
        return o.transpose(1, 2)


class UlyssesCore(LocalCore):
    """Ulysses all-to-all attention over the sequence group ``group`` (module docstring)."""

    def __init__(self, group) -> None:
        self.group = group

    def __call__(self, q_BThd, k_BThd, v_BThd, *, scale, window, local_kind, sink_h):
        D, r = shim.group_size(self.group), shim.group_rank(self.group)
        if D == 1:
            return super().__call__(q_BThd, k_BThd, v_BThd, scale=scale, window=window,
                                    local_kind=local_kind, sink_h=sink_h)
        for name, t in (("q heads", q_BThd), ("k/v heads", k_BThd)):
            if t.shape[2] % D:
                raise ValueError(f"Ulysses: {name} ({t.shape[2]}) must be divisible by D ({D})")
        q, k, v = (_SeqToHead.apply(t.contiguous(), self.group) for t in (q_BThd, k_BThd, v_BThd))
        hl = q.shape[2]
        sink = None if sink_h is None else sink_h[r * hl:(r + 1) * hl]
        o = super().__call__(q, k, v, scale=scale, window=window, local_kind=local_kind, sink_h=sink)
        return _HeadToSeq.apply(o.contiguous(), self.group)


class Attention(nn.Module):
    """GQA / MHA attention: q/k/v/o projections (biases), QK-norm, RoPE, sinks, local window."""

    def __init__(self, spec, layer: int, core=None, *, device=None, dtype=None) -> None:
        super().__init__()
        H, nh, nkv, d, dv = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.v_dim
        kw = dict(device=device, dtype=dtype)
        fam = family(spec.model_type)
        self.core = core or LocalCore()
        self.nh, self.nkv, self.d, self.dv = nh, nkv, d, dv
        self.wq = nn.Linear(H, nh * d, bias=spec.attention_bias, **kw)
        self.wk = nn.Linear(H, nkv * d, bias=spec.attention_bias, **kw)
        self.wv = nn.Linear(H, nkv * dv, bias=spec.attention_bias, **kw)
        self.wo = nn.Linear(nh * dv, H, bias=spec.attention_bias, **kw)
        self.q_norm = RMSNorm(d, **kw) if spec.qk_norm else None
        self.k_norm = RMSNorm(d, **kw) if spec.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(nh, **kw)) if spec.attention_sinks else None
        local = layer in set(spec.local_layers) and spec.sliding_window is not None
        self.window = spec.sliding_window if local else None
        self.local_kind = fam.local_kind
        self.use_rope = local or fam.local_kind != "chunked"      # Llama 4: NoPE global layers
        self.theta = spec_theta(spec)
        self.scale = d ** -0.5

    def reset_parameters(self) -> None:
        for lin in (self.wq, self.wk, self.wv, self.wo):
            init_linear(lin)
        for n in (self.q_norm, self.k_norm):
            if n is not None:
                n.reset_parameters()
        if self.sinks is not None:
            init_normal(self.sinks, 1.0)

    def forward(self, x_BTH: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTH.shape
        q = self.wq(x_BTH).view(B, T, self.nh, self.d)
        k = self.wk(x_BTH).view(B, T, self.nkv, self.d)
        v = self.wv(x_BTH).view(B, T, self.nkv, self.dv)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            cos, sin = rope_tables(positions_T, self.d, self.theta)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = self.core(q, k, v, scale=self.scale, window=self.window, local_kind=self.local_kind,
                      sink_h=self.sinks)
        return self.wo(o.reshape(B, T, self.nh * self.dv))


def spec_theta(spec) -> float:
    """RoPE base of ``spec`` (stated in its profile's ``source``)."""
    return rope_theta(spec.source)


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2 §2.1): low-rank q (optional) and joint kv latent,
    decoupled RoPE on ``d_rope`` channels shared by every head's key."""

    def __init__(self, spec, layer: int, core=None, *, device=None, dtype=None) -> None:
        super().__init__()
        a, H, nh = spec.mla, spec.hidden_size, spec.num_heads
        kw = dict(device=device, dtype=dtype)
        self.core = core or LocalCore()
        self.nh, self.nope, self.rope, self.dv = nh, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        self.kv_rank = a.kv_lora_rank
        qk = self.nope + self.rope
        if a.q_lora_rank:
            self.wq_a = nn.Linear(H, a.q_lora_rank, bias=False, **kw)
            self.q_norm = RMSNorm(a.q_lora_rank, **kw)
            self.wq_b = nn.Linear(a.q_lora_rank, nh * qk, bias=False, **kw)
            self.wq = None
        else:
            self.wq = nn.Linear(H, nh * qk, bias=False, **kw)
        self.wkv_a = nn.Linear(H, a.kv_lora_rank + self.rope, bias=False, **kw)
        self.kv_norm = RMSNorm(a.kv_lora_rank, **kw)
        self.wkv_b = nn.Linear(a.kv_lora_rank, nh * (self.nope + self.dv), bias=False, **kw)
        self.wo = nn.Linear(nh * self.dv, H, bias=False, **kw)
        self.theta = spec_theta(spec)
        self.scale = qk ** -0.5
        local = layer in set(spec.local_layers) and spec.sliding_window is not None
        self.window, self.local_kind = (spec.sliding_window if local else None), family(spec.model_type).local_kind

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                init_linear(m)
            elif isinstance(m, RMSNorm):
                m.reset_parameters()

    def forward(self, x_BTH: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTH.shape
        qk = self.nope + self.rope
        q = (self.wq(x_BTH) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x_BTH))))
        q = q.view(B, T, self.nh, qk)
        kv = self.wkv_a(x_BTH)
        c_kv, k_pe = kv[..., :self.kv_rank], kv[..., self.kv_rank:].reshape(B, T, 1, self.rope)
        kvb = self.wkv_b(self.kv_norm(c_kv)).view(B, T, self.nh, self.nope + self.dv)
        k_nope, v = kvb[..., :self.nope], kvb[..., self.nope:]
        cos, sin = rope_tables(positions_T, self.rope, self.theta)
        q = torch.cat([q[..., :self.nope], apply_rope(q[..., self.nope:], cos, sin)], -1)
        k_pe = apply_rope(k_pe, cos, sin).expand(B, T, self.nh, self.rope)
        k = torch.cat([k_nope, k_pe], -1)
        o = self.core(q, k, v, scale=self.scale, window=self.window, local_kind=self.local_kind,
                      sink_h=None)
        return self.wo(o.reshape(B, T, self.nh * self.dv))


def make_attention(spec, layer: int, core=None, *, device=None, dtype=None) -> nn.Module:
    """The attention block of layer ``layer`` for ``spec.attention``."""
    cls = MLAttention if spec.attention == "mla" else Attention
    return cls(spec, layer, core, device=device, dtype=dtype)
