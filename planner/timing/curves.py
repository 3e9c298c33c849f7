"""Fits and lookups of the measured time-model curves (DESIGN §4, §6). Torch-free.

- **Fits.** ``fit_latency_rate`` fits ``t = α + x/β`` (α ≥ 0, β > 0) to measured ``(x, t)`` by
  non-negative least squares on *relative* residuals (``scipy.optimize.nnls`` on
  ``[1/t, x/t]·[α, 1/β] ≈ 1``), so small messages weigh as much as large ones. The fit is
  monotone by construction.
- **Host optimizer tables.** ``cpu_adamw_time_s`` / ``cpu_cast_time_s``: seconds per parameter
  interpolated in the thread count; ``ProfileGap`` outside the measured threads or below
  ``HOST_TABLE_FLOOR_PARAMS`` (or the measured count, if smaller; zero work is free). Between the
  floor and the measured count the measured per-parameter cost holds (an assumed rule the time
  model lists). ``_check_range`` is the range check every lookup of
  ``planner.timing`` shares.
- The other lookups live with the time model: rate tables (multilinear in log2 of every axis,
  never monotone-smoothed) in ``planner.timing.compute``, measured copy, collective and AdamW points
  in ``planner.timing.lookups`` / ``comm``.
- **Validation.** ``parse_curves`` / ``parse_cluster`` turn pydantic errors into one-line
  ``InvalidPlan`` and reject curves measured on another device than ``topology.gpu_name``.

Lookups accept scalars or numpy arrays (the search evaluates candidates vectorised). scipy is
imported lazily (the fit), so that importing this module keeps the CLI's start light.
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


def missing_curve_fix(gpu_name: str | None = None) -> str:
    """The fix printed for a curve the profile lacks: a CPU profile (``planner calibrate --quick``
    on a machine without a GPU) holds no device curve, so calibrating again there cannot help."""
    if gpu_name == "cpu":
        return "this profile was calibrated without a GPU; run `planner calibrate` on a GPU of the cluster"
    return "run `planner calibrate` on this cluster"


def _require(curve, name: str):
    if curve is None:
        raise ProfileGap.missing(name, missing_curve_fix())
    return curve


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


HOST_TABLE_FLOOR_PARAMS = 1 << 25
"""Smallest parameter count a host table times at its measured per-parameter cost: 2^25 parameters
hold 512 MiB of fp32 AdamW state (p, grad, m, v), beyond any host's last-level cache. The shipped
H200 tables at the two counts, measured on two hosts (instance ea6203ee at 2^25: 1.67 / 0.26 s per
10^9 parameters at 1 / 16 threads; 09fb451c at 10^9: 1.76 / 0.22) differ by 5% and 12%, in opposite
directions: no systematic change with the count, but a 16-thread shard below 10^9 may run up to
~12% slower than the table says."""


def table_floor_params(table) -> int:
    """The smallest count ``table`` answers for (see ``HOST_TABLE_FLOOR_PARAMS``)."""
    return min(table.num_params, HOST_TABLE_FLOOR_PARAMS)


def _per_thread_time(table, name: str, num_params, threads):
    c = _require(table, name)
    _check_range(f"{name}.threads", threads, c.threads[0], c.threads[-1])
    n = np.asarray(num_params, dtype=float)
    _check_range(f"{name}.num_params", n[n != 0], table_floor_params(c), np.inf)
    spp = np.interp(np.asarray(threads, dtype=float), c.threads, c.s_per_param)
    out = np.asarray(num_params, dtype=float) * spp
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
