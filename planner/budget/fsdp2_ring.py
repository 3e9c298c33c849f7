"""The FSDP2 baseline's attention kernel moments (``planner.budget.fsdp2_layer``, whose legend this
shares): torch's ring attention under context parallelism
(``torch.distributed.tensor.experimental.context_parallel``, which replaces the SDPA kernels of the
step by ``_templated_ring_attention`` and its backward), and MLA's own tensors beside the kernel.
Each returns the items live at its moment beyond the sub-step's common rows.

Legend beyond ``fsdp2_layer``'s: ``kv = N·h_kv·(d_qk+d_v)`` one rank's keys and values, ``[cp]`` 1
when ``cp > 1``, ``[ag]`` 1 under the all-gather rotation.

forward, at the first ring step's merge (its kernel output converted to fp32; the rotation's
all-gathered ``cp·kv`` is ``fsdp2_layer._cp_kv``)
    K/V contiguous copies       kv [cp]          the ring's ``key.contiguous()``, ``value.contiguous()``
                                                 (q, k, v reach the kernel as transposed views)
    K/V send buffer             kv [cp]          ``torch.cat([k, v])``, the all-gather's input; under
                                                 the all-to-all rotation (``2·kv`` of send and receive
                                                 in ``_cp_kv``) the previous step's receive, which k
                                                 and v still view at step 1's exchange (cp > 2; one
                                                 kv over at cp = 2)
    SAC-saved q projection      N·h_q·d_qk [ac = selective]  torchtitan's policy keeps the first
                                                 ``mm`` of the layer, q's (+ k's under attention
                                                 bias), whose roped copy the kernel reads
    fp32 output                 N·h_q·d_v (fp32) the merger's copy (``convert_to_f32``) [cp], or the
                                                 memory-efficient kernel's output accumulator
                                                 [max(d_qk, d_v) > 128]: one moment or the other
    RoPE cos/sin tables         N·d_rot (fp32)   still held by the attention's forward
    MLA                         N·(r_kv + d_rope) the kv latent, N·h_q·d_nope the keys' no-RoPE part in
                                                 the ``kv_b`` output block that v views, N·d_rope the
                                                 roped shared key head
The o-projection's output is made after the ring has freed all of these: its own moment
(``fsdp2_layer``'s ``attention o-projection`` sub-step).

backward, at the first ring step's dK/dV exchange (after its kernel, whose workspace is freed)
    K/V contiguous copies       kv [cp]
    K/V send buffer and one     2·kv [cp·ag]     ``torch.cat([k, v])`` and one more kv-sized b-byte
    more kv-sized block                          block inside the node (the allocator history below)
    fp32 gradient accumulators  N·(h_q·d_qk) + kv (fp32) [cp]   ``zeros_like(..., float32)``
    dK/dV exchange              2·kv (fp32) [cp] ``torch.cat([dk, dv])`` and the all-to-all's receive
    wo's weight gradient        H·h_q·d_v        (wq's, wkv_a's and wkv_b's come after the kernel)
    o-projection input copy     −N·h_q·d_v [cp]  the copy of the ring's output that wo saved (booked
                                                 in the saved tensors ``A``) is freed by wo's backward
    beside ``A``, the kernel's gradients of q, k, v and o, the all-gathered K/V and, in a dense
    layer, the FFN's weight gradients (the layer unit is reduce-scattered after its whole backward);
    the one N·H gradient is the phase's layer-output gradient (``boundaries``)
and at the kernel itself (``fsdp2_layer``'s ``attention`` sub-step) the same rows but the exchange,
with the kernel's workspace, the attention-region gradient and every attention weight gradient.

Source: the H200 allocator history of ``planner validate`` on DeepSeek-V2-Lite FSDP2 W = 8, cp = 8,
S = 393216 (``bench/results/memory_snapshot/fsdp2-dsv2-W8-S393216-cp8.json``, held-out round 10,
where the dense first layer's attention binds): forward[1] ``sdpa.py`` 7 blocks of 40960, 5120,
4096, 3072, 2048, 2048 and 32 ``N·b`` (all-gathered K/V, send buffer, fp32 output, k and v copies,
output, lse), ``attention.py`` latent 576 and ``kv_b`` block 4096; backward[1]
ScaledDotProductEfficientAttentionBackward0 13 blocks of 40960, 2 × 10240, 2 × 6144, 2 × 5120,
4096, 3 × 3072, 2 × 2048 ``N·b``. The booked forward[1] read 0.847 and backward[1] 0.824 of it
without these rows. Held out in round 11 (``validate_heldout_r11.json``): cp = 4, 8, 16, F = 16, N =
16384–49152, ac = none, both lifetimes within; the two misses were read from their own histories:
the all-to-all rotation's third K/V buffer (``fsdp2-dsv2-W8-S262144-cp8-alltoall.json``, ``sdpa.py``
3 × 5120 ``N·b``; forward[1] 0.962) and SAC's saved q projection (``…-selective.json``,
``attention.py`` q's 3072 ``N·b``; forward[1] 0.971).
"""

from __future__ import annotations

import numpy as np

from planner.budget.attention_mla import needs_output_accumulator
from planner.budget.fsdp2_moments import Item, rope_tables
from planner.budget.fsdp2_saved import SAC_SOURCE
from planner.context.ctx import Ctx

SOURCE = ("torch's ring attention (_templated_ring_attention and its backward); H200 allocator history, "
          "bench/results/memory_snapshot/fsdp2-dsv2-W8-S393216-cp8.json")


def _ring(ctx: Ctx):
    """``[cp > 1]``: the ring attention runs."""
    return np.asarray(ctx.cp) > 1


def _kv(N, hkv, d_qk, d_v):
    return N * hkv * (d_qk + d_v)


def fp32_output_elems(ctx: Ctx, N, hq, d_v):
    """``N·h_q·d_v`` where an fp32 copy of the attention output exists at the kernel: the ring's
    merged output (``cp > 1``) or the memory-efficient kernel's accumulator
    (``attention_mla.needs_output_accumulator``)."""
    return N * hq * d_v * (_ring(ctx) | needs_output_accumulator(ctx.model))


def mla_forward(ctx: Ctx, N, hq, b: int) -> list[Item]:
    """MLA's tensors at the kernel beyond q, k, v: the kv latent, the no-RoPE keys beside v in the
    ``kv_b`` block, the roped shared key head."""
    m = ctx.model
    if m.attention != "mla" or m.mla is None:
        return []
    a = m.mla
    return [Item("attention", "MLA kv latent (wkv_a output)", N * (a.kv_lora_rank + a.qk_rope_head_dim), b,
                 "N·(r_kv + d_rope)", SOURCE),
            Item("attention", "MLA keys' no-RoPE part in the kv_b block (v views the rest)",
                 N * hq * a.qk_nope_head_dim, b, "N·h_q·d_nope", SOURCE),
            Item("attention", "MLA roped shared key head", N * a.qk_rope_head_dim, b, "N·d_rope", SOURCE)]


def forward_kernel(ctx: Ctx, N, hq, hkv, d_qk, d_v, b: int) -> list[Item]:
    """Items at the forward kernel's moment beyond normed input, q, k, v, output, lse and the
    all-gathered K/V (module docstring)."""
    on, kv = _ring(ctx), _kv(N, hkv, d_qk, d_v)
    return [Item("attention", "ring attention: K/V contiguous copies", kv * on, b, "kv·[cp>1]", SOURCE),
            Item("attention", "ring attention: K/V send buffer (all-gather input; all-to-all: the previous "
                 "step's receive, which k and v still view)", kv * on, b, "kv·[cp>1]", SOURCE),
            Item("attention", "attention output in fp32 (ring merge, or the efficient kernel's accumulator)",
                 fp32_output_elems(ctx, N, hq, d_v), 4, "N·h_q·d_v·[cp>1 or max(d_qk,d_v)>128, MLA]", SOURCE),
            rope_tables(ctx, N),
            *mla_forward(ctx, N, hq, b), *sac_projection(ctx, N, hq, hkv, d_qk, b)]


def sac_projection_elems(ctx: Ctx, N, hq, hkv, d_qk):
    """Elements of the projections SAC keeps beside the kernel's (roped) q and k under ``ac =
    selective``: q's output (the layer's first ``mm``, saved), and k's too where an attention bias
    makes every projection an ``addmm`` (all saved; v's output is the kernel's v itself)."""
    if ctx.ac != "selective":
        return 0
    m = ctx.model
    biased = bool(m.attention_bias) and m.attention != "mla"
    return N * hq * d_qk + (N * hkv * d_qk if biased else 0)


def sac_projection(ctx: Ctx, N, hq, hkv, d_qk, b: int) -> list[Item]:
    return [Item("attention", "SAC-saved q (and biased k) projection output beside its roped copy",
                 sac_projection_elems(ctx, N, hq, hkv, d_qk), b, "N·h_q·d_qk (+ N·h_kv·d_qk biased) [ac = selective]",
                 SAC_SOURCE)]


def backward_kernel(ctx: Ctx, N, hq, hkv, d_qk, d_v, b: int) -> list[Item]:
    """Items of the ring backward live at its kernel (and after it): the K/V copies, send buffers
    and the fp32 gradient accumulators."""
    on, kv = _ring(ctx), _kv(N, hkv, d_qk, d_v)
    ag = on & (ctx.cp_rotate == "allgather")
    return [Item("attention", "ring attention's o-projection input copy, freed by wo's backward",
                 -N * hq * d_v * on, b, "−N·h_q·d_v·[cp>1] (booked in the saved tensors A)", SOURCE),
            Item("attention", "ring attention backward: K/V contiguous copies", kv * on, b, "kv·[cp>1]", SOURCE),
            Item("attention", "ring attention backward: K/V send buffer and one more kv-sized block",
                 2 * kv * ag, b, "2·kv·[cp>1, allgather]", SOURCE),
            Item("attention", "ring attention backward: fp32 gradient accumulators of q, k, v",
                 (N * hq * d_qk + kv) * on, 4, "(N·h_q·d_qk + kv)·[cp>1]", SOURCE)]


def backward_exchange(ctx: Ctx, N, hkv, d_qk, d_v) -> list[Item]:
    """The dK/dV exchange after the first ring step's kernel: its fp32 send and receive."""
    on, kv = _ring(ctx), _kv(N, hkv, d_qk, d_v)
    return [Item("attention", "ring attention backward: dK/dV exchange, send and receive (fp32)", 2 * kv * on, 4,
                 "2·kv·[cp>1]", SOURCE)]
