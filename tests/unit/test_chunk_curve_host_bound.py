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


FILL_S_PER_BYTE = 1e-9
"""The synthetic ``copy`` rate of the fill tests: 1 GB/s read+write."""


def _with_fill(h_lk, fills):
    cc = h_lk.curves.chunk_count.model_copy(update={"fill_bytes": fills})
    return Lookups(h_lk.cluster.model_copy(update={"curves": h_lk.curves.model_copy(update={"chunk_count": cc})}),
                   strict=True)


def test_an_emulated_curves_fills_are_taken_out_of_its_times(lk):
    """A curve measured on an emulated rank (``fill_bytes``) includes its filled all-to-alls; φ is the
    operator's ratio net of them, at the ``copy`` seconds the caller gives."""
    fills = [1e8, 2e8, 2e8, 4e8]                    # 0.1, 0.2, 0.2, 0.4 s at 1 GB/s
    lk2 = _with_fill(lk, fills)
    ks, phi = chunk_curve.ratios(lk2, _replay(99), lambda nb, shape: nb * FILL_S_PER_BYTE)
    assert list(ks) == [1.0, 2.0, 5.0, 10.0]
    assert np.allclose(phi, [(2.0 - 0.1) / 2.0, (2.2 - 0.2) / 2.0, (3.0 - 0.2) / 2.0, (5.0 - 0.4) / 2.0])
    with pytest.raises(ValueError, match="needs copy_s"):
        chunk_curve.ratios(_with_fill(lk, fills), _replay(99))


def test_fill_bytes_must_match_the_points():
    from planner.schema.curves import ChunkCurve

    ok = dict(load_cluster("h200").curves.chunk_count.model_dump(exclude={"fill_bytes"}), num_chunks=[1, 2],
              time_s=[1.0, 1.0])
    assert ChunkCurve(**ok, fill_bytes=[0.0, 3.0]).fill_bytes == [0.0, 3.0]
    for bad in ([1.0], [1.0, -1.0], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="fill_bytes"):
            ChunkCurve(**ok, fill_bytes=bad)
