"""Measured costs of the dispatch operators' kernels beyond the GEMM table: the profile's
``dispatch_kernels`` curve (``calibration.dispatch_kernels``, ``DispatchKernelsCurve``), DESIGN §4.

Legend: ``c`` a memory-bound kernel class (``DISPATCH_KERNEL_CLASSES``, plus ``other``), ``r`` rows of
one expert GEMM block, ``T`` seconds of continuous GEMM work.

- **Memory-bound classes**: bytes / (``vs_reference_c`` × ``compute.hbm_bytes_per_s``): the class's
  rate relative to a fused GPU AdamW timed in the same run, times the profile's HBM rate (derived
  from its own fused-AdamW curve), so the ratio, not the run's absolute clock, carries over.
  ``other`` (unmeasured kernels: int64 ``div``, the router's softmax …) and any class the curve
  lacks run at the HBM rate (assumed, listed). A class's ratio is measured at one size and one set
  of widths (``widths``) and used at all (assumed, listed: e.g. the bf16 ``index_add_``'s atomic
  contention depends on ``k``).
- **Transposed expert GEMMs** (backward ``g_down = h.t()@go``, ``gh = go@Wd.t()``, ``g_up =
  x.t()@ggu``, ``gx = ggu@Wu.t()``): the GEMM table's time × ``runtime_s / nn_s`` of the measured
  row of that role, piecewise-linear in ``log r`` between the measured rows; outside them the nearest
  measured ratio (rule, listed); at other widths ``H``/``I`` the ratio at the same ``r`` (listed).
  A row whose ``NN`` reference has ``k`` or ``n`` not a multiple of ``ALIGN_ELEMS`` is not used: its
  row-major operands are misaligned, so ``nn_s`` carries a misalignment penalty that neither the
  runtime's call nor the GEMM table (aligned grid) has (H200, 2026-11-29: ``nn_s`` at ``k`` = 3277
  and 410 is 5.1× and 2.4–2.5× the table's time, while ``runtime_s`` is 0.86–1.14× it).
- **Forward expert GEMMs** (``up = x@Wgu``, ``down = h@Wd``: the table's own layout): the table's
  time × the measured ``runtime_s / t_table`` of that role at the block rows, relative to the
  sustained GEMM's ``short_window_s / t_table`` (``forward_factor``), piecewise-linear in ``log r``
  between the measured rows, the nearest outside (rule, listed); × the sustained factor below, a
  block of ``r`` rows runs at its own measured ratio × the stream's drift. The sustained GEMM is
  the ``up`` GEMM at 32768 rows, where the run is 0.85× the table; at 3277 rows the runs' ``up``
  GEMMs are 0.97–1.07× the table at every measured width (H200, 2026-12-01): the table's error
  depends on the rows, so one ratio read at 32768 rows made every expert block of a few thousand
  rows (all of them at ``E_p = 1``) 10–20% fast. (Backward GEMMs keep the layout ratio × the one
  GEMM's sustained factor, listed: on real operands, shape B's EP/LLEP rows with filled receive
  buffers (``bench/results/dispatch_fill.json``) and at ``E_p = 1``, it is within 0–2% of the
  measured forward+backward, their runtime/table ratio at the block rows 3.7–6.2% slow. The unfilled
  emulated rows of shape B, 11% slow with either, read zero receive buffers, on which GEMMs run
  faster than on the random operands every calibration GEMM is timed on:
  ``tests/unit/test_heldout_timing.py``, ``FILLED_RERUN``.)
- **Sustained GEMMs**: a GEMM stream of ``T`` seconds runs at ``f(T)`` × the GEMM table's time.
  The curve's one GEMM (``sustained``: ``m, n, k``) is timed in the table's short windows and in a
  continuous run; both are read **relative to the table's own time at that GEMM** (the model's base):
  ``f = short_window_s / t_table`` up to the short window, ``continuous_s / t_table`` from the
  continuous run's length on, log-linear in ``T`` between (rule, listed). (The table and the curve
  come from different calibration runs: on the H200 profile the short-window time is 0.87× the
  table's and the continuous 0.99×, so reading ``continuous / short`` against the table, as if the
  table were the short-window rate, made every long expert stream 14% slow.) ``T`` is one forward +
  backward of the layer's expert GEMMs (the operator runs as repeated forward/backward calls, the
  GPU loaded throughout).
- **Host**: seconds per block of each runtime loop as measured (``host_loops``), and
  ``host_call_s`` for every other kernel-launching call. A loop that starts on an idle GPU (after
  a synchronising host→device copy) runs at the pace of the slower of host and GPU block by block,
  in the runtime's block order (``loop_exposed_s``): small blocks early in the loop leave the GPU
  waiting on the host even when the loop's GPU seconds exceed its host seconds.
- Without the curve (CPU profiles, older profiles): every class at the HBM rate, factors 1, and
  the GEMM table's launch floor per call (``compute.host_op_s``), listed.
"""

from __future__ import annotations

import numpy as np

from planner.timing.compute import gemm_s as table_gemm_s
from planner.timing.compute import hbm_bytes_per_s, host_op_s
from planner.timing import memory_sizes as sized
from planner.timing.lookups import Lookups

OTHER = "other"
"""Class of memory-bound kernels the curve does not time (HBM rate)."""
ALIGN_ELEMS = 8
"""16 B of bf16: ``NN`` references with ``k`` or ``n`` not a multiple of this are misaligned."""
ROWS_AXIS = {"g_down": "k", "gh": "m", "g_up": "k", "gx": "m"}
FORWARD_ROLES = ("up", "down")
"""Forward expert GEMMs (``flops.expert_fwd``'s order); their rows ``r`` are ``m``."""
"""Which GEMM dimension is the block's rows ``r`` for each transposed role (``flops.expert_bwd``)."""

LOOP_LAUNCH = {"grouped_fwd": 4, "grouped_bwd": 11, "chunk_fwd": 9, "chunk_recompute": 2, "chunk_bwd": 23}
"""Kernel-launching calls per block of each runtime loop (``dispatch_kernels`` module docstring)."""

_CACHE: dict = {}


class at_width:
    """``with at_width(lk, H, I, k):`` the dispatch-kernel curve of the layer's widths for every lookup
    of this module inside the block: the ``dispatch_kernels_widths`` curve measured at exactly
    ``(H, I, k)``, else the one nearest in ``|log H| + |log I| + |log k|`` (listed), else the
    profile's ``dispatch_kernels``."""

    def __init__(self, lk: Lookups, H: int, I: int, k: int) -> None:
        self.lk, self.key = lk, (int(H), int(I), int(k))

    def __enter__(self):
        self.prev = getattr(self.lk, "_dispatch_curve", None)
        self.lk._dispatch_curve = _select(self.lk, *self.key)
        return self.lk._dispatch_curve

    def __exit__(self, *exc):
        self.lk._dispatch_curve = self.prev


def _width(cv) -> tuple:
    w = cv.widths
    return (w.get("H"), w.get("I"), w.get("k"))


def _select(lk: Lookups, H: int, I: int, k: int):
    cvs = list(getattr(lk.curves, "dispatch_kernels_widths", None) or [])
    if not cvs:
        return getattr(lk.curves, "dispatch_kernels", None)
    for cv in cvs:
        if _width(cv) == (H, I, k):
            return cv

    def dist(cv):
        return sum(abs(np.log(a / b)) for a, b in zip(_width(cv), (H, I, k)) if a and b)
    best = min(cvs, key=dist)
    lk.assume(f"dispatch kernels at H={H}, I={I}, k={k}: no curve measured at these widths; the nearest measured "
              f"(H={best.widths.get('H')}, I={best.widths.get('I')}, k={best.widths.get('k')}) used")
    return best


def _cv(lk: Lookups):
    """The dispatch-kernel curve in use (``at_width``'s, else the profile's)."""
    cv = getattr(lk, "_dispatch_curve", None)
    return cv if cv is not None else getattr(lk.curves, "dispatch_kernels", None)


def curve(lk: Lookups):
    """The dispatch-kernel curve in use (``at_width``), or None (then the module's fallback, listed)."""
    cv = _cv(lk)
    if cv is None:
        lk.assume("no dispatch_kernels curve: dispatch memory-bound kernels at the HBM rate, backward GEMMs at "
                  "the NN table's rate, no sustained-clock factor, the GEMM table's launch floor per call")
    return cv


def class_rates(lk: Lookups) -> dict:
    """``{class: bytes/s}`` (module docstring); ``OTHER`` and unmeasured classes at the HBM rate."""
    hbm = hbm_bytes_per_s(lk)
    cv = curve(lk)
    if cv is None:
        return {}
    w = cv.widths
    lk.assume(f"dispatch memory-bound kernels by class at the measured rate relative to fused AdamW × the "
              f"profile's HBM rate ({hbm / 1e12:.2f} TB/s), measured at H={w.get('H')}, I={w.get('I')}, "
              f"k={w.get('k')}, {w.get('R')} routes (other sizes: planner.timing.memory_sizes); unmeasured kernels "
              "(int64 div, router softmax…) at the HBM rate")
    return {c: r.vs_reference * hbm for c, r in cv.memory.items()}


def memory_s(lk: Lookups, nbytes: dict):
    """Seconds of ``{class: bytes}`` (arrays) of memory-bound kernels, each class at its rate for the
    bytes of the call (``planner.timing.memory_sizes``: a phase's class bytes are one call's, or a
    few calls' of a class whose rate the sizes leave flat)."""
    rates = class_rates(lk)
    hbm = hbm_bytes_per_s(lk)
    cv = curve(lk)
    sized.note(lk)
    out = 0.0
    for c, v in nbytes.items():
        v = np.asarray(v, dtype=float)
        row = cv.memory.get(c) if cv is not None else None
        f = sized.factor(lk, c, v, row.model_bytes if row is not None else None)
        out = out + v / (rates.get(c, hbm) * f)
    return out


def _layout_points(cv, role: str):
    hit = _CACHE.get(("layout", id(cv), role))
    if hit is None or hit[0] is not cv:
        pts = sorted((getattr(g, ROWS_AXIS[role]), g.runtime_s / g.nn_s) for g in cv.gemm_layouts
                     if g.role == role and g.k % ALIGN_ELEMS == 0 and g.n % ALIGN_ELEMS == 0)
        hit = (cv, np.log([p[0] for p in pts]), np.array([p[1] for p in pts]))
        _CACHE[("layout", id(cv), role)] = hit
    return hit[1], hit[2]


def layout_factor(lk: Lookups, role: str, rows, H: int, I: int):
    """Runtime-layout time over the table's (``NN``) time of expert GEMM ``role`` at block rows
    ``rows`` (module docstring); 1 for forward roles or without the curve."""
    cv = _cv(lk)
    if cv is None or role not in ROWS_AXIS:
        return 1.0
    x, y = _layout_points(cv, role)
    if len(x) == 0:
        lk.assume(f"expert {role} GEMM: no aligned runtime-vs-NN row measured; at the NN table's rate")
        return 1.0
    r = np.asarray(rows, dtype=float)
    lk.assume("expert backward GEMMs (h.t()@go, go@Wd.t(), x.t()@ggu, ggu@Wu.t()): the NN table's time × the "
              "measured runtime/NN ratio of the role, log-linear in the block rows; misaligned NN references "
              f"(k or n % {ALIGN_ELEMS} ≠ 0) not used")
    rr = r[r > 0]
    if rr.size and (np.log(rr.min()) < x[0] - 1e-9 or np.log(rr.max()) > x[-1] + 1e-9):
        lk.assume("expert backward GEMMs at block rows outside the measured layout rows: the nearest measured "
                  "runtime/NN ratio")
    w = cv.widths
    if (w.get("H"), w.get("I")) != (H, I):
        lk.assume(f"expert backward GEMM layout ratios measured at H={w.get('H')}, I={w.get('I')} used at "
                  f"H={H}, I={I} (same block rows)")
    return np.interp(np.log(np.maximum(r, 1.0)), x, y)


def _forward_points(lk: Lookups, cv, role: str):
    key = ("forward", id(cv), id(lk.curves), role)
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not cv:
        pts = sorted((g.m, g.runtime_s / float(table_gemm_s(lk, g.m, g.n, g.k))) for g in cv.gemm_layouts
                     if g.role == role)
        hit = (cv, np.log([p[0] for p in pts]), np.array([p[1] for p in pts]))
        _CACHE[key] = hit
    return hit[1], hit[2]


def forward_factor(lk: Lookups, role: str, rows):
    """Measured time over the table's of forward expert GEMM ``role`` (``up``/``down``) at block
    rows ``rows``, relative to the sustained GEMM's short-window ratio (module docstring); 1
    without the curve, or where the curve has no row of that role."""
    cv = _cv(lk)
    if cv is None or role not in FORWARD_ROLES:
        return 1.0
    x, y = _forward_points(lk, cv, role)
    if len(x) == 0:
        lk.assume(f"expert {role} GEMM: no runtime row measured; at the sustained factor of one GEMM")
        return 1.0
    s = cv.sustained
    f0 = s.short_window_s / float(table_gemm_s(lk, s.m, s.n, s.k))
    r = np.asarray(rows, dtype=float)
    lk.assume("expert forward GEMMs (x@Wgu, h@Wd): the table's time × the measured runtime/table ratio of the "
              "role at the block rows (log-linear between the measured rows, the nearest outside), relative to "
              f"the sustained GEMM's short-window ratio {f0:.3f}; backward GEMMs: the layout ratio × the one "
              "GEMM's sustained factor (their runtime/table ratio at the rows is not used: with it shape B's "
              "backward on real receive-buffer data is 3.7-6.2% slow, without it within 0-2%)")
    return np.interp(np.log(np.maximum(r, 1.0)), x, y) / f0


def sustained_factor(lk: Lookups, gemm_s):
    """``f(T)`` for ``T = gemm_s`` seconds of continuous GEMM work: the table's time × ``f`` (module
    docstring)."""
    cv = _cv(lk)
    if cv is None:
        return 1.0
    s = cv.sustained
    table = float(table_gemm_s(lk, s.m, s.n, s.k))
    f0, f = s.short_window_s / table, s.continuous_s / table
    lo, hi = np.log(s.short_window_len_s), np.log(s.continuous_len_s)
    lk.assume(f"expert GEMMs under sustained load: the table's time × f(T), T = one forward+backward of the layer's "
              f"expert GEMMs; f = {f0:.3f} up to {s.short_window_len_s * 1e3:g} ms, {f:.3f} from "
              f"{s.continuous_len_s:g} s on (the measured short-window and continuous times of one "
              f"{s.m}×{s.n}×{s.k} GEMM over the table's time of it, measured in another run), log-linear in T between")
    T = np.maximum(np.asarray(gemm_s, dtype=float), 1e-12)
    x = np.clip((np.log(T) - lo) / (hi - lo), 0.0, 1.0)
    return f0 + (f - f0) * x


def block_host_s(lk: Lookups, loop: str) -> float:
    """Host seconds of one block of the runtime loop ``loop`` (``host_loops``; unmeasured: its
    launching calls at ``host_call_s``, without the curve at the GEMM table's launch floor)."""
    cv = curve(lk)
    if cv is None:
        return LOOP_LAUNCH[loop] * float(host_op_s(lk))
    got = cv.host_loops.get(loop)
    return float(got.s_per_block) if got is not None else LOOP_LAUNCH[loop] * cv.host_call_s


def loop_exposed_s(h: float, g, c):
    """Host seconds a block loop leaves the GPU idle, the loop starting on an idle GPU (after a
    synchronising host→device copy): blocks in runtime order, ``c`` identical blocks of ``g`` GPU
    seconds per item (last axis), ``h`` host seconds per block. The GPU starts block ``j`` only
    once the host has issued it, so the loop takes ``max_j (H_<j + G_≥j)`` (``H_<j`` the host
    seconds before block ``j``, ``G_≥j`` the GPU seconds from it on), at least the host's total;
    within a run of identical blocks the maximum is at its first or its last block."""
    g, c = np.broadcast_arrays(np.asarray(g, dtype=float), np.asarray(c, dtype=float))
    gc = g * c
    h_before = np.cumsum(c * h, axis=-1) - c * h
    g_from = np.flip(np.cumsum(np.flip(gc, -1), axis=-1), -1)
    first = h_before + g_from
    last = np.where(c > 0, first + (c - 1) * (h - g), -np.inf)
    total_g, total_h = gc.sum(-1), (c * h).sum(-1)
    span = np.maximum(np.maximum(first.max(-1), last.max(-1)), total_h)
    return np.maximum(0.0, span - total_g)


def host_s(lk: Lookups, calls, blocks: dict):
    """Host seconds of ``calls`` kernel-launching calls outside the block loops plus ``{loop: blocks}``."""
    cv = curve(lk)
    if cv is None:
        call = host_op_s(lk)
        return (np.asarray(calls, dtype=float)
                + sum(LOOP_LAUNCH[lp] * np.asarray(n, dtype=float) for lp, n in blocks.items())) * call
    lk.assume(f"dispatch host time: measured seconds per block of each runtime loop, {cv.host_call_s * 1e6:.1f} µs "
              "(a tiny torch.mm loop) per other kernel-launching call; view and allocation calls free")
    out = np.asarray(calls, dtype=float) * cv.host_call_s
    for lp, n in blocks.items():
        loop = cv.host_loops.get(lp)
        if loop is None:
            lk.assume(f"host loop {lp} not measured: {cv.host_call_s * 1e6:.1f} µs per launching call")
            out = out + np.asarray(n, dtype=float) * LOOP_LAUNCH[lp] * cv.host_call_s
        else:
            out = out + np.asarray(n, dtype=float) * loop.s_per_block
    return out
