"""Cluster profiles for the time-model tests, and checks of the lookups they rely on.

- ``flat_cluster``: a synthetic profile whose every curve is exactly proportional (one GEMM rate,
  one attention rate, pure-bandwidth copies and collectives at every group size), so that the
  time model's FLOP and byte counts can be read back from its times in closed form.
- ``cpu_profile``: the real CPU quick profile (``python -m calibration --quick``), measured once per
  session on this machine.
- ``h200``: the shipped profile (``tests/conftest.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.budget.build import make_context
from planner.errors import ProfileGap
from planner.schema import ClusterSpec, ModelSpec, Plan, Workload
from planner.schema.io import load_cluster
from planner.timing import curves as C
from planner.timing.comm import collective_s, host_copy_s
from planner.timing.compute import Lookups, attention_s, elementwise_s, gemm_s, points_s

GEMM_RATE = 400e12
"""FLOP/s of every GEMM in the flat profile."""
ATTN_RATE = 300e12
"""FLOP/s of causal attention (forward and backward conventions) in the flat profile."""
ADAMW_RATE = 1e11
"""Parameters/s of the fused GPU AdamW (so elementwise passes stream at 28 × 1e11 B/s)."""
H2D_BW, D2H_BW, BIDIR_BW = 50e9, 50e9, 40e9
"""Pinned copy bandwidths, bytes/s (bidirectional: each way)."""
COLL_BW = {"all_to_all": 100e9, "all_gather": 150e9, "reduce_scatter": 150e9, "p2p_ring": 200e9}
"""Collective bandwidths, bytes/s of ``size`` (the ``CollectiveCurves`` conventions)."""
CPU_S_PER_PARAM_1T = 4e-9
"""Fused CPU AdamW seconds per parameter at one thread (the flat profile measures it as
1/threads at 1, 2, 4, …, 256 threads)."""
EXACT = 1e-9
"""Relative tolerance of closed-form checks on the flat profile (floating-point rounding only)."""

PROV = {"device": "SYN GPU", "torch": "x", "cuda": "x", "nccl": "x", "date": "2026-11-29",
        "command": "synthetic", "gpus_on_machine": 8}
SIZES = [1, 1 << 50]


def _table(names, rate):
    axes = [[1, 1 << 40]] * len(names)
    grid = rate
    for _ in names:
        grid = [grid, grid]
    return {"axis_names": list(names), "axes": axes, "flops_per_s": grid, "status": "assumed"}


def _bw(bw, g=1):
    return C.bandwidth_curve(SIZES, [s / bw for s in SIZES], provenance=PROV, group_size=g).model_dump()


def flat_curves(*, h2d=H2D_BW, d2h=D2H_BW, bidir=BIDIR_BW, chunk=None, coll_groups=(2, 4, 8, 16, 32, 64),
                a2a_min_bytes=None) -> dict:
    """The flat profile's ``curves`` mapping (see the module docstring); ``a2a_min_bytes`` makes the
    all-to-all curves start there (smaller messages are gaps)."""
    coll = {}
    for name, bw in COLL_BW.items():
        sizes = SIZES if a2a_min_bytes is None or name != "all_to_all" else [a2a_min_bytes, 1 << 50]
        coll[name] = {g: C.bandwidth_curve(sizes, [s / bw for s in sizes], provenance=PROV, group_size=g).model_dump()
                      for g in coll_groups}
    out = {
        "gemm": _table(("m", "n", "k"), GEMM_RATE),
        "gemm_fp32": {**_table(("m", "n", "k"), GEMM_RATE / 8), "dtype": "fp32"},
        "attention_fwd": _table(("seq_len", "heads", "head_dim"), ATTN_RATE),
        "attention_bwd": _table(("seq_len", "heads", "head_dim"), ATTN_RATE),
        "h2d": _bw(h2d), "d2h": _bw(d2h), "bidir": _bw(bidir),
        "gpu_adamw": C.param_rate_curve(SIZES, [s / ADAMW_RATE for s in SIZES], provenance=PROV).model_dump(),
        "cpu_adamw": {"threads": [1 << i for i in range(9)],
                      "s_per_param": [CPU_S_PER_PARAM_1T / (1 << i) for i in range(9)],
                      "num_params": 1, "status": "assumed"},
        "collectives": coll,
    }
    if chunk is not None:
        out["chunk_count"] = {"num_chunks": list(chunk[0]), "time_s": list(chunk[1]), "status": "assumed"}
    return out


def flat_cluster(*, host_cores=128, host_bw=1e15, gpus_per_node=8, **curve_kw) -> ClusterSpec:
    """The shipped H200 profile's memory constants with the flat curves and a synthetic topology
    (host DRAM effectively unlimited unless ``host_bw`` says otherwise)."""
    base = load_cluster("h200").model_dump(mode="json")
    base["topology"].update(gpu_name="SYN GPU", host_cores=host_cores, host_mem_bw_bytes_per_s=host_bw,
                            gpus_per_node=gpus_per_node)
    base["curves"] = flat_curves(**curve_kw)
    return C.parse_cluster(base)


def tiny_model(**kw) -> ModelSpec:
    """A small MoE whose sizes divide evenly; every layer MoE, GQA, no windows."""
    base = dict(name="tiny-moe", num_layers=4, hidden_size=256, vocab_size=4096, num_heads=8, num_kv_heads=4,
                head_dim=32, num_experts=16, top_k=2, expert_ffn=128)
    base.update(kw)
    return ModelSpec(**base)


def ctx_of(model, cluster, *, W=8, S=8192, overrides=None, **plan):
    """A resolved ``Ctx``; ``plan`` keys go to ``ComposedKnobs`` (``stack='fsdp2'`` and baseline
    keys to ``BaselineKnobs``)."""
    stack = plan.pop("stack", "composed")
    routing = plan.pop("routing", "balanced")
    knobs = {"composed": plan} if stack == "composed" else {"baseline": plan}
    p = Plan(world_size=W, stack=stack, routing=routing, **knobs)
    return make_context(model, cluster, Workload(seq_len=S), p, overrides=overrides)


@pytest.fixture(scope="session")
def flat():
    return flat_cluster()


@pytest.fixture(scope="session")
def cpu_profile(tmp_path_factory):
    """The CPU quick profile of this machine (``calibration.run(quick=True)``, a few seconds)."""
    import calibration

    out = tmp_path_factory.mktemp("cpuprof") / "cpu.yaml"
    return calibration.run(out, quick=True, progress=False, command="pytest: timing tests")


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
