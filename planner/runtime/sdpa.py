"""Causal attention through ``scaled_dot_product_attention`` on the flash / memory-efficient
kernels only (DESIGN §7: the math backend materialises ``S²`` and is refused on CUDA).

Legend: ``B`` sequences, ``h`` query heads, ``h_kv`` key/value heads (GQA: ``h_kv | h``), ``S``
tokens, ``d`` query/key width, ``d_v`` value width, ``w`` local window, ``n_b = ceil(S/w)`` blocks,
``q_BhSd``/``k_BhSd``/``v_BhSd``, ``sink_h`` one learned sink logit per query head (fp32 math).

Variants (all exact, the same softmax as the dense formula):

- **global**: ``is_causal=True`` (flash).
- **sinks** (gpt-oss): a sink is an extra key every query sees, with logit ``sink_h`` and a zero
  value. Queries and keys get 8 extra channels: the queries carry ``sink_h/scale`` in the first,
  the sink key carries 1, every real key 0 (so real scores are unchanged). The sink key is put
  first and one dummy query row is put first as well, so ``is_causal`` (top-left aligned) lets
  real query ``i`` see the sink and keys ``0..i``. Cost: one padded copy of q, k, v
  (``S·(h + 2·h_kv)·(d+8)``) and its gradient.
- **sliding** (token ``i`` sees ``i-w < j <= i``): queries in ``n_b`` blocks of ``w``; block ``t``
  sees the keys of blocks ``t-1`` and ``t`` (an unfolded copy of K and V, twice their size) through
  an additive mask ``[n_b, 1, w, L_k]`` (``L_k = 2w`` (+1 sink), rounded up to 16; ``S·L_k``
  elements) on the memory-efficient kernel. K/V heads are expanded to ``h`` for that kernel.
- **chunked** (Llama 4, token ``i`` sees its own ``w``-chunk causally): reshape into ``n_b``
  sequences of ``w`` and ``is_causal`` (flash); no copy beyond the padding of ``S`` to ``n_b·w``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from planner.plans.sdpa_layout import MASK_ALIGN, SINK_PAD

CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
"""The kernels allowed on CUDA (never the math backend)."""
CPU_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""On the CPU (tests) the math backend is allowed."""


def _no_kernel(e: RuntimeError) -> bool:
    return "no available kernel" in str(e).lower()


def _sdpa(q, k, v, enable_gqa: bool = False, **kw):
    """SDPA on the allowed kernels; GQA natively (``enable_gqa``) where the kernel takes it, else
    with K/V expanded to ``h`` heads (a copy of ``h/h_kv`` times their size)."""
    backends = CUDA_BACKENDS if q.is_cuda else CPU_BACKENDS
    try:
        with sdpa_kernel(backends):
            if enable_gqa:
                try:
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
                except RuntimeError as e:
                    if not _no_kernel(e):
                        raise
                k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
            return F.scaled_dot_product_attention(q, k, v, **kw)
    except RuntimeError as e:
        if not _no_kernel(e):
            raise
        raise RuntimeError(
            f"attention: neither the flash nor the memory-efficient SDPA kernel accepts q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} ({q.dtype}, mask="
            f"{kw.get('attn_mask') is not None}); the math backend would materialise S² scores and is "
            "refused; fix: use bf16/fp16 on a GPU the kernels support, head widths the kernels "
            "accept (<= 256, multiple of 8)") from e


def _expand_kv(k, h):
    return k if k.shape[1] == h else k.repeat_interleave(h // k.shape[1], dim=1)


def _with_sink_channels(q, k, v, sink_h, scale):
    """q, k, v padded with ``SINK_PAD`` channels (v to q's width) and the sink key/value rows."""
    B, h, S, d = q.shape
    pad = q.new_zeros(B, h, S, SINK_PAD)
    col = (sink_h / scale).to(q.dtype)[None, :, None, None].expand(B, h, S, 1)
    q2 = torch.cat([q, col, pad[..., 1:]], -1)
    k2 = torch.cat([k, k.new_zeros(*k.shape[:3], SINK_PAD)], -1)
    dp = q2.shape[-1]
    v2 = F.pad(v, (0, dp - v.shape[-1]))
    sink_k = k.new_zeros(B, k.shape[1], 1, dp)
    sink_k[..., d] = 1.0
    return q2, k2, v2, sink_k


def causal_attention(q_BhSd, k_BhSd, v_BhSd, *, scale: float, window: int | None = None,
                     local_kind: str = "sliding", sink_h: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention ``[B, h, S, d_v]`` (module docstring for the variants)."""
    if window is not None and window < q_BhSd.shape[2]:
        if local_kind == "chunked":
            return _chunked(q_BhSd, k_BhSd, v_BhSd, scale, window, sink_h)
        return _sliding(q_BhSd, k_BhSd, v_BhSd, scale, window, sink_h)
    return _global(q_BhSd, k_BhSd, v_BhSd, scale, sink_h)


def _global(q, k, v, scale, sink_h):
    gqa = k.shape[1] != q.shape[1]
    if sink_h is None:
        return _sdpa(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    dv = v.shape[-1]
    q2, k2, v2, sink_k = _with_sink_channels(q, k, v, sink_h, scale)
    q3 = torch.cat([q2.new_zeros(*q2.shape[:2], 1, q2.shape[-1]), q2], 2)
    k3 = torch.cat([sink_k, k2], 2)
    v3 = torch.cat([v2.new_zeros(*v2.shape[:2], 1, v2.shape[-1]), v2], 2)
    del q2, k2, v2
    o = _sdpa(q3, k3, v3, is_causal=True, scale=scale, enable_gqa=gqa)
    return o[:, :, 1:, :dv]


def _blocks(x, w, nb):
    """``[B, h, S, d]`` → ``[B·n_b, h, w, d]`` (S padded to ``n_b·w``)."""
    B, h, S, d = x.shape
    x = F.pad(x, (0, 0, 0, nb * w - S))
    return x.view(B, h, nb, w, d).transpose(1, 2).reshape(B * nb, h, w, d)


def _unblock(o, B, S):
    nbB, h, w, d = o.shape
    return o.view(B, nbB // B, h, w, d).transpose(1, 2).reshape(B, h, -1, d)[:, :, :S]


def _chunked(q, k, v, scale, w, sink_h):
    B, S = q.shape[0], q.shape[2]
    nb = -(-S // w)
    o = _global(_blocks(q, w, nb), _blocks(k, w, nb), _blocks(v, w, nb), scale,
                None if sink_h is None else sink_h)
    return _unblock(o, B, S)


def _sliding(q, k, v, scale, w, sink_h):
    B, h, S, d = q.shape
    dv = v.shape[-1]
    nb = -(-S // w)
    k, v = _expand_kv(k, h), _expand_kv(v, h)
    if sink_h is not None:
        q, k, v, sink_k = _with_sink_channels(q, k, v, sink_h, scale)
    qb = _blocks(q, w, nb)                                              # [B·nb, h, w, d']

    def two_blocks(x):                                                  # keys of blocks t-1, t
        x = F.pad(x, (0, 0, w, nb * w - S))                            # [B, h, (nb+1)·w, d']
        xb = x.unfold(2, 2 * w, w)                                      # [B, h, nb, d', 2w]
        return xb.permute(0, 2, 1, 4, 3).reshape(B * nb, h, 2 * w, x.shape[-1])

    kb, vb = two_blocks(k), two_blocks(v)
    n_sink = 0 if sink_h is None else 1
    lk = 2 * w + n_sink
    lk_pad = -(-lk // MASK_ALIGN) * MASK_ALIGN
    if n_sink:
        kb = torch.cat([kb, sink_k[:, :, :1].expand(B, h, 1, -1).repeat_interleave(nb, 0)], 2)
        vb = torch.cat([vb, vb.new_zeros(B * nb, h, 1, vb.shape[-1])], 2)
    kb, vb = F.pad(kb, (0, 0, 0, lk_pad - lk)), F.pad(vb, (0, 0, 0, lk_pad - lk))
    a = torch.arange(w, device=q.device)[:, None]
    c = torch.arange(lk_pad, device=q.device)[None, :]
    t = torch.arange(nb, device=q.device)[:, None, None]
    ok = (c > a) & (c <= a + w) & ((t > 0) | (c >= w))                  # [nb, w, lk_pad]
    if n_sink:
        ok = ok | (c == 2 * w)
    bias = torch.zeros(ok.shape, dtype=q.dtype, device=q.device).masked_fill_(~ok, float("-inf"))
    bias = bias[:, None].repeat(B, 1, 1, 1).expand(B * nb, h, w, lk_pad)
    o = _sdpa(qb, kb, vb, attn_mask=bias, scale=scale)
    return _unblock(o, B, S)[..., :dv]
