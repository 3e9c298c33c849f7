"""The exchange sub-step of a global GQA attention layer (``planner.budget.attention.exchange_moments``)
against the runtime's blocks in the H200 allocator history of gpt-oss-20b without checkpointing
(``bench/results/memory_snapshot/gptoss-W16-S32768-none.json`` forward[3], D = 8, N = 4096, at
``head_to_seq``; ``gptoss-W1-S8192-none.json``, D = 1, where the q-RoPE sub-step binds). Sinks add
one key / query row per sequence and head (``sdpa._global``), which the formula leaves out."""

from __future__ import annotations

from planner.api import build_planfile
from planner.budget import attention
from planner.budget.build import make_context
from planner.budget.terms import Phase

FW3 = Phase("forward", 3, "attention")


def _ctx(W, S):
    pf = build_planfile(model="gpt-oss-20b", gpus=W, seq_len=S, overrides={"checkpoint": "none"})
    return make_context(pf.model, pf.cluster, pf.workload, pf.plan)


def _moments(ctx):
    m = ctx.model
    return attention.exchange_moments(ctx, int(ctx.tokens_per_rank), ctx.hidden_size, m.num_heads,
                                      m.num_kv_heads, m.head_dim, m.v_dim)


def _bytes(ctx, name):
    return sum(int(t.bytes_in(FW3)) for t in attention.terms(ctx) if t.name.startswith(name))


def test_ulysses_sinks_none_binds_at_head_to_seq():
    ctx = _ctx(16, 32768)
    assert int(ctx.seq_parallel) == 8 and int(ctx.tokens_per_rank) == 4096
    mo, b = _moments(ctx), ctx.act_bytes
    sink_rows = 8 * 72 * 2                                       # one row of h/D = 8 heads, d_qk + 8 wide
    assert mo.head_qkv * b == 33554432 + 2 * 4194304             # attention.py:54
    assert 0 <= 37749888 - mo.kernel_out * b <= sink_rows         # sdpa.py:51
    assert mo.exchange_out * b == 2 * 33554432                   # attention.py:98 and :64
    assert mo.proj_out == 0                                      # no o-projection output yet
    assert 0 <= 37749888 + 2 * 4718736 - mo.padded_qkv * b <= 3 * sink_rows   # sdpa.py:102-104
    assert _bytes(ctx, "o-projection input") == 33554432         # attention.py:66
    assert _bytes(ctx, "o-projection output") == 0


def test_no_head_layout_at_d1():
    ctx = _ctx(1, 8192)
    mo = _moments(ctx)
    assert int(ctx.seq_parallel) == 1
    assert mo.head_qkv == 0 and mo.exchange_out == 0             # LocalCore: transposed views
    assert mo.proj_out == ctx.hidden_size * int(ctx.tokens_per_rank)
    # the q-RoPE sub-step binds (the H200 history's forward[3] peak is at model_layers.py:91)
    assert _bytes(ctx, "q RoPE in fp32") > 0 and _bytes(ctx, "kernel output") == 0
