"""The dispatch guarantee holds for every routing, import-limited LLEP plans included (DESIGN §3.2).

``planner.plans.llep.residue_bound_routes`` bounds the routes one rank computes in a layer; with
``max_imports`` it also covers plans that leave excess unplaced because the import slots ran out.
These properties draw routings a top-k router can produce (each token picks ``k`` distinct
experts), skewed hard enough that small ``n_import_max`` leaves routes unplaced, and check:

- the bound is at least every rank's load under the LLEP plan;
- the budget's guarantee moments are at least the plan-evaluated ones, phase by phase;
- the bound never falls as ``α`` grows, and never rises as ``n_import_max`` grows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routing_draws import cases, draw_import_limited

from planner.budget import dispatch as bd
from planner.budget import dispatch_inventory as inv
from planner.plans import dispatch, llep, routing

PROPERTY_EXAMPLES = 150
"""Hypothesis examples per property (each plans a layer of at most 8 ranks × 300 tokens)."""
SWEEP_CASES = 300
"""Seeded random routings in the import-limited sweep."""
MIN_UNPLACED_SHARE = 0.10
"""The sweep must really exercise the import-limited branch: at least this share leaves routes
unplaced (otherwise it would test only what the old bound already covered)."""


def _bound(counts, n_max, k, knobs) -> int:
    W, E = counts.shape
    return llep.residue_bound_routes(k, n_max, E, W, knobs["alpha"], knobs["lam"], knobs["min_tokens"],
                                     knobs["max_imports"])


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_bound_covers_every_rank_load(case):
    counts, n_max, k, knobs = case
    a = llep.assign(counts.sum(0), counts.shape[0], **knobs)
    assert int(a.load.max()) <= _bound(counts, n_max, k, knobs), (a.load.tolist(), a.unplaced)


def _expected_peaks(counts, op, shape, knobs, c, K_max, reg) -> dict:
    """Like ``budget.dispatch.expected`` for an arbitrary route-count matrix: binding moment per
    phase kind, maximised over ranks."""
    W, E = counts.shape
    plan = dispatch.plan_layer(counts, top_k=shape.k, operator=op, token_budget=c, max_chunks=K_max,
                               alpha=knobs["alpha"], min_tokens=knobs["min_tokens"], lam=knobs["lam"],
                               max_imports=knobs["max_imports"])
    out: dict = {}
    for d in range(W):
        ph = bd.phase_moments(bd.moments(op, shape, bd.rank_sizes(plan, d), E // W,
                                         standalone=reg == "standalone"), reg)
        for kind, ms in ph.items():
            out[kind] = max(out.get(kind, 0), bd.peak(ms)[0])
    return out, plan.assignment.unplaced


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["pipelined_llep", "llep"]),
       st.sampled_from(["standalone", "checkpointed", "saved"]), st.integers(1, 400), st.integers(1, 10))
def test_guarantee_is_at_least_expected_for_every_routing(case, op, reg, c, K_max):
    counts, n_max, k, knobs = case
    W, E = counts.shape
    shape = inv.Shape(n_max, 64, 32, E, k, 2)
    ex, _ = _expected_peaks(counts, op, shape, knobs, c, K_max, reg)
    g = dict(N=n_max, k=k, E=E, E_p=W, c=c, K_max=K_max, alpha=knobs["alpha"], lam=knobs["lam"],
             m=knobs["min_tokens"], n_imp=knobs["max_imports"])
    gm = bd.phase_moments(bd.guarantee_moments(op, shape, g, standalone=reg == "standalone"), reg)
    for kind, pk in ex.items():
        assert bd.peak(gm[kind])[0] >= pk, kind


def test_import_limited_sweep_leaves_routes_unplaced_and_stays_bounded():
    rng = np.random.default_rng(20261129)
    unplaced = 0
    for _ in range(SWEEP_CASES):
        E_p, n, k, counts, n_max, knobs = draw_import_limited(rng)
        a = llep.assign(counts.sum(0), E_p, **knobs)
        unplaced += a.unplaced > 0
        assert int(a.load.max()) <= _bound(counts, n_max, k, knobs)
    assert unplaced >= MIN_UNPLACED_SHARE * SWEEP_CASES, unplaced


@pytest.mark.parametrize("profile", ["one_rank", "80/8", "95/16"])
def test_named_profiles_with_few_import_slots(profile):
    # qwen3-30b-a3b's routing shape (E = 128, k = 8) on E_p = 2: rank 0's 64 experts cannot all spill
    # through 4 import slots, the case that broke the old bound
    E, k, E_p, N, m = 128, 8, 2, 32768, 1024
    counts = routing.profile_counts(profile, N, E, k, E_p)
    knobs = dict(alpha=1.0, min_tokens=m, lam=1.3, max_imports=4)
    a = llep.assign(counts.sum(0), E_p, **knobs)
    assert int(a.load.max()) <= _bound(counts, N, k, knobs)
    if profile == "one_rank":
        assert a.unplaced > 0
        old = int(np.ceil(1.3 * k * N)) + (E // E_p) * (m - 1)     # DESIGN §3.2's bound, unplaced == 0 only
        assert int(a.load.max()) > old


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 64]), st.integers(1, 16), st.integers(1, 8), st.integers(1, 1 << 20),
       st.integers(1, 2048), st.integers(0, 8),
       st.lists(st.sampled_from([1.0, 1.05, 1.3, 2.0, 7.9, 8.0, 64.0, 1e300, float("inf")]), min_size=2, max_size=2))
def test_bound_is_monotone_in_alpha_and_imports(E_p, n, k, N, m, n_imp, alphas):
    E = E_p * n
    k = min(k, E)
    lo, hi = sorted(alphas)
    b = lambda a, imp: llep.residue_bound_routes(k, N, E, E_p, a, 1.3, m, imp)  # noqa: E731
    assert b(lo, n_imp) <= b(hi, n_imp) <= E_p * k * N
    assert b(lo, n_imp + 1) <= b(lo, n_imp)
    assert b(lo, None) <= b(lo, n_imp)
