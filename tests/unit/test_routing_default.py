"""The routing a plan that names none resolves to (``planner.plans.routing.default_routing``):
the named skew for a dispatch with no launch-time bound, ``balanced`` otherwise (issue 13)."""

from __future__ import annotations

import pytest

from planner.budget.build import make_context
from planner.context.resolve import resolve_plan
from planner.plans.routing import NAMED_SKEW, default_routing, launch_time_bound, routing_basis
from planner.schema import ModelSpec, Plan, Workload
from planner.schema.io import load_cluster, load_model

WL = Workload(seq_len=1 << 15)


@pytest.fixture(scope="module")
def moe():
    return load_model("gpt-oss-20b")


@pytest.mark.parametrize("plan, want", [
    (dict(composed={"dispatch": "ep"}), NAMED_SKEW),
    (dict(composed={"dispatch": "llep"}), NAMED_SKEW),
    (dict(composed={"dispatch": "pipelined_llep"}, dispatch_bound="expected"), NAMED_SKEW),
    (dict(stack="fsdp2"), NAMED_SKEW),
    (dict(composed={"dispatch": "pipelined_llep"}), "balanced"),
    (dict(composed={"dispatch": "pipelined_llep", "dispatch_residue": "destination"}), "balanced"),
])
def test_default_follows_the_launch_time_bound(moe, plan, want):
    p = Plan(world_size=8, **plan)
    assert p.routing is None
    assert default_routing(moe, p)[0] == want
    assert launch_time_bound(p) == (want == "balanced")
    resolved = resolve_plan(moe, WL, p)
    assert resolved.routing == want
    ctx = make_context(moe, load_cluster("h200"), WL, p)
    assert ctx.routing_text == want
    assert routing_basis(moe, p)["default"] is True


def test_explicit_routing_wins(moe):
    for r in ("balanced", "worst", "30/16"):
        p = Plan(world_size=8, routing=r, composed={"dispatch": "ep"})
        assert resolve_plan(moe, WL, p).routing == r
        assert routing_basis(moe, p) == {"routing": r, "default": False, "why": "given (--routing or the plan file)"}


def test_dense_model_defaults_to_balanced():
    dense = ModelSpec(name="dense", num_layers=2, hidden_size=256, vocab_size=1000, num_heads=4,
                      num_kv_heads=4, head_dim=64, dense_ffn=512)
    r, why = default_routing(dense, Plan(world_size=8, composed={"dispatch": "ep"}))
    assert (r, why) == ("balanced", "default: the model has no routed experts")
