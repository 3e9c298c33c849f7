"""Dispatch terms against the fake-tensor trace at the reference shapes A and B (DESIGN §8).

Each case traces one operator (standard EP, LLEP, PipelinedLLEP) at full scale for one routing
profile, once per rank class of its plan (``DispatchPlan.rank_classes``), with the router, the
bf16 expert shard and its gradients, ``out.backward(torch.randn_like(out))`` (a dense N×H upstream gradient). The formula is the
``expected`` inventory of ``planner.budget.dispatch`` for the same rank, plus the registered
inputs. Checks: expected within ``FORMULA_VS_TRACE`` of the trace for every traced rank (so also
for the maximum), and the launch-time guarantee ≥ the trace (LLEP, PipelinedLLEP; standard EP's
``worst`` for routings whose tokens pick distinct experts). Cases run in parallel worker
processes; the full matrix runs in CI (``PLANNER_FAST_TRACES=1`` skips its slow half locally).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import pytest

FORMULA_VS_TRACE = 0.01
"""DESIGN §8: formula vs trace, relative to the trace."""
SHAPES = {"A": dict(N=65536, H=7168, I=2048, E=128, k=8, E_p=8, c=6554),
          "B": dict(N=32768, H=4096, I=4096, E=128, k=4, E_p=8, c=10923)}
"""Reference shapes of reference/paper-figures.md (K = 10 and K = 3)."""
PROFILES = ("balanced", "30/16", "80/16", "95/16", "50/4", "one_expert", "one_rank")
OPS = ("ep", "llep", "pipelined_llep", "pipelined_llep_source")
"""``pipelined_llep``: destination-residue variant; ``pipelined_llep_source``: source-side state."""
GUARANTEE_OVER_PEAK = 1.5
"""Issue 13: the source variant's guarantee within this factor of the largest traced peak over
every profile at shape A (the destination variant's is about 3x)."""
FAST_PIPELINED = {("B", p) for p in ("balanced", "30/16", "80/16", "95/16", "one_expert", "one_rank")} | {
    ("A", "balanced"), ("A", "one_rank")}
FAST_SOURCE = {("B", p) for p in PROFILES} | {("A", "balanced")}
"""The source variant's fast half (its shape-A traces cost ~2-4 s per rank class)."""
"""PipelinedLLEP traces cost ~3 s per rank class at shape A (K=10, 16-20 expert slots per chunk,
up to 8 classes); these form the fast half, the others the slow half (the full matrix: 44 cases,
~6 CPU-minutes)."""
DISTINCT_PICKS = ("balanced", "30/16", "80/16", "95/16", "one_rank")
"""Profiles whose tokens pick k distinct experts (standard EP's ``worst`` assumes it)."""
NESTED = [("B", "pipelined_llep", "balanced"), ("B", "pipelined_llep", "80/16"), ("B", "llep", "80/16"),
          ("B", "pipelined_llep_source", "80/16"), ("B", "pipelined_llep_source", "one_expert")]
"""Cases also traced inside a non-reentrant checkpoint (the composed stack's region)."""
SLOW_ENABLED = os.environ.get("PLANNER_FAST_TRACES", "") != "1"
"""The shape-A PipelinedLLEP traces (about 3 s per rank class) run in CI; PLANNER_FAST_TRACES=1 skips
them during local development."""


def trace_case(shape: str, op: str, profile: str, nested: bool = False) -> dict:
    """Trace every rank class; returns per-rank trace and formula peaks, and the bounds."""
    import torch

    from planner.budget import dispatch as bd
    from planner.budget import dispatch_inventory as inv
    from planner.runtime.dispatch_trace import DispatchShape, input_bytes, make_plan, trace_layer

    torch.set_num_threads(1)
    s = DispatchShape(**SHAPES[shape])
    plan = make_plan(op, s, profile)
    res = trace_layer(op, s, plan, profile, plan.rank_classes(), nested=nested)
    shp = inv.Shape(s.N, s.H, s.I, s.E, s.k, 2)
    formula = {}
    for d in res.per_rank:
        mom = bd.moments(op, shp, bd.rank_sizes(plan, d), s.n_local, standalone=True)
        ms = mom["forward"] + mom["backward"] + (mom["forward_nosave"] if nested else [])
        formula[d] = input_bytes(s) + bd.peak(ms)[0]
    g = dict(N=s.N, k=s.k, E=s.E, E_p=s.E_p, c=s.c, K_max=s.K_max, alpha=s.alpha, lam=s.lam, m=s.m,
             n_imp=s.n_imp)
    gm = bd.guarantee_moments(op, shp, g, standalone=True)
    wm = bd.worst_ep_moments(shp, s.E_p, standalone=True)
    return {"trace": dict(res.per_rank), "formula": formula,
            "guarantee": input_bytes(s) + bd.peak(gm["forward"] + gm["backward"])[0],
            "worst": input_bytes(s) + bd.peak(wm["forward"] + wm["backward"])[0],
            "unplaced": plan.assignment.unplaced}


def _is_fast(case) -> bool:
    shape, op, profile, nested = case
    if nested:
        return case in (("B", "pipelined_llep", "balanced", True), ("B", "pipelined_llep_source", "80/16", True))
    if op == "pipelined_llep_source":
        return (shape, profile) in FAST_SOURCE
    return op != "pipelined_llep" or (shape, profile) in FAST_PIPELINED


def _cases(slow: bool):
    out = [(s, o, p, False) for s in SHAPES for o in OPS for p in PROFILES]
    out += [(s, o, p, True) for s, o, p in NESTED]
    return [c for c in out if _is_fast(c) != slow]


_RESULTS: dict = {}


def _run(cases) -> None:
    todo = [c for c in cases if c not in _RESULTS]
    if not todo:
        return
    import multiprocessing as mp

    workers = max(1, min(len(todo), os.cpu_count() or 1))
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        for case, res in zip(todo, ex.map(trace_case, *zip(*todo))):
            _RESULTS[case] = res


def _check(case) -> None:
    r = _RESULTS[case]
    for d, tp in r["trace"].items():
        err = abs(r["formula"][d] - tp) / tp
        assert err <= FORMULA_VS_TRACE, f"{case} rank {d}: {r['formula'][d]} vs trace {tp} ({err:.2%})"
    peak = max(r["trace"].values())
    assert abs(max(r["formula"].values()) - peak) <= FORMULA_VS_TRACE * peak
    shape, op, profile, _ = case
    if op != "ep":
        assert r["unplaced"] == 0
        assert r["guarantee"] >= peak, f"{case}: guarantee {r['guarantee']} < trace {peak}"
    elif profile in DISTINCT_PICKS:
        assert r["worst"] >= peak, f"{case}: worst {r['worst']} < trace {peak}"


@pytest.fixture(scope="module")
def fast_results():
    _run(_cases(slow=False))
    return _RESULTS


@pytest.mark.parametrize("case", _cases(slow=False), ids=lambda c: "-".join(map(str, c)))
def test_dispatch_formula_matches_trace(fast_results, case):
    _check(case)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW_ENABLED, reason="PLANNER_FAST_TRACES=1 skips the slow half of the matrix")
@pytest.mark.parametrize("case", _cases(slow=True), ids=lambda c: "-".join(map(str, c)))
def test_dispatch_formula_matches_trace_slow(case):
    _run(_cases(slow=True))
    _check(case)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW_ENABLED, reason="PLANNER_FAST_TRACES=1 skips the slow half of the matrix")
@pytest.mark.parametrize("shape", ["A", "B"])
def test_source_guarantee_within_target_of_largest_peak(shape):
    cases = [(shape, "pipelined_llep_source", p, False) for p in PROFILES]
    _run(cases)
    peak = max(max(_RESULTS[c]["trace"].values()) for c in cases)
    g = _RESULTS[cases[0]]["guarantee"]
    assert peak <= g <= GUARANTEE_OVER_PEAK * peak, (shape, g / 2**30, peak / 2**30, g / peak)
