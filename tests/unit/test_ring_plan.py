"""The Ring-DTP schedule (planner.plans.ring): coverage, ring consistency, shards, branch choice."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InvalidPlan
from planner.plans.ring import (max_shard_rows, moves_activations, ring_plan, shard_bounds,
                                split_bounds, strip_cols)

plans = st.builds(
    lambda P, extra, n, B, mode: ring_plan(P, P + extra, n, B, mode),
    st.integers(1, 9), st.integers(0, 300), st.integers(0, 400), st.integers(1, 12),
    st.sampled_from([None, "activations", "weights"]),
)


@settings(max_examples=150, deadline=None)
@given(plans)
def test_every_meeting_once_and_one_per_rank_per_step(plan):
    seen = set()
    for s in range(plan.P):
        batches, shards = set(), set()
        for r in range(plan.P):
            m = plan.meeting(r, s)
            assert (m.batch, m.shard) not in seen
            seen.add((m.batch, m.shard))
            batches.add(m.batch)
            shards.add(m.shard)
            # the stationary operand is the rank's own
            assert (m.shard if plan.move == "activations" else m.batch) == r
        assert batches == shards == set(range(plan.P))  # a permutation at every step
    assert seen == {(b, j) for b in range(plan.P) for j in range(plan.P)}


@settings(max_examples=100, deadline=None)
@given(plans)
def test_hops_deliver_what_the_next_step_needs_and_return_home(plan):
    P = plan.P
    for s in range(P - 1):
        for r in range(P):
            # what rank r sends after step s is what its right neighbour holds at step s+1
            assert plan.owner(plan.send_to(r), s + 1) == plan.owner(r, s)
            assert plan.recv_from(plan.send_to(r)) == r
    for r in range(P):
        # after the last step the accumulator of owner o sits at rank o-1: one hop brings it home
        holder = next(q for q in range(P) if plan.owner(q, P - 1) == r)
        assert plan.send_to(holder) == r
    assert plan.operand_hops == P - 1
    assert plan.accumulator_hops == (P if P > 1 else 0)
    assert sum(plan.operand_hop(s) for s in range(P)) == plan.operand_hops


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 64))
def test_shards_partition_the_vocabulary(V, P):
    if P > V:
        with pytest.raises(InvalidPlan, match=r"vocab_parallel \(\d+\) must be in \[1, V"):
            shard_bounds(V, P)
        return
    sh = shard_bounds(V, P)
    assert sh[0][0] == 0 and sh[-1][1] == V
    assert all(a[1] == b[0] for a, b in zip(sh, sh[1:]))
    rows = [b - a for a, b in sh]
    assert rows == [V // P + (1 if j < V % P else 0) for j in range(P)]
    assert max(rows) == max_shard_rows(V, P)


@settings(max_examples=150, deadline=None)
@given(plans)
def test_blocks_partition_each_shard_and_bound_the_strip(plan):
    for (a, b), blocks in zip(plan.shards, plan.blocks):
        assert len(blocks) == plan.vocab_blocks
        assert blocks[0][0] == a and blocks[-1][1] == b
        assert all(x[1] == y[0] for x, y in zip(blocks, blocks[1:]))
        assert all(hi >= lo for lo, hi in blocks)
    assert plan.strip_cols == strip_cols(plan.V, plan.P, plan.vocab_blocks)
    assert plan.v_max == max_shard_rows(plan.V, plan.P)


def test_split_bounds_first_parts_are_longer_and_empty_parts_allowed():
    assert split_bounds(10, 7, 3) == ((10, 13), (13, 15), (15, 17))
    assert split_bounds(0, 2, 4) == ((0, 1), (1, 2), (2, 2), (2, 2))


@pytest.mark.parametrize("V,P", [(200000, 8), (200000, 4), (1031, 3), (1031, 4), (37, 4)])
def test_branch_switches_at_ceil_v_over_p(V, P):
    edge = -(-V // P)
    assert ring_plan(P, V, edge).move == "activations"
    assert ring_plan(P, V, edge + 1).move == "weights"
    assert ring_plan(P, V, edge + 1, mode="activations").move == "activations"
    assert ring_plan(P, V, 0, mode="weights").move == "weights"
    got = moves_activations(np.array([edge - 1, edge, edge + 1]), V, P)
    assert got.tolist() == [True, True, False]


def test_reference_shapes_pick_the_paper_branches():
    assert ring_plan(8, 200000, 16384).move == "activations"   # N < V/P
    assert ring_plan(8, 200000, 32768).move == "weights"       # N > V/P
    assert ring_plan(4, 200000, 16384).move == "activations"


def test_hop_bytes_count_operand_state_and_gradient():
    H, b = 7168, 4
    act = ring_plan(8, 200000, 16384).hop_bytes(H, b)
    assert act == {"fwd_operand": 16384 * (H * b + 8), "fwd_state": 12 * 16384,
                   "bwd_operand": 16384 * (H * b + 8 + 12), "bwd_grad": 4 * 16384 * H}   # t; m, scale/z, scale
    w = ring_plan(8, 200000, 32768).hop_bytes(H, b)
    assert w == {"fwd_operand": 25000 * H * b, "fwd_state": 0, "bwd_operand": 25000 * H * b,
                 "bwd_grad": 4 * 25000 * H}


def test_moving_rows_are_n_max_or_the_shard():
    p = ring_plan(3, 1031, 5, mode="weights")
    assert [p.moving_rows(j) for j in range(3)] == [344, 344, 343]
    q = ring_plan(3, 1031, 5)
    assert [q.moving_rows(j) for j in range(3)] == [5, 5, 5]


@pytest.mark.parametrize("kw,match", [
    (dict(P=2, V=10, n_max=4, vocab_blocks=0), r"vocab_blocks \(0\) must be >= 1"),
    (dict(P=2, V=10, n_max=-1), r"tokens_per_rank \(-1\) must be >= 0"),
    (dict(P=2, V=10, n_max=4, mode="tokens"), r"mode \('tokens'\) must be one of"),
    (dict(P=11, V=10, n_max=4), r"vocab_parallel \(11\) must be in \[1, V \(10\)\]"),
])
def test_bad_plans_are_rejected_with_the_field_named(kw, match):
    with pytest.raises(InvalidPlan, match=match):
        ring_plan(**kw)
