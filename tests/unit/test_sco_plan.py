"""SCO selection (planner.plans.sco): the closed form equals the greedy walk in physical pinned bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InvalidPlan
from planner.plans.sco import (greedy_selection, num_offloaded, offloaded_indices, pinned_bytes_per_boundary,
                               pinned_host_bytes)

PAGE = 4096  # cudaHostRegister pins whole 4 KiB pages


def _walk(n_boundaries, size, budget):
    """Independent greedy walk: offload a boundary while its page-rounded size still fits."""
    pages = -(-size // PAGE) * PAGE
    left, n = budget, 0
    for _ in range(n_boundaries):
        if pages <= left:
            left, n = left - pages, n + 1
    return n


@settings(max_examples=300, deadline=None)
@given(N=st.integers(1, 300_000), H=st.integers(1, 8192), b=st.sampled_from([2, 4]),
       L_b=st.integers(1, 200), budget=st.integers(0, 2**40))
def test_closed_form_equals_greedy_walk(N, H, b, L_b, budget):
    size = N * H * b
    n = num_offloaded(N, H, b, L_b, budget)
    assert n == _walk(L_b, size, budget)
    assert offloaded_indices(L_b, size, budget) == tuple(range(1, n + 1))
    assert pinned_host_bytes(N, H, b, L_b, budget) == n * pinned_bytes_per_boundary(N, H, b) <= budget


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 50_000), min_size=1, max_size=30), budget=st.integers(0, 400_000))
def test_greedy_selection_takes_each_boundary_that_still_fits(sizes, budget):
    chosen = greedy_selection(sizes, budget)
    used = sum(-(-sizes[i - 1] // PAGE) * PAGE for i in chosen)
    assert used <= budget
    for i in set(range(1, len(sizes) + 1)) - set(chosen):  # a skipped one did not fit at its turn
        before = sum(-(-sizes[j - 1] // PAGE) * PAGE for j in chosen if j < i)
        assert before + -(-sizes[i - 1] // PAGE) * PAGE > budget


def test_vectorised_over_candidates():
    N = np.array([65536, 69632, 131072])
    budget = np.array([8 * 2**30, 16 * 2**30, 0])
    got = num_offloaded(N, 2880, 2, 48, budget)
    want = [_walk(48, int(n) * 2880 * 2, int(g)) for n, g in zip(N, budget)]
    assert got.tolist() == want


def test_page_rounding_not_power_of_two():
    """69,632 × 2,880 × 2 B = 401,080,320 B: 4 KiB pages, not the 512 MiB a power of two would take."""
    assert pinned_bytes_per_boundary(69632, 2880, 2) == 401_080_320
    assert num_offloaded(69632, 2880, 2, 48, 8 * 2**30) == 8 * 2**30 // 401_080_320 == 21
    assert num_offloaded(1, 1, 2, 5, 4095) == 0 and num_offloaded(1, 1, 2, 5, 4096) == 1


def test_bad_input():
    with pytest.raises(InvalidPlan, match="must be >= 0"):
        num_offloaded(1024, 64, 2, 4, -1)
    with pytest.raises(InvalidPlan, match="must be > 0"):
        num_offloaded(0, 64, 2, 4, 10)
