"""Curve lookups of one evaluation, vectorised over the search candidates (DESIGN §4).

- ``Lookups`` holds one evaluation's curves, the ``ProfileGap`` messages that made entries NaN (or
  raises them, ``strict``), and the assumed rules used. ``Lookups.call`` evaluates a lookup once
  per unique shape (``np.unique`` per column, combined) and maps the result back; with ``memo``
  the results are also kept across evaluations (the search evaluates one candidate group at a
  time, and the groups share most shapes).
- **Measured points** (``points_s``: copies, collectives, the GPU AdamW step): inside the measured
  sizes the measured medians are interpolated piecewise-linearly in log-log (times made
  non-decreasing first); above the largest size the last segment's marginal rate continues
  (explicit rule, listed in ``assumed``); below the smallest size it is a gap. The profile's
  latency-bandwidth fit is not used for times: on the H200 profile its relative residual reaches
  22–36% (the copies' ~100 µs small-size overhead pulls α), and at 4 GiB it is 10% fast on the
  bidirectional copy and 14% fast on the 268M-parameter AdamW step.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from planner.errors import ProfileGap
from planner.timing import curves as C

_MEMO: dict = {}
"""``(tag, id(owner)) → (owner, {row: seconds})``: lookups kept across evaluations (owner kept
alive so that its id stays unique)."""
_MEMO_MAX_ROWS = 200_000


def shared_memo(key) -> dict:
    """The ``{row: value}`` memo of ``key = (tag, owner)`` (``owner``: the curve the values depend
    on); bounded in entries and rows."""
    tag, owner = key
    hit = _MEMO.get((tag, id(owner)))
    if hit is None or hit[0] is not owner:
        if len(_MEMO) > 64:
            _MEMO.clear()
        hit = (owner, {})
        _MEMO[(tag, id(owner))] = hit
    if len(hit[1]) > _MEMO_MAX_ROWS:
        hit[1].clear()
    return hit[1]


def _unique_rows(cols: list) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows of equal-length columns and the inverse map (column-wise ``np.unique`` combined
    into one integer code: much faster than ``np.unique(axis=0)``)."""
    n = cols[0].shape[0]
    if n <= 1:
        return np.stack(cols, axis=1), np.zeros(n, dtype=np.int64)
    code = np.zeros(n, dtype=np.int64)
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        code = code * len(u) + inv.reshape(-1)
        if code.max(initial=0) > (1 << 40):      # re-rank to keep the mixed-radix code small
            code = np.unique(code, return_inverse=True)[1].reshape(-1)
    ucode, first, inv = np.unique(code, return_index=True, return_inverse=True)
    return np.stack([c[first] for c in cols], axis=1), inv.reshape(-1)


class Lookups:
    """Curve lookups of one evaluation (see the module docstring).

    Args:
        cluster: the ``ClusterSpec`` whose curves and topology are read.
        strict: raise ``ProfileGap`` instead of returning NaN.
    """

    def __init__(self, cluster, *, strict: bool = False) -> None:
        self.cluster = cluster
        self.curves = cluster.curves
        self.topology = cluster.topology
        self.strict = strict
        self.gaps: list[str] = []
        self._assumed: dict[str, None] = {}
        self.recorders: list[list[str]] = []
        """Active lists that also receive every ``assume`` (to cache a result with its notes)."""

    # ---- bookkeeping ----------------------------------------------------------------------------
    @property
    def assumed(self) -> list[str]:
        """Assumed constants and rules used so far, in first-use order."""
        return list(self._assumed)

    def assume(self, text: str) -> None:
        """Record an assumed constant or rule that a result depends on."""
        self._assumed.setdefault(text, None)
        for rec in self.recorders:
            rec.append(text)

    def gap(self, err: ProfileGap) -> None:
        """Record a gap (or raise it when strict)."""
        if self.strict:
            raise err
        msg = str(err)
        if msg not in self.gaps:
            self.gaps.append(msg)

    def call(self, fn: Callable, *args, memo=None):
        """``fn(*columns)`` over the unique rows of the broadcast ``args``; NaN where it raises
        ``ProfileGap`` (recorded). Returns an array of the broadcast shape (a float for scalars).

        ``memo``: ``(tag, owner)`` to keep successful results across evaluations (the search calls
        this once per candidate group); ``fn`` must then be a pure function of its arguments and
        ``owner`` (a curve), and record nothing in ``assumed``.
        """
        arrs = np.broadcast_arrays(*[np.asarray(a, dtype=float) for a in args])
        shape = arrs[0].shape
        uniq, inv = _unique_rows([a.reshape(-1) for a in arrs])
        out = np.empty(uniq.shape[0])
        todo = np.ones(uniq.shape[0], dtype=bool)
        cache = shared_memo(memo) if memo is not None else None
        if cache is not None:
            rows = [tuple(r) for r in uniq.tolist()]
            for i, r in enumerate(rows):
                hit = cache.get(r)
                if hit is not None:
                    out[i], todo[i] = hit, False
        if todo.any():
            sub = uniq[todo]
            try:
                got = np.broadcast_to(np.asarray(fn(*sub.T), dtype=float), (sub.shape[0],)).copy()
            except ProfileGap:
                if self.strict:
                    raise
                got = np.empty(sub.shape[0])
                for i, row in enumerate(sub):
                    try:
                        got[i] = float(fn(*[np.asarray(v) for v in row]))
                    except ProfileGap as e:
                        self.gap(e)
                        got[i] = np.nan
            out[todo] = got
            if cache is not None:
                for i, v in zip(np.flatnonzero(todo).tolist(), got.tolist()):
                    if np.isfinite(v):
                        cache[rows[i]] = v
        res = out[inv].reshape(shape)
        return float(res) if res.ndim == 0 else res

    def missing(self, name: str) -> None:
        """Record the gap of a curve the profile lacks (its fix names a GPU for a CPU profile)."""
        self.gap(ProfileGap.missing(name, C.missing_curve_fix(self.topology.gpu_name)))

    def required(self, name: str):
        """The curve ``name`` of the profile, or a gap (NaN) when it is missing."""
        curve = getattr(self.curves, name, None)
        if curve is None:
            self.missing(name)
        return curve


def nan_like(*arrays):
    """NaN of the broadcast shape of ``arrays`` (a float for scalars)."""
    shape = np.broadcast(*[np.asarray(a) for a in arrays]).shape
    return float("nan") if shape == () else np.full(shape, np.nan)


# ------------------------------------------------------------------------------------------------
# measured points (copies, collectives, optimizer steps)
# ------------------------------------------------------------------------------------------------
def _points_eval(name: str, xs, ts, x):
    xs = np.asarray(xs, dtype=float)
    ts = np.maximum.accumulate(np.asarray(ts, dtype=float))
    x = np.asarray(x, dtype=float)
    C._check_range(name, x[x != 0], xs[0], np.inf)
    inside = np.exp(np.interp(np.log(np.clip(x, xs[0], xs[-1])), np.log(xs), np.log(ts)))
    slope = (xs[-1] - xs[-2]) / max(ts[-1] - ts[-2], 1e-30)
    beyond = ts[-1] + (x - xs[-1]) / slope
    return np.where(x == 0, 0.0, np.where(x > xs[-1], beyond, inside))


def marginal_rate(xs, ts) -> float:
    """Units per second of the last measured segment (the large-size rate)."""
    ts = np.maximum.accumulate(np.asarray(ts, dtype=float))
    return float((xs[-1] - xs[-2]) / max(ts[-1] - ts[-2], 1e-30))


def points_s(lk: Lookups, name: str, xs, ts, x):
    """Seconds at sizes ``x`` from measured ``(xs, ts)`` (module rule; NaN + gap below ``xs[0]``)."""
    if np.any(np.asarray(x, dtype=float) > xs[-1]):
        lk.assume(f"{name}: sizes above the measured {xs[-1]:.4g} at the last segment's marginal rate "
                  f"({marginal_rate(xs, ts):.4g}/s)")
    return lk.call(lambda v: _points_eval(name, xs, ts, v), x)
