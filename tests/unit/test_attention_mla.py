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
        assert ws == 4 * N * m.num_heads * (m.head_dim + 1)
        assert _bytes(workspace.terms(ctx), "FlashAttention", bw) == 0
