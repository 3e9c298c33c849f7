"""``bench/step_profile.py``'s trace summary on a synthetic chrome trace: GPU busy time is the union
of kernel/memcpy/memset intervals (overlaps on two streams counted once), idle is wall − busy,
kernels are sorted into kinds by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import step_profile as SP  # noqa: E402

US = 1e-6


def _k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_union_and_idle():
    trace = {"traceEvents": [
        _k("sm90_xmma_gemm_bf16", 0, 100), _k("flash_fwd_kernel", 50, 100),      # overlap: 0..150
        _k("ncclDevKernel_AllGather", 300, 50), _k("Memcpy HtoD", 400, 10, "gpu_memcpy"),
        _k("vectorized_elementwise_kernel", 1000, 40),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5},
    ]}
    r = SP.summarise(trace, wall_s=2000 * US, steps=1)
    assert r["gpu_busy_s"] == pytest.approx((150 + 50 + 10 + 40) * US)
    assert r["gpu_idle_s"] == pytest.approx((2000 - 250) * US)
    assert r["kernel_s_by_kind"] == pytest.approx({"gemm": 100 * US, "attention": 100 * US, "nccl": 50 * US,
                                                   "memcpy": 10 * US, "other": 40 * US})
    assert r["kernels"] == 5 and r["cpu_ops"] == 1


def test_per_step_means():
    trace = {"traceEvents": [_k("gemm", 0, 100), _k("gemm", 500, 100)]}
    r = SP.summarise(trace, wall_s=1000 * US, steps=2)
    assert r["wall_s"] == pytest.approx(500 * US) and r["gpu_busy_s"] == pytest.approx(100 * US)
