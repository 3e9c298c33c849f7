"""MLA attention budget (``planner.budget.attention_mla``): the inventory at the efficient kernel.

The counts are checked against the shapes of ``planner/runtime/attention.py`` MLAttention +
UlyssesCore: at ``D = 1`` no head layout and no ``head_to_seq`` buffers; at ``D > 1`` the head
layout ``N·n_h·(2·d_qk + d_v)`` and the two ``head_to_seq`` buffers, which in bf16 cover the fp32
output accumulator (so its workspace excess is 0).
"""

from __future__ import annotations

from planner.api import build_planfile
from planner.budget import attention_mla, workspace
from planner.budget.build import make_context
from planner.budget.terms import Phase

MODEL = "deepseek-v2-lite"
SEQ_LEN = 65536


def _ctx(W):
    pf = build_planfile(model=MODEL, gpus=W, seq_len=SEQ_LEN)
    return make_context(pf.model, pf.cluster, pf.workload, pf.plan)


def _bytes(ts, name, ph):
    return sum(int(t.bytes_in(ph)) for t in ts if t.name.startswith(name))


def test_head_layout_only_under_ulysses():
    from planner.budget import attention

    for W in (1, 8):
        ctx = _ctx(W)
        m, N, b = ctx.model, int(ctx.tokens_per_rank), ctx.act_bytes
        fw = Phase("forward", 1, "attention")
        ts = attention.terms(ctx)
        D = int(ctx.seq_parallel)
        heads = N * m.num_heads * (2 * m.head_dim + m.v_dim) * b
        assert _bytes(ts, "q, k, v, head layout", fw) == (heads if D > 1 else 0)
        h2s = 2 * N * m.num_heads * m.v_dim * b
        assert _bytes(ts, "head_to_seq", fw) == (h2s if D > 1 else 0)
        acc = 4 * N * m.num_heads * m.v_dim            # d_qk = 192 > 128: the kernel accumulates in fp32
        ws = _bytes(workspace.terms(ctx), "efficient attention forward", fw)
        assert ws == max(acc - (h2s if D > 1 else 0), 0)
        assert attention_mla.output_accumulator_elems(ctx) * 4 == acc


def test_backward_saved_inputs_follow_the_layout():
    from planner.budget import attention

    for W in (1, 8):
        ctx = _ctx(W)
        m, N, b = ctx.model, int(ctx.tokens_per_rank), ctx.act_bytes
        bw = Phase("backward", 1, "attention")
        d_nope = m.mla.qk_nope_head_dim
        saved = _bytes(attention.terms(ctx), "kernel's saved q, k, v", bw)
        extra = 0 if int(ctx.seq_parallel) > 1 else N * m.num_heads * d_nope * b
        assert saved == N * m.num_heads * (2 * m.head_dim + m.v_dim) * b + extra
        ws = _bytes(workspace.terms(ctx), "efficient attention backward", bw)
        assert ws == max(4 * N * m.num_heads * (m.head_dim + 1) - max(_recompute_lead(ctx), 0), 0)
        assert _bytes(workspace.terms(ctx), "FlashAttention", bw) == 0


def _recompute_lead(ctx) -> int:
    """The recompute sub-step's bytes over the kernel's, from MLAttention's shapes (D > 1): the kv
    latent, roped k_pe, the k_nope | v block, q and k, head_to_seq's two buffers and the restored
    input, less the region's weight gradients, against the output's and q, k, v's gradients."""
    from planner.budget.regions import attention_region_params

    m, N, H, b = ctx.model, int(ctx.tokens_per_rank), ctx.hidden_size, ctx.act_bytes
    if int(ctx.seq_parallel) == 1:
        return -1
    a, n_h, d_qk, d_v = m.mla, m.num_heads, m.head_dim, m.v_dim
    rec = (N * (a.kv_lora_rank + a.qk_rope_head_dim) + N * a.qk_rope_head_dim
           + N * n_h * (a.qk_nope_head_dim + d_v) + 2 * N * n_h * d_qk + 2 * N * n_h * d_v + N * H)
    ker = N * n_h * d_v + N * n_h * (2 * d_qk + d_v)
    return (rec - attention_region_params(m) - ker) * b


def test_backward_holds_the_larger_of_kernel_and_recompute():
    """At D > 1 (the trace's W = 8, S = 32768: N = 4096) the recompute sub-step binds: its terms,
    the restored input and no region gradient replace the kernel's gradients; at D = 1 the kernel's."""
    from planner.budget import attention, boundaries, gathered

    for W, S, rec in ((1, SEQ_LEN, False), (8, 32768, True)):
        pf = build_planfile(model=MODEL, gpus=W, seq_len=S)
        ctx = make_context(pf.model, pf.cluster, pf.workload, pf.plan)
        m, N, b = ctx.model, int(ctx.tokens_per_rank), ctx.act_bytes
        assert (_recompute_lead(ctx) > 0) == rec == bool(attention_mla.recompute_binds(ctx))
        bw = Phase("backward", 1, "attention")
        ts = attention.terms(ctx)
        grads = N * m.num_heads * (m.head_dim * 2 + m.v_dim * 2) * b
        assert _bytes(ts, "grad", bw) == (0 if rec else grads)
        assert (_bytes(ts, "recompute: head_to_seq", bw) > 0) == rec
        held = _bytes(boundaries.terms(ctx), "region input", bw)
        assert held == (ctx.tokens_per_rank * ctx.hidden_size * b if rec else 0)
        unred = _bytes(gathered.terms(ctx), "unreduced grads", bw)
        from planner.budget import regions

        assert ctx.regions[1] == "dense_mlp"    # region 2 (layer 0's dense FFN): its held reduce-scatter input
        own = 0 if rec else regions.attention_region_params(m)
        assert unred == (own + regions.dense_region_params(m)) * b
