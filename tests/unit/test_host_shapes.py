"""``bench/host_shapes.py``'s row-count schedules: one, ``FEW`` and ``CALLS`` distinct row counts
inside the buffer (the H200 result in bench/results/host_shapes/ is read as such)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import host_shapes  # noqa: E402


def test_schedules_have_their_distinct_counts():
    lo, hi = host_shapes.ROWS
    n = host_shapes.CALLS
    for kind, distinct in (("constant", 1), ("few", host_shapes.FEW), ("distinct", n)):
        rows = host_shapes._rows(kind, n, lo, hi)
        assert len(rows) == n
        assert len(set(rows)) == distinct
        assert lo <= min(rows) and max(rows) < hi
