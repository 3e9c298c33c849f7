"""The O(E·k) route counts equal ``bincount`` of the explicit ``[N, k]`` expert ids (DESIGN §3.2)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.plans.routing import expert_ids, rank_counts

EXAMPLES = 400


@st.composite
def cases(draw):
    E = draw(st.integers(1, 64))
    Ep = draw(st.sampled_from([d for d in (1, 2, 4, 8) if E % d == 0] or [1]))
    k = draw(st.integers(1, min(E, 9)))
    kind = draw(st.sampled_from(["balanced", "one_expert", "one_rank", "skew"]))
    prof = kind if kind != "skew" else f"{draw(st.integers(0, 100))}/{draw(st.integers(1, E))}"
    return prof, draw(st.integers(0, 5000)), E, k, Ep


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_rank_counts_equal_explicit_ids(case):
    prof, N, E, k, Ep = case
    explicit = np.bincount(expert_ids(prof, N, E, k, Ep).reshape(-1), minlength=E)[:E]
    assert rank_counts(prof, N, E, k, Ep).tolist() == explicit.tolist()
