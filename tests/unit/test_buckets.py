"""Flat-slice bucket partition of OffloadStreamAdamW (planner.plans.buckets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InvalidPlan
from planner.plans.buckets import BUCKET_ALIGN, num_buckets, partition


@settings(max_examples=300, deadline=None)
@given(numels=st.lists(st.integers(0, 5000), max_size=20), beta=st.integers(16, 3000),
       align=st.sampled_from([1, 16]))
def test_partition_covers_every_element_once_in_order(numels, beta, align):
    beta = max(beta, align)
    plan = partition(numels, beta, align)
    flat = []
    for bk in plan.buckets:
        assert 0 < bk.length <= beta
        assert sum(s.length for s in bk.slices) == bk.length
        pos = 0
        for s in bk.slices:
            assert s.bucket_offset == pos and s.length > 0
            pos += s.length
            flat.extend((s.param, s.offset + i) for i in range(s.length))
            ends_param = s.offset + s.length == numels[s.param]
            assert s.offset % align == 0 and (ends_param or (s.offset + s.length) % align == 0)
    assert flat == [(p, i) for p, n in enumerate(numels) for i in range(n)]
    starts = [bk.start for bk in plan.buckets]
    assert starts == sorted(starts) and all(bk.index == i for i, bk in enumerate(plan.buckets))
    assert plan.total == sum(numels) and plan.max_bucket <= min(beta, max(plan.total, 0) or beta)
    # alignment costs at most align-1 elements per bucket
    assert plan.num_buckets <= -(-plan.total // (beta - align + 1)) if plan.total else plan.num_buckets == 0


def test_a_large_tensor_spans_buckets():
    plan = partition([10, 1000, 7], 160)
    assert plan.num_buckets == 7  # 10+144 | 5 × 160 | 56+7
    spans = [s for bk in plan.buckets for s in bk.slices if s.param == 1]
    assert len(spans) == 7 and all(s.offset % BUCKET_ALIGN == 0 for s in spans)
    assert plan.buckets[0].slices[0].length == 10 and plan.buckets[0].slices[1].length == 144
    assert plan.buckets[0].length == 154  # closes 6 short: the next cut would not be 16-aligned
    assert num_buckets(1017, 160) == 7


def test_unaligned_partition_fills_buckets_exactly():
    plan = partition([10, 1000, 7], 160, align=1)
    assert [bk.length for bk in plan.buckets] == [160] * 6 + [57]


def test_bad_bucket_size():
    with pytest.raises(InvalidPlan, match="bucket_params"):
        partition([100], 8)
