"""Shared fixtures: shipped profiles and small synthetic models."""

from __future__ import annotations

import pytest

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
