"""Compute times from the calibrated rate tables, vectorised over candidates (DESIGN §4).

Legend: ``m, n, k`` GEMM sizes (``C[m,n] = A[m,k] @ B[k,n]``), ``S`` sequence length, ``h`` heads
on the rank, ``d_qk``/``d_v`` query-key and value head widths, ``w`` a sliding window.

- Lookups go through ``planner.timing.lookups.Lookups`` (unique shapes, NaN + message on a gap).
- **GEMM** seconds = ``2mnk / rate(m, n, k)``. Rule (explicit, listed in ``assumed`` when used):
  a dimension beyond the grid's largest measured size is timed as ``⌊d/d_max⌋`` blocks of
  ``d_max`` plus one remainder block (raised to the smallest measured size): a GEMM is separable
  along ``m`` and ``n`` (row / column blocks) and along ``k`` (split-K with accumulation), and the
  rate is saturated at the largest measured sizes. A non-zero dimension below the smallest measured
  size is timed at that size (explicit rule, listed: a GEMM is no slower with more rows or columns
  than the kernel's tile already pads to; an upper bound, e.g. gpt-oss's 32-expert router).
- **Attention** seconds = causal flash time at ``(S, h, d_qk)`` from the table, scaled by the
  FLOPs actually done: ``(d_qk + d_v)/(2·d_qk)`` (MLA's value width differs from the measured
  ``d_v = d_qk``), and for a sliding window ``w < S`` by the band's share of the causal work,
  ``2w/S − (w/S)²`` (assumed: the causal rate at the same ``S``). ``S`` above the table follows the
  curves' ``beyond_max_seq`` rule (``∝ S²``, listed). Where the profile has an ``attention_long``
  table for the exact variant (``d_qk``, ``d_v``, window, sinks: measured through the runtime's own
  kernel path at long ``S`` and few heads per rank), ``S`` at or above its shortest measured length is
  read from it instead (``long_attention_s``), with no width or band scaling.
- **Elementwise passes** (norms, activations, permutations, softmax) are memory-bound: bytes /
  the HBM stream rate, which is derived from the measured fused GPU AdamW curve (its largest-size
  marginal rate × ``HBM_BYTES_PER_ADAMW_PARAM`` = 28 B per parameter: it reads p, g, m, v and writes
  p, m, v, all fp32). A CPU profile (``gpu_name == "cpu"``) uses the declared host-memory bandwidth.
- **Host launch time** of one kernel-launching torch call (``host_op_s``): the smallest per-call
  time of the GEMM table, which times back-to-back ``torch.mm`` calls from a Python loop. On the
  H200 profile the 30 fastest grid points all take 11.6–12.1 µs while their FLOPs differ 30×: the
  host, not the GPU, sets that floor. (Where the smallest GEMM is GPU-bound the floor is an upper
  bound of the host's time.) Applying it to non-GEMM calls is an assumption, listed.
"""

from __future__ import annotations

import numpy as np

from planner.errors import ProfileGap
from planner.timing import curves as C
from planner.timing.lookups import Lookups, marginal_rate, nan_like, points_s  # noqa: F401 (re-exported)

HBM_BYTES_PER_ADAMW_PARAM = 28
"""Bytes the fused fp32 AdamW kernel moves per parameter (read p, g, m, v; write p, m, v)."""


# ------------------------------------------------------------------------------------------------
# rate tables (numpy: multilinear interpolation in log2 of every axis, without scipy, whose import
# alone costs ~0.5 s of the search's 2 s)
# ------------------------------------------------------------------------------------------------
_GRIDS: dict = {}


def _grid(table):
    hit = _GRIDS.get(id(table))
    if hit is None or hit[0] is not table:
        hit = (table, [np.log2(np.asarray(a, dtype=float)) for a in table.axes],
               np.asarray(table.flops_per_s, dtype=float))
        _GRIDS[id(table)] = hit
    return hit[1], hit[2]


def table_rate(table, name: str, *coords):
    """FLOP/s of ``table`` at ``coords``: multilinear interpolation in log2 of every axis (zeros read
    at the first grid point; ``ProfileGap`` outside an axis). Measured dips are kept (wave
    quantisation is not smoothed away)."""
    arrs = np.broadcast_arrays(*[np.asarray(c, dtype=float) for c in coords])
    arrs = [np.where(a == 0, pts[0], a) for a, pts in zip(arrs, table.axes)]
    for axis, pts, arr in zip(table.axis_names, table.axes, arrs):
        C._check_range(f"{name}.{axis}", arr, pts[0], pts[-1])
    grids, values = _grid(table)
    lo_idx, w_hi = [], []
    for g, a in zip(grids, arrs):
        x = np.log2(a)
        if len(g) == 1:
            lo_idx.append(np.zeros(x.shape, dtype=np.int64))
            w_hi.append(np.zeros(x.shape))
            continue
        i = np.clip(np.searchsorted(g, x, side="right") - 1, 0, len(g) - 2)
        lo_idx.append(i)
        w_hi.append((x - g[i]) / (g[i + 1] - g[i]))
    out = np.zeros(arrs[0].shape)
    for corner in range(1 << len(grids)):
        idx, w = [], 1.0
        for d in range(len(grids)):
            up = (corner >> d) & 1
            if up and len(grids[d]) == 1:
                w = 0.0
                break
            idx.append(lo_idx[d] + up)
            w = w * (w_hi[d] if up else 1.0 - w_hi[d])
        if np.all(np.asarray(w) == 0):
            continue
        out = out + w * values[tuple(idx)]
    return float(out) if out.ndim == 0 else out


def attention_time_s(table, name: str, seq_len, heads, head_dim, *, backward: bool):
    """Causal attention seconds for batch 1 from ``table``; above the largest measured ``S_max`` (explicit
    rule) ``t(S_max)·(S/S_max)²`` at the same heads and head_dim (the work grows as ``S²``, the kernel
    is saturated at ``S_max``)."""
    s = np.asarray(seq_len, dtype=float)
    s_max = table.axes[0][-1]
    C._check_range(f"{name}.seq_len", s[s != 0], table.axes[0][0], np.inf)
    s_eval = np.minimum(s, s_max)
    scale = np.maximum(s / s_max, 1.0) ** 2
    t = C.attention_flops(s_eval, heads, head_dim, backward=backward) / table_rate(table, name, s_eval, heads, head_dim)
    return t * scale


# ------------------------------------------------------------------------------------------------
# GEMM
# ------------------------------------------------------------------------------------------------
def gemm_table(lk: Lookups, dtype: str = "bf16"):
    """The rate table for ``dtype`` GEMMs: ``gemm`` (bf16, or fp32 in a CPU profile) or ``gemm_fp32``.

    Returns ``(name, table)``; ``table`` is None (a gap is recorded) when the profile lacks it.
    """
    cv = lk.curves
    if dtype == "fp32":
        if cv.gemm_fp32 is not None:
            return "gemm_fp32", cv.gemm_fp32
        if cv.gemm is not None and cv.gemm.dtype == "fp32":
            return "gemm", cv.gemm
        lk.gap(ProfileGap.missing("gemm_fp32", "run `python3 -m calibration.compute --fp32-gemm` and merge it"))
        return "gemm_fp32", None
    if cv.gemm is not None and cv.gemm.dtype != dtype and lk.topology.gpu_name != "cpu":
        lk.gap(ProfileGap(f"gemm.dtype={cv.gemm.dtype}", dtype, None, None, f"calibrate {dtype} GEMMs"))
        return "gemm", None
    if cv.gemm is None:
        lk.missing("gemm")
    return "gemm", cv.gemm


def _blocks(d, pts):
    """``(full size, full count, remainder size, remainder count)`` of one axis (module rule)."""
    lo, hi = float(pts[0]), float(pts[-1])
    d = np.asarray(d, dtype=float)
    big = d > hi
    q = np.where(big, np.floor(d / hi), 0.0)
    r = np.where(big, d - q * hi, d)
    full = np.where(big, hi, lo)
    rem = np.where(r > 0, np.maximum(r, lo), lo)
    return full, q, rem, np.where(r > 0, 1.0, 0.0)


def _note_gemm_rules(lk: Lookups, table, name: str, m, n, k) -> None:
    dims = [np.asarray(d) for d in (m, n, k)]
    if any(np.any((d > 0) & (d < pts[0])) for d, pts in zip(dims, table.axes)):
        lk.assume(f"{name}: dimensions below the smallest measured (m < {table.axes[0][0]}, n < "
                  f"{table.axes[1][0]}, k < {table.axes[2][0]}) timed at that size (upper bound)")
    if any(np.any(d > pts[-1]) for d, pts in zip(dims, table.axes)):
        lk.assume(f"{name}: dimensions beyond the measured grid (m > {table.axes[0][-1]}, "
                  f"n > {table.axes[1][-1]}, k > {table.axes[2][-1]}) timed as blocks of the largest "
                  "measured size (separable GEMM, saturated rate)")


def _blocked_gemm_s(table, name: str, m, n, k):
    axes = [_blocks(d, pts) for d, pts in zip((m, n, k), table.axes)]
    total = 0.0
    for sm, cm in ((axes[0][0], axes[0][1]), (axes[0][2], axes[0][3])):
        for sn, cn in ((axes[1][0], axes[1][1]), (axes[1][2], axes[1][3])):
            for sk, ck in ((axes[2][0], axes[2][1]), (axes[2][2], axes[2][3])):
                cnt = cm * cn * ck
                if not np.any(cnt > 0):
                    continue
                t = C.gemm_flops(sm, sn, sk) / table_rate(table, name, sm, sn, sk)
                total = total + np.where(cnt > 0, cnt * t, 0.0)
    return total


def gemm_s(lk: Lookups, m, n, k, *, dtype: str = "bf16"):
    """Seconds of ``C[m,n] = A[m,k] @ B[k,n]`` in ``dtype`` (module rule beyond the grid; 0 for
    zero work; NaN + gap below the grid or without a table)."""
    name, table = gemm_table(lk, dtype)
    if table is None:
        return nan_like(m, n, k)
    _note_gemm_rules(lk, table, name, m, n, k)
    return lk.call(lambda a, b, c: _blocked_gemm_s(table, name, a, b, c), m, n, k, memo=("gemm", table))


_HOST_OP: dict = {}
"""``id(table) → (table, seconds)``: the launch floor of a GEMM table (the table kept alive)."""


def host_op_s(lk: Lookups, dtype: str = "bf16") -> float:
    """Seconds of host time per kernel-launching torch call (module docstring); NaN with a gap."""
    name, table = gemm_table(lk, dtype)
    if table is None:
        return float("nan")
    hit = _HOST_OP.get(id(table))
    if hit is None or hit[0] is not table:
        m, n, k = np.meshgrid(*[np.asarray(a, dtype=float) for a in table.axes], indexing="ij")
        hit = (table, float(np.min(C.gemm_flops(m, n, k) / np.asarray(table.flops_per_s, dtype=float))))
        _HOST_OP[id(table)] = hit
    lk.assume(f"host time per kernel-launching torch call: {hit[1] * 1e6:.1f} µs, the {name} table's "
              "launch floor (its fastest per-call time), for every kernel; view calls free")
    return hit[1]


# ------------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------------
def attention_s(lk: Lookups, seq_len, heads, d_qk, d_v, *, window=None, backward: bool = False,
                sinks: bool = False):
    """Causal flash attention seconds for one sequence of ``seq_len`` with ``heads`` heads on the
    rank (forward, or backward with ``backward=True``); module rules for MLA widths, windows and
    ``S`` beyond the table. From the variant's ``attention_long`` table where it has one and ``S`` is
    at least its shortest measured ``S`` (``long_attention_s``)."""
    name = "attention_bwd" if backward else "attention_fwd"
    table = lk.required(name)
    s = np.asarray(seq_len, dtype=float)
    if table is None:
        return nan_like(s, heads)
    lt = long_table(lk, d_qk, d_v, window, sinks)
    use_long = (s >= lt.seq_len[0]) if lt is not None else np.zeros(s.shape, dtype=bool)
    s_gen = np.where(use_long, table.axes[0][0], s)
    # where the variant's own table times S, the generic table is not read: look it up at a measured
    # point there, so a head count beyond it records no gap that the result does not use
    h_gen = np.where(use_long, table.axes[1][0], heads) if lt is not None else heads
    if np.any(s_gen > table.axes[0][-1]):
        lk.assume(f"{name}: S above the measured {table.axes[0][-1]} timed as t(S_max)·(S/S_max)² "
                  "(beyond_max_seq rule)")

    def fn(S, h):
        return attention_time_s(table, name, S, h, d_qk, backward=backward)

    t = lk.call(fn, s_gen, h_gen, memo=(f"{name}:{d_qk}", table)) * (d_qk + d_v) / (2.0 * d_qk)
    if d_v != d_qk and not np.all(use_long):
        lk.assume(f"attention with d_v ({d_v}) != d_qk ({d_qk}): timed at head_dim {d_qk} scaled by "
                  "FLOPs (d_qk+d_v)/(2·d_qk)")
    if window:
        frac = np.minimum(1.0, window / np.maximum(s_gen, 1.0))
        if np.any((frac < 1) & ~use_long):
            lk.assume("sliding-window layers: the causal rate at the same S times the band's share "
                      "2w/S − (w/S)² of the causal work")
        t = t * frac * 2.0 - t * frac * frac  # causal band of width w: (2w/S − (w/S)²) of the causal work
    if lt is not None:
        t_long = long_attention_s(lk, lt, np.where(use_long, s, lt.seq_len[0]), heads, backward)
        if not np.all(use_long):   # below the table: the generic time × the variant's ratio at its shortest S
            s0 = np.full(np.shape(s_gen), float(lt.seq_len[0]))
            g0 = lk.call(fn, np.minimum(s0, table.axes[0][-1]), h_gen, memo=(f"{name}:{d_qk}", table)) * (
                d_qk + d_v) / (2.0 * d_qk) * (s0 / np.minimum(s0, table.axes[0][-1])) ** 2
            if window:
                f0 = np.minimum(1.0, window / s0)
                g0 = g0 * f0 * 2.0 - g0 * f0 * f0
            ratio = long_attention_s(lk, lt, s0, heads, backward) / g0
            lk.assume(f"attention_long.{lt.variant}: S below its shortest measured {lt.seq_len[0]} at the generic "
                      f"table's time × the variant's measured/generic ratio at S = {lt.seq_len[0]} "
                      "(its own kernel path, e.g. MLA's memory-efficient kernel)")
            t = t * ratio
        t = np.where(use_long, t_long, t)
        t = float(t) if np.ndim(t) == 0 else t
    return t


def long_table(lk: Lookups, d_qk, d_v, window, sinks):
    """The ``attention_long`` table of this variant (exact widths, window and sinks), or None."""
    for tab in (getattr(lk.curves, "attention_long", None) or {}).values():
        if (tab.d_qk, tab.d_v, tab.window or None, tab.sinks) == (d_qk, d_v, window or None, bool(sinks)):
            return tab
    return None


def long_attention_s(lk: Lookups, tab, seq_len, heads, backward: bool):
    """Seconds from a ``LongAttentionTable``: ``log t`` bilinear in ``(log S, log h)`` inside the grid;
    ``h`` above the largest measured heads at ``t(S, h_max)·h/h_max`` (the kernel's rate is saturated in
    heads at these ``S``; rule, listed); ``S`` above the longest measured at ``t(S_max)·(S/S_max)²``
    (``·S/S_max`` with a window; rule, listed)."""
    S = np.asarray(seq_len, dtype=float)
    h = np.broadcast_to(np.asarray(heads, dtype=float), np.broadcast(S, np.asarray(heads)).shape)
    S = np.broadcast_to(S, h.shape)
    xs, hs = np.log(np.asarray(tab.seq_len, dtype=float)), np.log(np.asarray(tab.heads, dtype=float))
    lt = np.log(np.asarray(tab.bwd_s if backward else tab.fwd_s, dtype=float))
    what = f"attention_long.{tab.variant} {'backward' if backward else 'forward'}"
    if np.any(h > tab.heads[-1]):
        lk.assume(f"{what}: heads per rank above the measured {tab.heads[-1]} at t(S, {tab.heads[-1]})·h/"
                  f"{tab.heads[-1]} (rate saturated in heads at S ≥ {tab.seq_len[0]})")
    if np.any(h < tab.heads[0]):
        lk.assume(f"{what}: heads per rank below the measured {tab.heads[0]} at t(S, {tab.heads[0]})·h/{tab.heads[0]}")
    if np.any(S > tab.seq_len[-1]):
        lk.assume(f"{what}: S above the measured {tab.seq_len[-1]} timed as t(S_max)·(S/S_max)"
                  + ("" if tab.window else "²") + " (beyond_max_seq rule)")
    hc = np.clip(h, tab.heads[0], tab.heads[-1])
    Sc = np.clip(S, tab.seq_len[0], tab.seq_len[-1])
    x, y = np.log(Sc), np.log(hc)

    def bracket(grid, v):
        if len(grid) == 1:
            return np.zeros(v.shape, dtype=np.int64), np.zeros(v.shape)
        i = np.clip(np.searchsorted(grid, v, side="right") - 1, 0, len(grid) - 2)
        return i, (v - grid[i]) / (grid[i + 1] - grid[i])

    i, wi = bracket(xs, x)
    j, wj = bracket(hs, y)
    i1, j1 = np.minimum(i + 1, len(xs) - 1), np.minimum(j + 1, len(hs) - 1)
    logt = ((1 - wi) * (1 - wj) * lt[i, j] + wi * (1 - wj) * lt[i1, j] + (1 - wi) * wj * lt[i, j1]
            + wi * wj * lt[i1, j1])
    t = np.exp(logt) * (h / hc) * (S / Sc) ** (1 if tab.window else 2)
    return float(t) if t.ndim == 0 else t


# ------------------------------------------------------------------------------------------------
# elementwise (memory-bound) passes
# ------------------------------------------------------------------------------------------------
def hbm_bytes_per_s(lk: Lookups) -> float:
    """Device memory stream rate for elementwise passes (module docstring); NaN with a gap."""
    cv = lk.curves
    if cv.gpu_adamw is not None:
        rate = HBM_BYTES_PER_ADAMW_PARAM * marginal_rate(cv.gpu_adamw.num_params, cv.gpu_adamw.time_s)
        lk.assume(f"elementwise passes at the HBM rate implied by the gpu_adamw curve "
                  f"({HBM_BYTES_PER_ADAMW_PARAM} B/param → {rate / 1e12:.2f} TB/s)")
        return rate
    if lk.topology.gpu_name == "cpu":
        lk.assume("elementwise passes at the declared host-memory bandwidth (CPU profile)")
        return float(lk.topology.host_mem_bw_bytes_per_s)
    lk.missing("gpu_adamw (HBM rate of elementwise passes)")
    return float("nan")


def elementwise_s(lk: Lookups, nbytes):
    """Seconds of memory-bound passes moving ``nbytes`` through device memory."""
    return np.asarray(nbytes, dtype=float) / hbm_bytes_per_s(lk)
