"""Checks of the lookups the time-model tests rely on, on their cluster profiles:

- ``flat`` (``tests/unit/conftest.py``; built by ``tests/synthetic_profiles.py``): every curve
  exactly proportional, so the time model's FLOP and byte counts read back from its times;
- ``h200``: the shipped profile (``tests/conftest.py``).

The real CPU quick profile (``cpu_profile``) needs torch: ``tests/calibration/conftest.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_profiles import ATTN_RATE, BIDIR_BW, COLL_BW, EXACT, GEMM_RATE

from planner.errors import ProfileGap
from planner.timing.comm import collective_s, host_copy_s
from planner.timing.compute import Lookups, attention_s, elementwise_s, gemm_s, points_s



# ------------------------------------------------------------------------------------------------
# the lookups on the flat profile
# ------------------------------------------------------------------------------------------------
def test_flat_lookups_are_proportional(flat):
    lk = Lookups(flat)
    m = np.array([100, 5000, 1 << 20])
    assert np.allclose(gemm_s(lk, m, 300, 700), 2 * m * 300 * 700 / GEMM_RATE, rtol=EXACT)
    assert np.allclose(gemm_s(lk, m, 300, 700, dtype="fp32"), 2 * m * 300 * 700 / (GEMM_RATE / 8), rtol=EXACT)
    S = np.array([1000.0, 1e6])
    assert np.allclose(attention_s(lk, S, 4, 64, 64), 2 * S**2 * 4 * 64 / ATTN_RATE, rtol=EXACT)
    assert np.allclose(attention_s(lk, S, 4, 192, 128), S**2 * 4 * 320 / ATTN_RATE, rtol=EXACT)
    assert np.allclose(attention_s(lk, S, 4, 64, 64, backward=True), 5 * S**2 * 4 * 64 / ATTN_RATE, rtol=EXACT)
    assert elementwise_s(lk, 2.8e12) == pytest.approx(1.0, rel=EXACT)
    x = np.array([1e3, 1e9])
    assert np.allclose(host_copy_s(lk, "bidir", x), x / BIDIR_BW, rtol=1e-6)
    assert np.allclose(collective_s(lk, "all_to_all", 8, x), x / COLL_BW["all_to_all"], rtol=1e-6)
    assert collective_s(lk, "all_to_all", 1, 1e9) == 0.0
    assert not lk.gaps


def test_window_band_share(flat):
    """A window of w keeps 2w/S − (w/S)² of the causal work (w = S keeps all of it)."""
    lk = Lookups(flat)
    full = attention_s(lk, 4096, 2, 64, 64)
    assert attention_s(lk, 4096, 2, 64, 64, window=4096) == pytest.approx(full, rel=EXACT)
    assert attention_s(lk, 4096, 2, 64, 64, window=128) == pytest.approx(full * (2 / 32 - 1 / 1024), rel=EXACT)


def test_gemm_block_rule_beyond_grid_and_floor_below(h200):
    """Beyond the grid: blocks of the largest measured size (rate saturated: time ∝ m there);
    below it: timed at the smallest measured size (upper bound). Both are listed as assumed."""
    lk = Lookups(h200)
    mx = h200.curves.gemm.axes[0][-1]
    t1 = gemm_s(lk, mx, 4096, 4096)
    assert not lk.assumed
    t4 = gemm_s(lk, 4 * mx, 4096, 4096)
    assert t4 == pytest.approx(4 * t1, rel=EXACT)
    assert any("beyond the measured grid" in a for a in lk.assumed)
    lo = h200.curves.gemm.axes[1][0]
    assert gemm_s(lk, 4096, lo // 8, 4096) == pytest.approx(gemm_s(lk, 4096, lo, 4096), rel=EXACT)
    assert any("below the smallest measured" in a for a in lk.assumed)


def test_measured_points_are_interpolated_not_fitted(h200):
    """Copies read the measured medians (the fit is 10% fast at 4 GiB on the bidirectional curve)."""
    c = h200.curves.bidir
    lk = Lookups(h200)
    got = points_s(lk, "bidir", c.size_bytes, c.time_s, np.array(c.size_bytes, dtype=float))
    assert np.allclose(got, np.maximum.accumulate(c.time_s), rtol=1e-12)
    mid = np.sqrt(c.size_bytes[-2] * c.size_bytes[-1])
    assert c.time_s[-2] < points_s(lk, "bidir", c.size_bytes, c.time_s, mid) < c.time_s[-1]
    assert not any("bidir" in a for a in lk.assumed)
    points_s(lk, "bidir", c.size_bytes, c.time_s, 2.0 * c.size_bytes[-1])
    assert any(a.startswith("bidir: sizes above") for a in lk.assumed)


def test_below_measured_size_is_a_gap(h200):
    lk = Lookups(h200)
    c = h200.curves.h2d
    small = c.size_bytes[0] / 2
    t = host_copy_s(lk, "h2d", np.array([small, 1e9]))
    assert np.isnan(t[0]) and np.isfinite(t[1]) and "h2d" in lk.gaps[0]
    with pytest.raises(ProfileGap, match="h2d"):
        host_copy_s(Lookups(h200, strict=True), "h2d", small)


def test_shipped_cluster_for_names_the_profile_of_a_gpu():
    from planner.schema.profiles import load_cluster, shipped, shipped_cluster_for

    for name in ("h100", "h200"):
        assert shipped_cluster_for(load_cluster(name).topology.gpu_name) == name
    assert shipped_cluster_for("no such GPU") is None
    assert {load_cluster(n).topology.gpu_name for n in shipped("clusters")} >= {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
