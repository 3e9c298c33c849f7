"""PipelinedLLEP's chunk pipeline priced from the measured chunk-count curve (DESIGN §4: "the
PipelinedLLEP chunk pipeline uses the measured chunk-count curve").

Legend: ``K`` chunks, ``t_K`` the curve's measured seconds at ``K`` (one rank, balanced routing,
``c = ceil(N/K)``, the router and a dense upstream gradient included: ``calibration/chunks.py``),
``r_K`` the operator replay of ``planner.timing.dispatch`` at the curve's own shape and ``K``
(``ρ`` the router's and loss's part of it, the same at every ``K``).

The replay prices each chunk's GEMM blocks, memory-bound kernels and launches from the GEMM table
and the ``dispatch_kernels`` curve; what it misses per chunk (allocator reuse across chunks,
partial waves of small blocks, the reentrant checkpoint's bookkeeping) the curve has measured. So
the operator's compute at ``K`` chunks is the replay times

    φ(K) = (t_K − f_K − ρ) / (r_K − ρ)   (the curve's measured/replayed ratio of the operator alone)

where ``f_K`` is the seconds of the emulation's filled all-to-all outputs at the ``copy`` class rate
(a curve measured on one GPU runs rank 0 of ``E_p = 8`` under the fake process group, its receive
buffers written from random data: ``planner/runtime/pipelined_llep_calibration.py``; 0 on a real
group)

piecewise-linear in ``log K`` between the measured ``K``; above the largest measured ``K`` its last
ratio (rule, listed in ``assumed``). The ratio is measured at one shape (the curve's ``shape``) and
used at every shape and for both residue variants (assumed, listed). ``K = 1`` is a measured
point too: φ(1) carries the whole-operator correction of that shape. A point whose replay is
host-bound (``HOST_BOUND_SHARE``) is left out (listed): there the replay runs at the profile's
host calibration and the measurement at the host of the instance the curve ran on, so the ratio is
the two hosts' pace, which a GPU-bound configuration (PipelinedLLEP at ``E_p = 8``, 16 slots per
chunk) must not inherit. A point whose ratio is not positive (its measured seconds no more than the
replay's router and the fills: a curve too small to time the operator) is left out too (listed).
Without the curve, or without a usable point, φ = 1 (listed).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from planner.timing.lookups import Lookups, shared_memo

SHAPE_KEYS = ("tokens_per_rank", "hidden_size", "expert_ffn", "num_experts", "top_k", "expert_parallel")
"""Keys of ``ChunkCurve.shape`` the replay needs."""
HOST_BOUND_SHARE = 0.02
"""A curve point whose replay has more than this share of its seconds in exposed host launches is
host-bound: its measured/replayed ratio is the curve instance's host pace against the profile's
host calibration (``dispatch_kernels.host_loops``), not the per-chunk GPU costs φ carries, and it is
not used (listed). At the H200 curve's shape (E_p = 1, 128 slots per chunk) K = 5, 10 and 20 are:
0.06, 0.41 and 1.12 s of exposed host in replays of 0.58, 1.02 and 1.93 s, and K = 1-3 none: any
threshold below 10% splits that curve the same way (a policy, not a measurement)."""


def ratios(lk: Lookups, replay: Callable[[int, dict], tuple[float, float, float]],
           copy_s: Callable[[float, dict], float] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(K, φ_K)`` at the curve's measured ``K`` (module formula), or None without a usable curve.

    ``replay(K, shape) -> (operator seconds, router-and-loss seconds, exposed host seconds)`` at the
    curve's shape (forward + backward, no communication, balanced, ``c = ceil(N/K)``).
    ``copy_s(nbytes, shape) -> seconds``: the emulation's all-to-all fills (``fill_bytes``), taken
    out of ``t_K`` (required when the curve has them). Host-bound points (``HOST_BOUND_SHARE``) are
    left out; None when no point is left.
    """
    cc = lk.curves.chunk_count
    if cc is None or any(k not in cc.shape for k in SHAPE_KEYS):
        return None
    memo = shared_memo(("chunk_curve_ratios", lk.curves))   # the replay reads the profile's other curves too
    if "phi" not in memo:    # computed once per curve, a curve with no usable point included
        ks, phi, dropped, unusable = [], [], [], []
        fills = cc.fill_bytes or [0.0] * len(cc.num_chunks)
        if cc.fill_bytes and copy_s is None:
            raise ValueError("the chunk-count curve has fill_bytes: ratios() needs copy_s")
        for K, t, nb in zip(cc.num_chunks, cc.time_s, fills):
            t = t - (copy_s(nb, dict(cc.shape)) if nb else 0.0)
            op, rho, host = replay(int(K), dict(cc.shape))
            if op > 0 and host > HOST_BOUND_SHARE * op:
                dropped.append(int(K))
                continue
            ratio = (t - rho) / op if op > 0 else np.nan
            if not (np.isfinite(ratio) and ratio > 0):
                unusable.append(int(K))
                continue
            ks.append(float(K))
            phi.append(ratio)
        memo["phi"] = (np.asarray(ks), np.asarray(phi, dtype=float)) if ks else None
        memo["dropped"], memo["unusable"] = dropped, unusable
    if memo["unusable"]:
        lk.assume(f"chunk-count curve points K = {memo['unusable']} left out of φ(K): their measured seconds do not "
                  "exceed the replay's router and loss plus the emulation's fills at the copy rate (a curve too "
                  "small to time the operator), so their ratio is not positive")
    if memo["dropped"]:
        lk.assume(f"chunk-count curve points K = {memo['dropped']} left out of φ(K): their replay is host-bound (exposed host "
                  f"launches above {HOST_BOUND_SHARE:.0%} of it), so their measured/replayed ratio is the host pace of "
                  "the curve's instance, not per-chunk GPU costs; φ there is the nearest GPU-bound point's")
    return memo["phi"]


def factor(lk: Lookups, K, replay, copy_s=None) -> np.ndarray | float:
    """φ(K) for every candidate's chunk count (module docstring); 1 without the curve."""
    got = ratios(lk, replay, copy_s)
    K = np.asarray(K, dtype=float)
    if got is None:
        lk.assume("PipelinedLLEP per-chunk costs from the operator replay alone (the profile has no usable "
                  "chunk_count curve)")
        return np.ones(K.shape) if K.ndim else 1.0
    ks, phi = got
    s = lk.curves.chunk_count.shape
    lk.assume("PipelinedLLEP compute × the chunk-count curve's measured/replayed ratio φ(K) ("
              + ", ".join(f"K={int(k)}: {p:.3f}" for k, p in zip(ks, phi))
              + f"; measured at N={s['tokens_per_rank']}, H={s['hidden_size']}, I={s['expert_ffn']}, "
              f"E={s['num_experts']}, k={s['top_k']}, E_p={s['expert_parallel']}, used at every shape; "
              "piecewise-linear in log K)")
    if np.any(K < ks[0]):
        lk.assume(f"PipelinedLLEP chunk counts below the curve's smallest measured K = {int(ks[0])} at its first "
                  f"ratio φ = {phi[0]:.3f}")
    if np.any(K > ks[-1]):
        lk.assume(f"PipelinedLLEP chunk counts above the curve's largest measured K = {int(ks[-1])} at its last "
                  f"ratio φ = {phi[-1]:.3f}")
    out = np.interp(np.log(np.maximum(K, 1.0)), np.log(ks), phi)
    return float(out) if out.ndim == 0 else out
