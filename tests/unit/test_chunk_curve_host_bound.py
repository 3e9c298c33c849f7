"""``planner.timing.chunk_curve``: a chunk-count curve point whose replay is host-bound
(``HOST_BOUND_SHARE``) is left out of φ(K), and φ there is the nearest kept point's."""

from __future__ import annotations

import numpy as np
import pytest

from planner.schema.io import load_cluster
from planner.timing import chunk_curve
from planner.timing.lookups import Lookups

TIMES = {1: 2.0, 2: 2.2, 5: 3.0, 10: 5.0}
"""Measured seconds of a synthetic curve (operator replay 2.0 s at every K, router/loss 0)."""


@pytest.fixture()
def lk():
    h = load_cluster("h200")
    cc = h.curves.chunk_count.model_copy(update={"num_chunks": list(TIMES), "time_s": list(TIMES.values())})
    return Lookups(h.model_copy(update={"curves": h.curves.model_copy(update={"chunk_count": cc})}), strict=True)


def _replay(host_from_K: int):
    def replay(K, shape):
        return 2.0, 0.0, (0.5 if K >= host_from_K else 0.0)
    return replay


def test_host_bound_points_are_left_out(lk):
    ks, phi = chunk_curve.ratios(lk, _replay(5))
    assert list(ks) == [1.0, 2.0]
    assert np.allclose(phi, [1.0, 1.1])
    assert any("K = [5, 10] left out" in a for a in lk.assumed)
    # beyond the last kept point: its ratio, not the host-bound points' 1.5 and 2.5
    assert chunk_curve.factor(lk, np.array([2, 5, 10]), _replay(5)) == pytest.approx([1.1, 1.1, 1.1])


def test_a_share_at_the_threshold_is_kept(lk):
    def replay(K, shape):
        return 2.0, 0.0, chunk_curve.HOST_BOUND_SHARE * 2.0
    ks, phi = chunk_curve.ratios(lk, replay)
    assert list(ks) == [1.0, 2.0, 5.0, 10.0]
    assert np.allclose(phi, [1.0, 1.1, 1.5, 2.5])


def test_no_gpu_bound_point_means_no_curve(lk):
    assert chunk_curve.ratios(lk, _replay(1)) is None
    assert chunk_curve.factor(lk, 4, _replay(1)) == 1.0
