"""Optimizer steps and offload traffic: the overlap rules of DESIGN §4.

Legend: ``Θ_r`` parameters of one rank's optimizer, ``β`` bucket size, ``s`` staging slots,
``G_f = ⌊Θ_r/β⌋`` full buckets and a remainder ``ρ = Θ_r − G_f·β``, ``r`` ranks sharing a node,
``T`` host threads. Every copy goes through ``comm.host_copy_s`` (measured points, and the host
DRAM share when ``r > 1``).

- **GPU fused AdamW** (``gpu_adamw_s``): the measured ``gpu_adamw`` points at ``Θ_r`` (fp32
  parameters and grads); the composed stack's bf16 working weights add the grad upcast and the
  weight refresh, ``GRAD_UPCAST_BYTES + WEIGHT_REFRESH_BYTES`` = 12 B per parameter of
  elementwise traffic.
- **OffloadStreamAdamW** (``stream_adamw_s``, ``planner/runtime/offload_adamw.py``): per bucket
  of ``x`` parameters, three H2D copies of ``4x`` bytes (master, m, v), the update ``U(x)`` (the
  fused AdamW on the fp32 slot + the 12 B/param upcast and refresh), three D2H copies. In steady
  state the H2D of bucket ``j+1`` and the D2H of bucket ``j−1`` run at once, so a cycle moves both
  at the **bidirectional** rate, ``X(x) = 3·t_bidir(4x)``. Bucket ``j``'s H2D waits for the D2H of
  bucket ``j−s`` (its slot), so ``s`` cycles must hold one bucket's ``H + U + D``:

      cycle(x) = max(X(x), U(x), (2·X(x) + U(x))/s)              (s ≥ 2)
      T = fill(β) + (G_f − 1)·cycle(β) + [ρ>0]·cycle(ρ),   fill = H₁(β) + U(β) + D₁(β)

  with ``H₁``/``D₁`` at the one-way rates (``G·max(T_H2D, T_update, T_D2H) + fill``; ``s = 1`` is
  serial, ``G_f·(H₁ + U + D₁)``; ``Θ_r < β`` is one serial bucket).
- **CPUOffloadAdamW** (ZeRO-Offload style, ``cpu_offload_adamw_s``), serial with the GPU: the bf16
  grads down (``b·Θ_r`` D2H), the host update, the bf16 weights up (``b·Θ_r`` H2D). The host update
  is torch's fused CPU AdamW at ``T = host_cores / G_n`` threads (interpolated in the measured
  ``cpu_adamw`` table), plus the grad upcast and master downcast passes, timed by the measured
  ``cpu_cast`` table at the same threads (without it, at the AdamW's own implied host bandwidth,
  ``(28 + 12)/28`` of its time, listed as assumed); it is bounded below
  by the host-memory bandwidth the rank gets: ``HOST_BYTES_PER_PARAM`` = 40 B per parameter
  (AdamW reads master, grad, m, v and writes master, m, v: 28 B; upcast reads 2 writes 4; downcast
  reads 4 writes 2) at ``host_mem_bw / G_n``. So streaming wins when the link is faster than
  the cores (and DRAM share) a GPU gets, and the CPU when it is not.
- **SCO** (``sco_exposed_s``): offloading boundary ``h_ℓ`` overlaps region ``ℓ``'s forward and
  exposes ``max(0, t_D2H − T_fwd(ℓ))``; restoring it is prefetched while region ``ℓ+1``
  recomputes and runs its backward (the head for ``ℓ = L_b``) and exposes
  ``max(0, t_H2D − T_bwd(ℓ+1))``. Beyond the exposed copies, the copies' traffic slows the
  compute they overlap (copy engines and HBM shared with the kernels, the stream waits): measured
  against plain checkpointing (the profile's ``sco`` curve) as ``ε`` seconds per offloaded byte,
  from the row whose copies the rule hides best (``sco_overhead_per_byte``), so the step adds
  ``n_off · b_h · ε`` (``b_h`` one boundary's bytes). Without the curve ``ε = 0`` (listed).
"""

from __future__ import annotations

import numpy as np

from planner.timing import curves as C
from planner.timing.comm import host_copy_s, host_dram_s
from planner.timing.compute import elementwise_s
from planner.timing.lookups import Lookups, nan_like, points_s

GRAD_UPCAST_BYTES = 6
"""Device bytes per parameter to upcast a bf16 grad into an fp32 slot (read 2, write 4)."""
WEIGHT_REFRESH_BYTES = 6
"""Device bytes per parameter to refresh the bf16 weight from the fp32 master (read 4, write 2)."""
HOST_ADAMW_BYTES = 28
"""Host bytes per parameter of the fused CPU AdamW (read master, grad, m, v; write master, m, v)."""
HOST_CAST_BYTES = 12
"""Host bytes per parameter of CPUOffloadAdamW's casts: grad upcast (2 + 4) and master downcast (4 + 2)."""
HOST_BYTES_PER_PARAM = HOST_ADAMW_BYTES + HOST_CAST_BYTES
"""40 B of host-memory traffic per parameter of one CPU-offloaded step (module docstring)."""


def gpu_adamw_s(lk: Lookups, theta, *, working_bf16: bool = False):
    """Seconds of the fused GPU AdamW over ``theta`` fp32 parameters (+ upcast/refresh traffic when
    the working weights and grads are bf16)."""
    c = lk.required("gpu_adamw")
    if c is None:
        return nan_like(theta)
    t = points_s(lk, "gpu_adamw", c.num_params, c.time_s, theta)
    if working_bf16:
        t = t + elementwise_s(lk, (GRAD_UPCAST_BYTES + WEIGHT_REFRESH_BYTES) * np.asarray(theta, dtype=float))
    return t


def _bucket(lk: Lookups, x, ranks: int):
    """(H₁, U, D₁, X) of one bucket of ``x`` parameters."""
    nb = 4.0 * np.asarray(x, dtype=float)
    h1 = 3.0 * host_copy_s(lk, "h2d", nb, ranks=ranks)
    d1 = 3.0 * host_copy_s(lk, "d2h", nb, ranks=ranks)
    both = 3.0 * host_copy_s(lk, "bidir", nb, ranks=ranks)
    upd = gpu_adamw_s(lk, x, working_bf16=True)
    return h1, upd, d1, both


def stream_adamw_s(lk: Lookups, theta, bucket_params, staging_slots, *, ranks: int = 1) -> dict:
    """OffloadStreamAdamW step seconds (module rule). Returns ``{total, fill, cycles, transfer,
    update}`` arrays: ``transfer``/``update`` are the summed stage times (what overlaps)."""
    theta = np.asarray(theta, dtype=float)
    beta = np.minimum(np.asarray(bucket_params, dtype=float), theta)
    s = np.asarray(staging_slots, dtype=float)
    g_full = np.floor(theta / np.maximum(beta, 1.0))
    rho = theta - g_full * beta
    h1, u, d1, x = _bucket(lk, beta, ranks)
    rh1, ru, rd1, rx = _bucket(lk, rho, ranks)

    def cycle(hx, ux):
        return np.maximum(np.maximum(hx, ux), (2.0 * hx + ux) / np.maximum(s, 1.0))

    serial = s < 2
    fill = h1 + u + d1
    piped = fill + (g_full - 1.0) * cycle(x, u) + np.where(rho > 0, cycle(rx, ru), 0.0)
    ser = g_full * fill + np.where(rho > 0, rh1 + ru + rd1, 0.0)
    total = np.where(serial, ser, piped)
    return {"total": total, "fill": np.where(serial, 0.0, fill),
            "transfer": g_full * x + np.where(rho > 0, rx, 0.0), "update": g_full * u + np.where(rho > 0, ru, 0.0)}


def cpu_threads_per_gpu(lk: Lookups) -> float:
    """Host threads one GPU's process gets: ``host_cores / gpus_per_node`` (the declared topology;
    listed as assumed while ``topology_status`` is)."""
    topo = lk.topology
    t = topo.host_cores / topo.gpus_per_node
    if topo.topology_status == "assumed":
        lk.assume(f"declared topology: {topo.host_cores} host cores / {topo.gpus_per_node} GPUs = {t:g} "
                  "AdamW threads per GPU")
    return t


def _below_measured_count(lk: Lookups, table, theta, name: str) -> None:
    """List the rule when some ``theta`` is timed below the table's measured count."""
    n = np.asarray(theta, dtype=float)
    if np.any((n >= C.table_floor_params(table)) & (n < table.num_params)):
        lk.assume(f"{name}: parameter counts from {C.table_floor_params(table):.3g} to the measured "
                  f"{table.num_params:.3g} at the measured per-parameter cost (state beyond the last-level cache)")


def host_adamw_s(lk: Lookups, theta, threads, *, casts: bool, ranks: int = 1):
    """Host AdamW seconds over ``theta`` parameters at ``threads`` (+ the casts of CPUOffloadAdamW),
    bounded by the rank's host-memory share when ``ranks > 1``."""
    c = lk.required("cpu_adamw")
    if c is None:
        return nan_like(theta, threads)
    t = lk.call(lambda n, th: C.cpu_adamw_time_s(lk.curves, n, th), theta, threads)
    _below_measured_count(lk, c, theta, "cpu_adamw")
    nbytes = HOST_ADAMW_BYTES
    if casts:
        if lk.curves.cpu_cast is not None:  # measured: the upcast + downcast passes by thread count
            t = t + lk.call(lambda n, th: C.cpu_cast_time_s(lk.curves, n, th), theta, threads)
            _below_measured_count(lk, lk.curves.cpu_cast, theta, "cpu_cast")
        else:
            lk.assume(f"CPUOffloadAdamW casts ({HOST_CAST_BYTES} B/param) at the host bandwidth the fused CPU "
                      f"AdamW implies ({HOST_ADAMW_BYTES} B/param)")
            t = t * (HOST_ADAMW_BYTES + HOST_CAST_BYTES) / HOST_ADAMW_BYTES
        nbytes = HOST_BYTES_PER_PARAM
    return np.maximum(t, host_dram_s(lk, nbytes * np.asarray(theta, dtype=float), ranks=ranks))


def cpu_offload_adamw_s(lk: Lookups, theta, threads, *, act_bytes: int = 2, ranks: int = 1) -> dict:
    """CPUOffloadAdamW step seconds: ``{total, d2h, host, h2d}`` (serial; module docstring)."""
    nb = act_bytes * np.asarray(theta, dtype=float)
    d2h = host_copy_s(lk, "d2h", nb, ranks=ranks)
    host = host_adamw_s(lk, theta, threads, casts=True, ranks=ranks)
    h2d = host_copy_s(lk, "h2d", nb, ranks=ranks)
    return {"total": d2h + host + h2d, "d2h": d2h, "host": host, "h2d": h2d}


def sco_counts(regions: tuple[str, ...], num_offloaded) -> dict[str, dict]:
    """For ``n_off`` offloaded boundaries (arrays ok): per region kind, how many offloads overlap a
    forward of that kind (``fwd``) and how many restores overlap a backward of that kind (``bwd``),
    plus ``head`` (1 where the last boundary is offloaded: its restore overlaps the head)."""
    L_b = len(regions)
    n = np.minimum(np.asarray(num_offloaded, dtype=np.int64), L_b)
    kinds = sorted(set(regions))
    out: dict[str, dict] = {}
    for kind in kinds:
        cum = np.concatenate([[0], np.cumsum([r == kind for r in regions])])
        bwd = np.where(n > 0, cum[np.minimum(n + 1, L_b)] - cum[min(1, L_b)], 0)
        out[kind] = {"fwd": cum[n], "bwd": bwd}
    out["head"] = (n == L_b).astype(np.int64) * (L_b > 0)
    return out


def sco_row_exposed_s(row) -> float:
    """The module rule's exposed copy seconds for one ``SCORow`` (every boundary offloaded): per
    region ``max(0, d2h − forward_s/L_b) + max(0, h2d − (plain_step_s − forward_s)/L_b)`` (the
    backward phase's recompute + backward split evenly over the regions)."""
    n = row.num_boundaries
    fwd, bwd = row.forward_s / n, max(0.0, row.plain_step_s - row.forward_s) / n
    return n * (max(0.0, row.d2h_s - fwd) + max(0.0, row.h2d_s - bwd))


def sco_fit_row(curve):
    """The row ``ε`` is measured on: the one whose copies the rule hides best (largest
    ``forward_s / (L_b·(d2h + h2d))``)."""
    return max(curve.rows, key=lambda r: r.forward_s / max(r.num_boundaries * (r.d2h_s + r.h2d_s), 1e-12))


def sco_overhead_per_byte(lk: Lookups) -> float:
    """``ε`` (module docstring): ``(sco − plain − exposed) / (L_b·b_h)`` on ``sco_fit_row``, ≥ 0."""
    cv = getattr(lk.curves, "sco", None)
    if cv is None or not cv.rows:
        lk.assume("SCO: no cost beyond the exposed copies (the profile has no sco curve)")
        return 0.0
    r = sco_fit_row(cv)
    eps = max(0.0, (r.sco_step_s - r.plain_step_s - sco_row_exposed_s(r)) / (r.num_boundaries * r.boundary_bytes))
    lk.assume(f"SCO: {eps * 1e9 * 1e3:.3g} ms per GB offloaded beyond the exposed copies (measured against plain "
              f"checkpointing on the '{r.config}' decoder, {r.num_boundaries} boundaries of "
              f"{r.boundary_bytes / 1e6:.0f} MB; used at every shape)")
    return eps


def sco_exposed_s(lk: Lookups, regions, num_offloaded, boundary_bytes, t_fwd: dict, t_bwd: dict, t_head,
                  *, ranks: int = 1) -> dict:
    """Exposed SCO copy seconds per micro-step: ``{offload, restore, overhead}`` (module rule).

    ``t_fwd``/``t_bwd``: region kind → seconds of one forward / one recompute + backward.
    """
    d2h = host_copy_s(lk, "d2h", boundary_bytes, ranks=ranks)
    h2d = host_copy_s(lk, "h2d", boundary_bytes, ranks=ranks)
    cnt = sco_counts(tuple(regions), num_offloaded)
    off = 0.0
    res = cnt["head"] * np.maximum(0.0, h2d - t_head)
    for kind in sorted(set(regions)):
        off = off + cnt[kind]["fwd"] * np.maximum(0.0, d2h - t_fwd[kind])
        res = res + cnt[kind]["bwd"] * np.maximum(0.0, h2d - t_bwd[kind])
    n_off = np.minimum(np.asarray(num_offloaded, dtype=float), len(regions))
    over = n_off * np.asarray(boundary_bytes, dtype=float) * sco_overhead_per_byte(lk)
    return {"offload": off, "restore": res, "overhead": over, "d2h": d2h, "h2d": h2d}
