"""Shared fixtures: shipped profiles and small synthetic models."""

from __future__ import annotations

import pytest

from planner.context.ctx import Ctx
from planner.schema import ModelSpec
from planner.schema.io import load_cluster


@pytest.fixture(scope="session")
def h200():
    """The shipped H200 cluster profile."""
    return load_cluster("h200")


def tiny_moe(**kw) -> ModelSpec:
    """A small MoE model whose sizes divide evenly (exact owner formulas)."""
    base = dict(name="tiny-moe", num_layers=4, hidden_size=256, vocab_size=4096, num_heads=8, num_kv_heads=4,
                head_dim=32, num_experts=16, top_k=2, expert_ffn=128)
    base.update(kw)
    return ModelSpec(**base)


def vocab_ctx(*, N, H, V, P=1, B_v=1, b=2, vocab_op="ring_dtp", stack="composed", tp=1) -> Ctx:
    """A context holding only what the vocab terms read (no model or cluster needed)."""
    return Ctx(model=None, cluster=None, stack=stack, num_layers=1, num_boundaries=2, hidden_size=H,
               expert_ffn=0, dense_ffn=0, num_experts=0, top_k=0, vocab_size=V, num_heads=1,
               num_kv_heads=1, head_dim=1, v_head_dim=1, params={}, num_params=0, seq_len=N,
               seqs_per_microbatch=1, tokens_per_rank=N, world_size=8, act_bytes=b, routing="balanced",
               routing_hot_share=0.0, routing_hot_experts=0, routing_text="balanced",
               dispatch_bound="guarantee", vocab=vocab_op, vocab_parallel=P, vocab_blocks=B_v, tp=tp)
