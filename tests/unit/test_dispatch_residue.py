"""PipelinedLLEP's two residue variants: the per-chunk receive bound, the source variant's chunk
count, its routing-independent guarantee, and its time (DESIGN §3.2, §4; issue 13).

The routings are the import-limited top-k routings of ``routing_draws`` (each token
picks ``k`` distinct experts, skewed hard enough that small ``n_import_max`` leaves excess
unplaced). Properties:

- strided chunks put at most ``ceil(L/K) + E_p·S`` rows on one destination per chunk, ``L`` its
  layer load (``plans.dispatch.chunk_recv_bound``), for both variants;
- the source variant raises ``K`` exactly when a rank computes more than ``L_0`` routes, and then
  every chunk still receives at most ``ceil(L_0/K) + E_p·(n + n_import_max)`` rows;
- its guarantee moments are at least the plan-evaluated ones for every routing, phase by phase.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from routing_draws import cases, draw_import_limited

from planner.budget import dispatch as bd
from planner.budget import dispatch_inventory as inv
from planner.plans import chunking, dispatch, llep

PROPERTY_EXAMPLES = 150
"""Hypothesis examples per property (layers of at most 8 ranks × 300 tokens)."""
SWEEP_CASES = 200
"""Seeded import-limited routings in the chunk-count sweep."""
MIN_RAISED_SHARE = 0.05
"""The sweep must exercise the raised-``K`` branch in at least this share of its cases."""


def _plan(counts, k, knobs, c, K_max, residue):
    return dispatch.plan_layer(counts, top_k=k, operator="pipelined_llep", token_budget=c,
                               max_chunks=K_max, residue=residue, **knobs)


def _l0(counts, n_max, k, knobs):
    W, E = counts.shape
    return dispatch.balanced_load_bound(k, n_max, E, W, knobs["alpha"], knobs["lam"], knobs["min_tokens"])


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(1, 400), st.integers(1, 10))
def test_chunk_receive_bound_for_every_routing(case, c, K_max):
    counts, n_max, k, knobs = case
    W, E = counts.shape
    n = E // W
    K = chunking.num_chunks(n_max, c, K_max)
    c_eff = chunking.chunk_tokens(n_max, K)
    resid = llep.residue_bound_routes(k, n_max, E, W, knobs["alpha"], knobs["lam"], knobs["min_tokens"],
                                      knobs["max_imports"])
    for residue, load in (("destination", resid), ("source", _l0(counts, n_max, k, knobs))):
        plan = _plan(counts, k, knobs, c, K_max, residue)
        q = int(plan.send_KWW.sum(1).max())                   # rows one rank receives in one chunk
        bound = min(W * k * c_eff, int(dispatch.chunk_recv_bound(load, K, W, n + knobs["max_imports"])))
        assert q <= bound, (residue, q, bound, plan.num_chunks, K)
        assert int(plan.send_KWW.sum(2).max()) <= k * c_eff   # sends per chunk


def test_source_raises_chunks_only_where_llep_leaves_a_rank_above_l0():
    rng = np.random.default_rng(20261201)
    raised = 0
    for _ in range(SWEEP_CASES):
        E_p, n, k, counts, n_max, knobs = draw_import_limited(rng)
        c = int(rng.integers(4, 200))
        K = chunking.num_chunks(n_max, c, 10)
        src = _plan(counts, k, knobs, c, 10, "source")
        dst = _plan(counts, k, knobs, c, 10, "destination")
        l0 = _l0(counts, n_max, k, knobs)
        above = int(src.assignment.load.max()) > l0
        assert (src.num_chunks > K) == above, (src.num_chunks, K, src.assignment.load.max(), l0)
        assert dst.num_chunks == K
        assert not above or src.assignment.unplaced > 0       # L_0 holds whenever all excess is placed
        raised += above
        assert int(src.send_KWW.sum(1).max()) <= int(dispatch.chunk_recv_bound(l0, K, E_p, n + knobs["max_imports"]))
    assert raised >= MIN_RAISED_SHARE * SWEEP_CASES, raised


def _expected(counts, shape, knobs, c, K_max, reg) -> dict:
    W, E = counts.shape
    plan = _plan(counts, shape.k, knobs, c, K_max, "source")
    out: dict = {}
    for d in range(W):
        ph = bd.phase_moments(bd.moments(bd.SOURCE_OP, shape, bd.rank_sizes(plan, d), E // W,
                                         standalone=reg == "standalone"), reg)
        for kind, ms in ph.items():
            out[kind] = max(out.get(kind, 0), bd.peak(ms)[0])
    return out


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["standalone", "checkpointed", "saved"]), st.integers(1, 400),
       st.integers(1, 10))
def test_source_guarantee_is_at_least_expected_for_every_routing(case, reg, c, K_max):
    counts, n_max, k, knobs = case
    W, E = counts.shape
    shape = inv.Shape(n_max, 64, 32, E, k, 2)
    ex = _expected(counts, shape, knobs, c, K_max, reg)
    g = dict(N=n_max, k=k, E=E, E_p=W, c=c, K_max=K_max, alpha=knobs["alpha"], lam=knobs["lam"],
             m=knobs["min_tokens"], n_imp=knobs["max_imports"])
    gm = bd.phase_moments(bd.guarantee_moments(bd.SOURCE_OP, shape, g, standalone=reg == "standalone"), reg)
    for kind, pk in ex.items():
        assert bd.peak(gm[kind])[0] >= pk, kind


def test_source_guarantee_below_destination_guarantee_at_shape_a():
    shape = inv.Shape(65536, 7168, 2048, 128, 8, 2)
    g = dict(N=65536, k=8, E=128, E_p=8, c=6554, K_max=10, alpha=1.0, lam=1.3, m=1024, n_imp=4)
    mom = {op: bd.guarantee_moments(op, shape, g, standalone=True) for op in (bd.SOURCE_OP, "pipelined_llep")}
    peak = {op: bd.peak(m["forward"] + m["backward"])[0] for op, m in mom.items()}
    # the residue (Σ Q·H, with the unplaced-route term) is gone: more than 3x smaller at shape A
    assert 3 * peak[bd.SOURCE_OP] < peak["pipelined_llep"], peak


def test_source_time_adds_one_dispatch_per_chunk():
    from planner.timing.dispatch import moe_dispatch_s
    from planner.timing.lookups import Lookups
    from synthetic_profiles import flat_cluster

    lk = Lookups(flat_cluster(), strict=True)
    kw = dict(N=65536, E=128, k=8, E_p=8, K=10, H=7168, I=2048, b=2)
    t = {r: moe_dispatch_s(lk, "pipelined_llep", residue=r, **kw) for r in ("source", "destination")}
    assert t["source"]["fwd"] == t["destination"]["fwd"]
    from planner.timing.comm import collective_s

    d = collective_s(lk, "all_to_all", 8, 8 * 65536 / 10 * (7168 * 2 + 4))   # one chunk's dispatch
    extra = t["source"]["comm_bwd"] - t["destination"]["comm_bwd"]
    assert abs(extra - 10 * d) <= 1e-9 * extra, (extra, d)
    # the compute differs only by the re-gather (added) and the per-chunk N-sized fills (removed)
    assert t["source"]["bwd"] > t["destination"]["bwd"]
    # E_p = 1: no traffic for either variant
    one = moe_dispatch_s(lk, "pipelined_llep", residue="source", **{**kw, "E_p": 1})
    assert one["comm_bwd"] == 0
