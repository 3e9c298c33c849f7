"""Fits and lookups of the measured time-model curves (DESIGN §4, §6). Torch-free.

- **Fits.** ``fit_latency_rate`` fits ``t = α + x/β`` (α ≥ 0, β > 0) to measured ``(x, t)`` by
  non-negative least squares on *relative* residuals (``scipy.optimize.nnls`` on
  ``[1/t, x/t]·[α, 1/β] ≈ 1``), so small messages weigh as much as large ones. The fit is
  monotone by construction.
- **Rate tables** are read by multilinear interpolation in log2 of every axis
  (``scipy.interpolate.RegularGridInterpolator``); never monotone-smoothed (wave quantisation).
- **Range.** Every lookup raises ``ProfileGap`` outside the measured range. The only ways past the
  largest measured point are explicit rules, each documented where it is accepted. Zero work is
  free: a zero size, count or dimension costs 0 s (nothing is launched or moved; a caller that
  still issues an empty collective adds its latency itself). The keyword rules are
  ``beyond_max`` (latency-bandwidth: the fit above the largest size), ``split_rows`` (GEMM rows
  beyond the largest ``m`` as row blocks), ``beyond_max_seq`` (causal attention ``∝ S²`` beyond the
  largest ``S``). Callers that use a rule must flag their result.
- **Validation.** ``parse_curves`` / ``parse_cluster`` turn pydantic errors into one-line
  ``InvalidPlan`` and reject curves measured on another device than ``topology.gpu_name``.

Lookups accept scalars or numpy arrays (the search evaluates candidates vectorised). scipy is
imported lazily, so that importing this module keeps the CLI's start light.
"""

from __future__ import annotations

import numpy as np

from planner.errors import InvalidPlan, ProfileGap
from planner.schema.curves import (  # noqa: F401  (re-exported: the curve schema)
    COLLECTIVES, MONOTONE_NOISE_FRACTION, TABLE_AXES, BandwidthCurve, ChunkCurve, CollectiveCurves,
    CpuAdamWTable, Curve, Curves, ParamRateCurve, RateTable, check_devices,
)

_FIX = "re-run `planner calibrate` with a grid that covers it"


# ------------------------------------------------------------------------------------------------
# FLOP conventions (shared by calibration and the time model)
# ------------------------------------------------------------------------------------------------
def gemm_flops(m, n, k):
    """FLOPs of ``C[m,n] = A[m,k] @ B[k,n]``: ``2·m·n·k``."""
    return 2.0 * np.asarray(m, dtype=float) * n * k


def grouped_gemm_flops(tokens_per_group, groups, n, k):
    """FLOPs of a grouped GEMM of ``groups`` experts with ``tokens_per_group`` rows each."""
    return 2.0 * np.asarray(tokens_per_group, dtype=float) * groups * n * k


def attention_flops(seq_len, heads, head_dim, *, backward: bool = False):
    """Causal attention FLOPs for batch 1: forward ``2·S²·h·d`` (QKᵀ and PV, halved by the mask),
    backward ``5·S²·h·d`` (five matmuls). DESIGN §4."""
    s = np.asarray(seq_len, dtype=float)
    return (5.0 if backward else 2.0) * s * s * heads * head_dim


# ------------------------------------------------------------------------------------------------
# fits
# ------------------------------------------------------------------------------------------------
def fit_latency_rate(x, t) -> tuple[float, float, float]:
    """Fit ``t = α + x/β`` with α ≥ 0, β > 0.

    Args:
        x: sizes (bytes or parameters), > 0.
        t: measured seconds, > 0, same length (≥ 2).
    Returns:
        ``(α seconds, β per second, max relative residual)``.
    Raises:
        InvalidPlan: fewer than two points, or times that do not grow with size.
    """
    x = np.asarray(x, dtype=float)
    t = np.asarray(t, dtype=float)
    if x.shape != t.shape or x.size < 2:
        raise InvalidPlan("time_s", t.tolist(), "must hold ≥ 2 points, one per size",
                          "measure at least two sizes")
    from scipy.optimize import nnls

    a = np.stack([1.0 / t, x / t], axis=1)
    (alpha, inv_beta), _ = nnls(a, np.ones_like(t))
    if inv_beta <= 0.0:
        raise InvalidPlan("time_s", t.tolist(), "must grow with size for a latency-bandwidth fit",
                          "measure sizes large enough that transfer time dominates latency")
    fit = alpha + x * inv_beta
    return float(alpha), float(1.0 / inv_beta), float(np.max(np.abs(fit - t) / t))


def bandwidth_curve(size_bytes, time_s, *, provenance, group_size: int = 1,
                    note: str = "") -> BandwidthCurve:
    """A measured ``BandwidthCurve`` with its fit."""
    alpha, beta, res = fit_latency_rate(size_bytes, time_s)
    return BandwidthCurve(size_bytes=[int(v) for v in size_bytes], time_s=[float(v) for v in time_s],
                          latency_s=alpha, bytes_per_s=beta, max_rel_residual=res,
                          group_size=group_size, provenance=provenance, note=note)


def param_rate_curve(num_params, time_s, *, provenance, note: str = "") -> ParamRateCurve:
    """A measured ``ParamRateCurve`` (optimizer step time against parameters) with its fit."""
    alpha, beta, res = fit_latency_rate(num_params, time_s)
    return ParamRateCurve(num_params=[int(v) for v in num_params], time_s=[float(v) for v in time_s],
                          latency_s=alpha, params_per_s=beta, max_rel_residual=res,
                          provenance=provenance, note=note)


# ------------------------------------------------------------------------------------------------
# lookups
# ------------------------------------------------------------------------------------------------
def _check_range(curve: str, values, lo, hi) -> None:
    arr = np.asarray(values, dtype=float)
    bad = (arr < lo) | (arr > hi)
    if np.any(bad):
        first = arr[bad].flat[0] if arr.ndim else arr
        raise ProfileGap(curve, float(first), lo, hi, _FIX)


def _require(curve, name: str):
    if curve is None:
        raise ProfileGap(name, "any", None, None, "the profile has no such curve; run `planner calibrate`")
    return curve


def _latency_rate(curve, x_points, rate, x, name: str, beyond_max: bool):
    lo, hi = x_points[0], x_points[-1]
    x = np.asarray(x, dtype=float)
    _check_range(name, x[x != 0], lo, np.inf if beyond_max else hi)
    out = np.where(x == 0, 0.0, curve.latency_s + x / rate)
    return float(out) if out.ndim == 0 else out


def bandwidth_time_s(curve: BandwidthCurve | None, size_bytes, *, name: str, beyond_max: bool = False):
    """Seconds to move ``size_bytes`` on ``curve``: ``α + n/β`` inside the measured sizes.

    ``beyond_max=True`` (explicit rule): above the largest measured size the fit is used, since
    the bandwidth term dominates there; below the smallest size it is always a ``ProfileGap``.
    """
    curve = _require(curve, name)
    return _latency_rate(curve, curve.size_bytes, curve.bytes_per_s, size_bytes, name, beyond_max)


def transfer_time_s(curves: Curves, kind: str, size_bytes, *, beyond_max: bool = False):
    """Host-device copy time; ``kind`` ∈ {h2d, d2h, bidir} (``bidir``: bytes each way, both at once)."""
    assert kind in ("h2d", "d2h", "bidir"), kind
    return bandwidth_time_s(getattr(curves, kind), size_bytes, name=kind, beyond_max=beyond_max)


def collective_time_s(curves: Curves, collective: str, group_size: int, size_bytes, *,
                      beyond_max: bool = False):
    """Collective time at ``group_size`` (must be measured; no interpolation across group sizes).

    ``size_bytes`` follows the convention of ``CollectiveCurves``.
    """
    assert collective in COLLECTIVES, collective
    table = getattr(curves.collectives, collective)
    name = f"collectives.{collective}"
    if group_size not in table:
        raise ProfileGap(f"{name}.group_size", group_size, min(table, default=None),
                         max(table, default=None), "calibrate under torchrun at this group size")
    return bandwidth_time_s(table[group_size], size_bytes, name=f"{name}.{group_size}",
                            beyond_max=beyond_max)


def gpu_adamw_time_s(curves: Curves, num_params, *, beyond_max: bool = False):
    """Fused GPU AdamW step seconds over ``num_params`` fp32 parameters (rule as ``bandwidth_time_s``)."""
    c = _require(curves.gpu_adamw, "gpu_adamw")
    return _latency_rate(c, c.num_params, c.params_per_s, num_params, "gpu_adamw", beyond_max)


def cpu_adamw_time_s(curves: Curves, num_params, threads):
    """Fused CPU AdamW step seconds: ``num_params × s_per_param(threads)``.

    ``s_per_param`` is interpolated linearly in ``threads`` (may be fractional, e.g. host cores per
    GPU). Rule: the per-parameter cost was measured on a state far larger than the last-level
    cache, so it holds for any ``num_params`` ≥ the measured count; smaller problems may run from
    cache and raise ``ProfileGap`` (zero parameters cost 0 s).
    """
    return _per_thread_time(curves.cpu_adamw, "cpu_adamw", num_params, threads)


def cpu_cast_time_s(curves: Curves, num_params, threads):
    """Host cast seconds (bf16→fp32 upcast + fp32→bf16 downcast) over ``num_params`` elements at
    ``threads``; same interpolation rule and range checks as ``cpu_adamw_time_s``."""
    return _per_thread_time(curves.cpu_cast, "cpu_cast", num_params, threads)


def _per_thread_time(table, name: str, num_params, threads):
    c = _require(table, name)
    _check_range(f"{name}.threads", threads, c.threads[0], c.threads[-1])
    n = np.asarray(num_params, dtype=float)
    _check_range(f"{name}.num_params", n[n != 0], c.num_params, np.inf)
    spp = np.interp(np.asarray(threads, dtype=float), c.threads, c.s_per_param)
    out = np.asarray(num_params, dtype=float) * spp
    return float(out) if out.ndim == 0 else out


_INTERP: dict[int, tuple] = {}
"""``id(table) → (table, RegularGridInterpolator)``; the table is kept so its id stays unique."""


def _interpolator(table: RateTable):
    from scipy.interpolate import RegularGridInterpolator

    hit = _INTERP.get(id(table))
    if hit is None or hit[0] is not table:
        grid = tuple(np.log2(np.asarray(a, dtype=float)) for a in table.axes)
        hit = (table, RegularGridInterpolator(grid, np.asarray(table.flops_per_s, dtype=float)))
        _INTERP[id(table)] = hit
    return hit[1]


def table_rate(table: RateTable | None, name: str, *coords):
    """Interpolated FLOP/s of ``table`` at ``coords`` (one per axis; scalars or broadcastable arrays).

    Raises:
        ProfileGap: a coordinate outside its axis's measured range, or no table.
    """
    table = _require(table, name)
    assert len(coords) == len(table.axes), (name, len(coords))
    arrs = np.broadcast_arrays(*[np.asarray(c, dtype=float) for c in coords])
    # zero work is free: the caller's FLOPs are 0 there, so any in-range rate will do
    arrs = [np.where(a == 0, pts[0], a) for a, pts in zip(arrs, table.axes)]
    for axis, pts, arr in zip(table.axis_names, table.axes, arrs):
        _check_range(f"{name}.{axis}", arr, pts[0], pts[-1])
    pts = np.stack([np.log2(a).ravel() for a in arrs], axis=1)
    out = _interpolator(table)(pts).reshape(arrs[0].shape)
    return float(out) if out.ndim == 0 else out


def gemm_time_s(curves: Curves, m, n, k, *, split_rows: bool = False):
    """Dense GEMM seconds ``2mnk / rate(m, n, k)``.

    ``split_rows=True`` (explicit rule): ``m`` above the largest measured ``m_max`` is timed as
    ``⌊m/m_max⌋`` GEMMs of ``m_max`` rows plus one of the remainder (at least the smallest measured
    ``m``): a GEMM is row-separable, and cuBLAS is no slower on the whole than on its row blocks.
    """
    table = _require(curves.gemm, "gemm")
    if not split_rows:
        return gemm_flops(m, n, k) / table_rate(table, "gemm", m, n, k)
    m_lo, m_max = table.axes[0][0], table.axes[0][-1]
    m = np.asarray(m, dtype=float)
    _check_range("gemm.m", m[m != 0], m_lo, np.inf)
    q, r = np.floor_divide(m, m_max), np.mod(m, m_max)
    base = np.minimum(m, m_max)
    t_full = gemm_flops(base, n, k) / table_rate(table, "gemm", base, n, k)
    rr = np.clip(r, m_lo, m_max)
    t_rem = np.where(r > 0, gemm_flops(rr, n, k) / table_rate(table, "gemm", rr, n, k), 0.0)
    out = np.where(m > m_max, q * t_full + t_rem, t_full)
    return float(out) if np.ndim(out) == 0 else out


def grouped_gemm_time_s(curves: Curves, tokens_per_group, groups, n, k):
    """Grouped expert GEMM seconds (``groups`` experts, ``tokens_per_group`` rows each)."""
    rate = table_rate(curves.grouped_gemm, "grouped_gemm", tokens_per_group, groups, n, k)
    return grouped_gemm_flops(tokens_per_group, groups, n, k) / rate


def attention_time_s(curves: Curves, seq_len, heads, head_dim, *, backward: bool = False,
                     beyond_max_seq: bool = False):
    """Causal flash attention seconds for batch 1 (forward, or backward with ``backward=True``).

    ``beyond_max_seq=True`` (explicit rule): above the largest measured ``S_max`` the time is
    ``t(S_max)·(S/S_max)²`` at the same heads and head_dim: the work grows as ``S²`` and the kernel
    is already saturated at ``S_max`` (it only gains parallelism with ``S``).
    """
    name = "attention_bwd" if backward else "attention_fwd"
    table = _require(getattr(curves, name), name)
    s = np.asarray(seq_len, dtype=float)
    if beyond_max_seq:
        s_max = table.axes[0][-1]
        _check_range(f"{name}.seq_len", s[s != 0], table.axes[0][0], np.inf)
        s_eval = np.minimum(s, s_max)
        scale = np.maximum(s / s_max, 1.0) ** 2
    else:
        s_eval, scale = s, 1.0
    t = attention_flops(s_eval, heads, head_dim, backward=backward) / table_rate(
        table, name, s_eval, heads, head_dim)
    out = t * scale
    return float(out) if np.ndim(out) == 0 else out


def chunk_relative_time(curves: Curves, num_chunks):
    """PipelinedLLEP time at ``K`` chunks relative to the smallest measured ``K`` (linear in ``K``)."""
    c = _require(curves.chunk_count, "chunk_count")
    _check_range("chunk_count.num_chunks", num_chunks, c.num_chunks[0], c.num_chunks[-1])
    rel = np.asarray(c.time_s) / c.time_s[0]
    out = np.interp(np.asarray(num_chunks, dtype=float), c.num_chunks, rel)
    return float(out) if out.ndim == 0 else out


# ------------------------------------------------------------------------------------------------
# validation: one-line errors
# ------------------------------------------------------------------------------------------------
def parse_curves(data: dict, *, gpu_name: str | None = None) -> Curves:
    """Validate a ``curves`` mapping; with ``gpu_name``, also check every curve's device.

    Raises:
        InvalidPlan: one line naming the field (non-monotone curve, missing field, bad grid,
        mismatched device).
    """
    from planner.schema.io import validate

    curves = validate(Curves, data, "curves")
    if gpu_name is not None:
        check_devices(curves, gpu_name)
    return curves


def parse_cluster(data: dict):
    """Validate a whole cluster profile mapping into a ``ClusterSpec`` and check curve devices.

    Raises:
        InvalidPlan: as ``parse_curves``, for any field of the profile.
    """
    from planner.schema.cluster import ClusterSpec
    from planner.schema.io import validate

    spec = validate(ClusterSpec, data, "cluster")
    check_devices(spec.curves, spec.topology.gpu_name)
    return spec
