"""The step-time model on this machine's CPU quick profile (``cpu_profile``: measured with torch,
``tests/calibration/conftest.py``): its gaps, the ops it can time, and the speed budget."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_profiles import SPEED_BUDGET_S, SPEED_CANDIDATES, ctx_of, speed_candidates, timed_step, tiny_model

from planner.errors import ProfileGap
from planner.timing.step import step_time


def test_cpu_profile_gaps_and_ops(cpu_profile):
    """The CPU quick profile has GEMM and CPU AdamW curves only: the step is a named gap (NaN, or
    raised with ``strict``), the fp32 dense head at its own tiny shapes is finite."""
    from planner.timing.ops import cpu_offload_adamw_time, dense_head_time

    m = tiny_model()
    stt = step_time(ctx_of(m, cpu_profile))
    assert np.isnan(stt.total_s) and any("attention_fwd" in g for g in stt.gaps)
    with pytest.raises(ProfileGap):
        step_time(ctx_of(m, cpu_profile), strict=True)
    fwd, fb = dense_head_time(256, 256, 512, "fp32", cpu_profile)
    assert 0 < fwd < fb < 1
    with pytest.raises(ProfileGap, match="d2h"):
        cpu_offload_adamw_time(10**8, 1, cpu_profile)


def test_speed_10k_candidates_on_the_cpu_profile(cpu_profile):
    ctx = speed_candidates(cpu_profile, SPEED_CANDIDATES)
    step_time(ctx)  # warm: imports, interpolators
    best = min(timed_step(ctx, SPEED_CANDIDATES) for _ in range(3))
    assert best < SPEED_BUDGET_S, f"{best:.3f} s for {SPEED_CANDIDATES} candidates"
