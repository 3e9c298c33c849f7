"""MLA attention budget (``planner.budget.attention_mla``): the inventory at the efficient kernel.

The counts are checked against the shapes of ``planner/runtime/attention.py`` MLAttention +
UlyssesCore: at ``D = 1`` no head layout and no ``head_to_seq`` buffers; at ``D > 1`` the head
layout ``N·n_h·(2·d_qk + d_v)`` and the two ``head_to_seq`` buffers, which in bf16 cover the fp32
output accumulator (so its workspace excess is 0); without checkpointing the o-projection moment
and the kernel sub-step with wo's gradient (H200 allocator histories, bench/results/memory_snapshot/).
"""

from __future__ import annotations

from planner.api import build_planfile
from planner.budget import attention_mla, workspace
from planner.budget.build import make_context
from planner.budget.terms import Phase

MODEL = "deepseek-v2-lite"
SEQ_LEN = 65536


def _ctx(W, S=SEQ_LEN, **overrides):
    pf = build_planfile(model=MODEL, gpus=W, seq_len=S, overrides=overrides or None)
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
        assert _bytes(ts, "o-projection moment", fw) == (h2s if D > 1 else 0)
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
        assert ws == max(4 * attention_mla.backward_workspace_elems(ctx) - max(_recompute_lead(ctx), 0), 0)
        assert _bytes(workspace.terms(ctx), "FlashAttention", bw) == 0


def test_backward_workspace_is_the_measured_one():
    """The efficient backward's workspace + delta, as ScaledDotProductEfficientAttentionBackward0
    allocated them on the H200 (bench/results/memory_snapshot/: dsv2-W32-S32768-none, dsv2-W1-S8192-none,
    dsv2-W8-S8192-no-checkpoint backward[3]; delta is its own S·B·h_l·4 block)."""
    for W, S, ws in ((32, 32768, 44838912), (1, 8192, 119586816), (8, 8192, 32249856)):
        ctx = _ctx(W, S, checkpoint="none")
        delta = int(ctx.tokens_per_rank) * ctx.model.num_heads * 4
        assert attention_mla.backward_workspace_elems(ctx) * 4 == ws + delta


def test_no_checkpoint_o_projection_and_kernel_substep():
    """checkpoint = none: the forward peaks at wo's output (h_l = 1 at D = 16: the receive, wo's input
    copy and output; h_l = 2: the larger of receive + copy and copy + output); the backward at the
    kernel sub-step with the output's and q, k, v's gradients, never the recompute."""
    from planner.budget import attention

    for W, S in ((32, 32768), (8, 32768), (1, 8192)):
        ctx = _ctx(W, S, checkpoint="none")
        m, N, H, b = ctx.model, int(ctx.tokens_per_rank), ctx.hidden_size, ctx.act_bytes
        D, o = int(ctx.seq_parallel), N * m.num_heads * m.v_dim
        want = N * H if D == 1 else (2 * o + N * H if m.num_heads // D == 1 else o + max(o, N * H))
        ts = attention.terms(ctx)
        assert _bytes(ts, "o-projection moment", Phase("forward", 3, "attention")) == want * b
        assert not attention_mla.recompute_binds(ctx)
        bw = Phase("backward", 3, "attention")
        assert _bytes(ts, "recompute", bw) == 0
        assert _bytes(ts, "grads of q, k, v", bw) == N * m.num_heads * (2 * m.head_dim + m.v_dim) * b
        assert _bytes(ts, "RoPE", Phase("forward", 3, "attention")) == 0   # boundaries books them


def _recompute_lead(ctx) -> int:
    """The recompute sub-step's bytes over the kernel's, from MLAttention's shapes (D > 1): the kv
    latent, roped k_pe, the k_nope | v block, q and k, head_to_seq's two buffers and the restored
    input, against the output's and q, k, v's gradients and wo's weight gradient."""
    m, N, H, b = ctx.model, int(ctx.tokens_per_rank), ctx.hidden_size, ctx.act_bytes
    if int(ctx.seq_parallel) == 1:
        return -1
    a, n_h, d_qk, d_v = m.mla, m.num_heads, m.head_dim, m.v_dim
    rec = (N * (a.kv_lora_rank + a.qk_rope_head_dim) + N * a.qk_rope_head_dim
           + N * n_h * (a.qk_nope_head_dim + d_v) + 2 * N * n_h * d_qk + 2 * N * n_h * d_v + N * H)
    ker = N * n_h * d_v + N * n_h * (2 * d_qk + d_v) + H * n_h * d_v     # wo's gradient
    return (rec - ker) * b


def test_backward_holds_the_larger_of_kernel_and_recompute():
    """At D > 1 (the trace's W = 8, S = 32768: N = 4096) the recompute sub-step binds: its terms,
    the restored input and no region gradient replace the kernel's gradients and wo's; at D = 1 the kernel's."""
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
        own = 0 if rec else ctx.hidden_size * m.num_heads * m.v_dim       # wo's gradient alone at the kernel
        assert unred == (own + regions.dense_region_params(m)) * b
