"""Persistent state follows the owner formula (DESIGN §3.2) and FSDP2's layout (DESIGN §2)."""

from __future__ import annotations

import pytest

from planner.budget import persistent
from planner.budget.build import make_context
from planner.schema import BaselineKnobs, ComposedKnobs, Plan, Workload
from tests.conftest import tiny_moe

W = 8


def _bytes(ctx) -> int:
    return sum(int(t.bytes) for t in persistent.terms(ctx))


def _ctx(h200, optimizer="gpu", Ep=W, P=W, stack="composed", cpu_offload=False, model=None):
    m = model or tiny_moe()
    plan = Plan(world_size=W, stack=stack,
                composed=ComposedKnobs(optimizer=optimizer, expert_parallel=Ep, vocab_parallel=P,
                                       checkpoint="per_layer"),
                baseline=BaselineKnobs(cpu_offload=cpu_offload))
    return make_context(m, h200, Workload(seq_len=4096), plan)


def test_composed_reduces_to_16_theta_over_w(h200):
    ctx = _ctx(h200)
    theta = ctx.num_params
    assert theta % W == 0
    assert _bytes(ctx) == 16 * theta // W


@pytest.mark.parametrize("opt", ["stream_offload", "cpu_offload"])
def test_composed_offload_reduces_to_4_theta_over_w(h200, opt):
    ctx = _ctx(h200, optimizer=opt)
    assert _bytes(ctx) == 4 * ctx.num_params // W


def test_owner_formula_with_replicas(h200):
    """E_p = 2, P = 4: 4Θ_dense/W + 4Θ_exp/E_p + 4Θ_head/P + 12Θ/W."""
    ctx = _ctx(h200, Ep=2, P=4)
    p = ctx.params
    expect = 4 * p["dense"] // W + 4 * p["experts"] // 2 + 4 * p["head"] // 4 + 12 * p["total"] // W
    assert _bytes(ctx) == expect


def test_dense_head_is_zero3_sharded(h200):
    m = tiny_moe()
    plan = Plan(world_size=W, composed=ComposedKnobs(vocab="dense", optimizer="gpu", expert_parallel=W,
                                                        checkpoint="per_layer"))
    ctx = make_context(m, h200, Workload(seq_len=4096), plan)
    assert _bytes(ctx) == 16 * ctx.num_params // W


def test_fsdp2_layout(h200):
    ctx = _ctx(h200, stack="fsdp2")
    assert _bytes(ctx) == 16 * ctx.num_params // W
    assert _bytes(_ctx(h200, stack="fsdp2", cpu_offload=True)) == 0
