"""The step-time model end to end (``planner.timing.step``): on the shipped H200 profile and the
flat synthetic profile (the CPU quick profile, which needs torch: ``tests/calibration/test_cpu_profile_step.py``).

- the breakdown sums to the total, every component ≥ 0;
- vectorised evaluation equals one-by-one evaluation;
- more tokens never take less time (hypothesis on the flat profile, powers of two on the H200);
- ``ProfileGap``: NaN for exactly the candidates outside a curve (with the message), or raised;
- what is assumed is listed (missing collective curves, 8-GPU host DRAM contention);
- speed: ``SPEED_BUDGET_S`` for 10k candidates.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_profiles import (SPEED_BUDGET_S, SPEED_CANDIDATES, ctx_of, flat_cluster, speed_candidates, timed_step,
                                tiny_model)

from planner.budget.build import make_context
from planner.errors import ProfileGap
from planner.schema import Workload
from planner.schema.io import load_model
from planner.search.evaluate import group_plan
from planner.search.space import baseline_groups, composed_groups
from planner.timing.step import StepTime, step_time

SUM_TOL = 1e-9
"""The breakdown sums to the total up to rounding."""
BF16_PEAK_TFLOPS = 989.0
"""H200 dense bf16 peak: no prediction may claim more useful TFLOP/s per GPU."""

EXAMPLES = [("gpt-oss-20b", 8, 131072), ("moe-667b", 64, 1 << 20)]


def _check(stt: StepTime) -> None:
    total = sum(stt.breakdown.values())
    assert np.allclose(total, stt.total_s, rtol=SUM_TOL, equal_nan=True)
    for name, v in stt.breakdown.items():
        assert np.all(np.isnan(v) | (v >= 0)), name


@pytest.mark.parametrize("name,W,S", EXAMPLES)
@pytest.mark.parametrize("stack", ["composed", "fsdp2"])
def test_reference_configurations_on_h200(h200, name, W, S, stack):
    m = load_model(name)
    ctx = ctx_of(m, h200, W=W, S=S, stack=stack)
    stt = step_time(ctx, strict=True)
    _check(stt)
    assert np.isfinite(stt.total_s) and stt.total_s > 0 and not stt.gaps
    assert stt.total_s == pytest.approx(stt.micro_step_s + stt.optimizer_s, rel=SUM_TOL)
    assert 0 < stt.tflops_per_gpu < BF16_PEAK_TFLOPS
    distinct = int(ctx.tokens_per_rank) // (int(ctx.tp) if stack == "fsdp2" else 1)
    assert stt.tokens_per_step == distinct
    # the profile has no collective curve at these group sizes: the assumed link rule is named
    assert any(a.startswith("collectives.") and "assumed" in a for a in stt.assumed)
    if stack == "composed":  # stream_offload on an 8-GPU node: host contention stays assumed
        assert any("host DRAM shared evenly" in a for a in stt.assumed)


def test_vectorised_equals_one_by_one(h200):
    m = load_model("gpt-oss-20b")
    wl = Workload(seq_len=65536)
    rng = np.random.default_rng(0)
    groups = [g for g in composed_groups(m, wl, 8) if g.choices["checkpoint"] == "sco"][:6]
    groups += baseline_groups(m, wl, 8)[:3]
    for g in groups:
        idx = rng.choice(g.size, size=min(g.size, 6), replace=False)
        num = {k: v[idx] for k, v in g.numeric.items()}
        plan = group_plan(g, 8, "80/16", "guarantee", "bf16")
        many = step_time(make_context(m, h200, wl, plan, resolved=True, overrides=num))
        for i in range(len(idx)):
            one = step_time(make_context(m, h200, wl, plan, resolved=True,
                                         overrides={k: int(v[i]) for k, v in num.items()}))
            assert one.total_s == pytest.approx(many.total_s[i], rel=1e-12, nan_ok=True), g.choices
            for k, v in one.breakdown.items():
                assert v == pytest.approx(many.breakdown[k][i], rel=1e-12, abs=1e-15, nan_ok=True), (g.choices, k)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.sampled_from(["ep", "llep", "pipelined_llep"]),
       st.sampled_from(["composed", "fsdp2"]))
def test_more_tokens_never_take_less_time_flat(flat, a, b, dispatch, stack):
    m = tiny_model()
    s1, s2 = sorted((a * 1024, b * 1024))
    kw = dict(dispatch=dispatch) if stack == "composed" else {}
    t = [float(step_time(ctx_of(m, flat, S=s, stack=stack, **kw), strict=True).total_s) for s in (s1, s2)]
    assert t[0] <= t[1] * (1 + SUM_TOL)


@pytest.mark.parametrize("stack", ["composed", "fsdp2"])
def test_more_tokens_never_take_less_time_h200(h200, stack):
    m = load_model("gpt-oss-20b")
    S = np.array([8192 << i for i in range(8)])
    t = [float(step_time(ctx_of(m, h200, S=int(s), stack=stack), strict=True).total_s) for s in S]
    assert all(x < y for x, y in zip(t, t[1:]))


def test_gaps_make_only_the_affected_candidates_nan():
    """All-to-all curves measured from 1 GiB only: the candidates that issue smaller all-to-alls
    (Ulysses over D > 1, dispatch over E_p > 1) are NaN with the message; the one with D = E_p = 1
    issues none and stays finite. ``strict`` raises the same gap."""
    cl = flat_cluster(a2a_min_bytes=1 << 30)
    m = tiny_model()
    ctx = ctx_of(m, cl, S=65536, overrides={"seq_parallel": np.array([1, 4, 1]),
                                              "expert_parallel": np.array([1, 1, 8])})
    stt = step_time(ctx)
    _check(stt)
    assert np.isfinite(stt.total_s[0]) and np.isnan(stt.total_s[1:]).all()
    assert stt.gaps and all("collectives.all_to_all" in g and "measured range" in g for g in stt.gaps)
    with pytest.raises(ProfileGap, match="collectives.all_to_all"):
        step_time(ctx, strict=True)





@pytest.mark.parametrize("ac", ["none", "selective", "full"])
def test_fsdp2_recompute_order(flat, ac):
    m = tiny_model()
    t = {a: step_time(ctx_of(m, flat, stack="fsdp2", ac=a), strict=True) for a in ("none", "selective", "full")}
    assert t["none"].total_s <= t["selective"].total_s <= t["full"].total_s
    _check(t[ac])


def test_speed_10k_candidates(h200):
    ctx = speed_candidates(h200, SPEED_CANDIDATES)
    step_time(ctx)  # warm: imports, interpolators
    best = min(timed_step(ctx, SPEED_CANDIDATES) for _ in range(3))
    assert best < SPEED_BUDGET_S, f"{best:.3f} s for {SPEED_CANDIDATES} candidates"
