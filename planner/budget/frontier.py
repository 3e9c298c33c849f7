"""The fit frontier: largest context or batch that fits, by a whole-grid scan (DESIGN §3.4).

The peak is not monotone in ``S`` (``K``/``c_eff`` jump, Ring-DTP changes branch at ``N = V/P``,
SCO counts are floors), so bisection is wrong. The grid holds ``N`` in multiples of ``seq_step``
up to ``max_seq_len/D`` with ``D``, ``E_p`` and ``P`` fixed at their resolved values, and is
evaluated vectorised over the critical phases.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from planner.budget.build import make_context
from planner.budget.host import host_budget
from planner.budget.peak import capacity_bytes, evaluate
from planner.budget.work_bounds import TooCostly
from planner.context.resolve import resolve_plan
from planner.errors import InvalidPlan
from planner.schema import Plan, PlanFile
from planner.schema.base import MAX_TOKENS

CHUNK = 4096
"""Candidates evaluated per vectorised batch (bounds the scan's working memory)."""
MAX_GRID_POINTS = 1 << 18
"""Most grid points one scan evaluates (262,144: about a second and a half on one core)."""


@dataclass
class FrontierScan:
    """Verdict at every grid point."""

    values: np.ndarray
    """Grid values (``seq_len`` or ``seqs_per_microbatch``)."""
    tokens_per_rank: np.ndarray
    """``N`` at each grid point."""
    peak_bytes: np.ndarray
    """Device peak at each point."""
    host_bytes: np.ndarray
    """Host bytes per node at each point."""
    fits: np.ndarray
    """HBM and host verdict at each point."""
    capacity_bytes: int
    """Usable HBM per rank."""
    host_capacity_bytes: int
    """Usable host RAM per node."""
    plan: Plan
    """The resolved plan every grid point was evaluated with."""
    exact: np.ndarray | None = None
    """Where ``peak_bytes`` is exact; elsewhere it is the lower bound without the dispatch, which
    already fails there (``scan``'s pre-scan). ``None``: exact everywhere."""

    @property
    def best(self) -> int | None:
        """Largest grid value that fits (``None`` if none does)."""
        ok = np.nonzero(self.fits)[0]
        return int(self.values[ok[-1]]) if ok.size else None

    @property
    def first_fail(self) -> int | None:
        """Smallest grid value that does not fit."""
        bad = np.nonzero(~self.fits)[0]
        return int(self.values[bad[0]]) if bad.size else None


MIN_HEADROOM = 0.03
"""Default ``--min-headroom``: the fraction of the usable capacity a ranked plan leaves free. It
covers the formula's allowed error against measurement (up to 2% above, DESIGN §8) with margin,
so a plan chosen at the edge of the capacity does not OOM on a model error; the fragmentation
reserve is already subtracted from the capacity."""


def within_headroom(peak_bytes, capacity_bytes, min_headroom: float):
    """Whether ``peak_bytes`` leaves ``min_headroom`` of the usable capacity free (the rule of
    ``--min-headroom`` in every command; arrays broadcast)."""
    return peak_bytes <= capacity_bytes * (1.0 - min_headroom)


def seq_degree(plan: Plan) -> int:
    """The degree sharding each sequence of a resolved plan: ``D`` (Ulysses) composed, ``cp`` for
    the baseline."""
    return plan.composed.seq_parallel if plan.stack == "composed" else plan.baseline.cp


def scan(pf: PlanFile, axis: str, values: np.ndarray, min_headroom: float = MIN_HEADROOM, *,
         plan: Plan | None = None) -> FrontierScan:
    """Evaluate ``pf`` at each ``values`` of ``axis`` (``seq_len`` or ``seqs_per_microbatch``); a
    point fits when its peak leaves ``min_headroom`` of the usable capacity free (and the host fits).
    ``plan`` is ``pf``'s plan already resolved (``resolve_plan``; resolved here when ``None``).

    Where the whole grid's dispatch plans would be too costly (``TooCostly``: the FSDP2 baseline's
    EP, an expected bound), the grid is first evaluated with the dispatch left out
    (``Ctx.dispatch_left_out``, a lower bound of the peak): a point that fails on that bound fails,
    and only the others get their dispatch plan (``FrontierScan.exact``).

    Raises:
        TooCostly: even the points the lower bound leaves are too many to plan."""
    assert axis in ("seq_len", "seqs_per_microbatch"), axis
    workload = pf.workload.model_copy(update={"global_batch_tokens": None})
    if plan is None:
        plan = resolve_plan(pf.model, workload, pf.plan)
    values = np.asarray(values, dtype=np.int64)
    try:
        return _scan(pf, workload, plan, axis, values, min_headroom)
    except TooCostly:
        pass
    lower = _scan(pf, workload, plan, axis, values, min_headroom, dispatch_left_out=True)
    maybe = np.nonzero(lower.fits)[0]
    exact = np.zeros(len(values), dtype=bool)
    if maybe.size:
        sub = _scan(pf, workload, plan, axis, values[maybe], min_headroom)
        lower.peak_bytes[maybe], lower.fits[maybe] = sub.peak_bytes, sub.fits
        exact[maybe] = True
    lower.exact = exact
    return lower


def _scan(pf: PlanFile, workload, plan: Plan, axis: str, values: np.ndarray, min_headroom: float, *,
          dispatch_left_out: bool = False) -> FrontierScan:
    """``scan``'s evaluation of every point of ``values`` (``dispatch_left_out``: the lower bound)."""
    peaks, hosts, fits, tokens = [], [], [], []
    cap = host_cap = 0
    for lo in range(0, len(values), CHUNK):
        v = values[lo:lo + CHUNK]
        try:
            ctx = make_context(pf.model, pf.cluster, workload, plan, resolved=True, overrides={axis: v})
        except InvalidPlan as e:          # the grid's far end is too large to evaluate exactly
            if e.field != "workload.seq_len":
                raise
            flag = "--max-seq-len" if axis == "seq_len" else "--max-tokens"
            raise InvalidPlan(flag, int(v[-1]) if axis == "seq_len" else int(v[-1]) * workload.seq_len,
                              f"reaches a grid point that {e.problem}", f"lower {flag}") from None
        if dispatch_left_out:
            ctx = dataclasses.replace(ctx, dispatch_left_out=True)
        ev = evaluate(ctx, critical=True, per_term=False)
        host = host_budget(ctx)
        cap, host_cap = capacity_bytes(ctx), host.capacity_bytes
        peak = np.broadcast_to(ev.peak_bytes, v.shape)
        hb = np.broadcast_to(host.bytes, v.shape)
        peaks.append(peak)
        hosts.append(hb)
        fits.append(within_headroom(peak, cap, min_headroom) & (hb <= host_cap))
        tokens.append(np.broadcast_to(ctx.tokens_per_rank, v.shape))
    return FrontierScan(values, np.concatenate(tokens), np.concatenate(peaks).copy(),
                        np.concatenate(hosts), np.concatenate(fits).copy(), cap, host_cap, plan)


def seq_len_grid(pf: PlanFile, seq_step: int, max_seq_len: int, *, plan: Plan | None = None) -> np.ndarray:
    """``S = j·seq_step·D`` for ``j ≥ 1`` up to ``max_seq_len``: ``N = S/D`` runs over the multiples
    of ``seq_step`` (``D = seq_degree(plan)``; ``plan`` as for ``scan``)."""
    if plan is None:
        plan = resolve_plan(pf.model, pf.workload, pf.plan)
    step_s = seq_step * seq_degree(plan)
    if max_seq_len > MAX_TOKENS:
        raise InvalidPlan("--max-seq-len", max_seq_len, f"must be <= {MAX_TOKENS} (2^32 tokens)",
                          "lower --max-seq-len")
    n = max_seq_len // step_s
    if n < 1:
        raise InvalidPlan("--max-seq-len", max_seq_len, f"must be >= one grid step ({step_s})",
                          "raise --max-seq-len or lower --seq-step")
    if n > MAX_GRID_POINTS:
        raise InvalidPlan("--max-seq-len", max_seq_len,
                          f"over --seq-step·D ({step_s}) gives {n} grid points, must be <= {MAX_GRID_POINTS}",
                          f"raise --seq-step or lower --max-seq-len (at most {MAX_GRID_POINTS * step_s})")
    return step_s * np.arange(1, n + 1, dtype=np.int64)


def batch_grid(pf: PlanFile, max_tokens: int) -> np.ndarray:
    """Sequences per micro-batch ``1..max_tokens // S`` for ``max-batch``.

    Raises:
        InvalidPlan: ``max_tokens`` below one sequence (the smallest batch), or a grid too large.
    """
    S = pf.workload.seq_len
    if max_tokens < S:
        raise InvalidPlan("--max-tokens", max_tokens, f"must be >= --seq-len ({S}): one sequence per group is "
                          "the smallest batch", f"give --max-tokens {S} or more")
    n = max_tokens // S
    if n > MAX_GRID_POINTS or n * S > MAX_TOKENS:
        limit = min(MAX_GRID_POINTS, MAX_TOKENS // S)
        raise InvalidPlan("--max-tokens", max_tokens,
                          f"over --seq-len ({S}) gives {n} grid points, must be <= {limit} "
                          f"(at most {MAX_GRID_POINTS} points and 2^32 tokens per sequence group)",
                          f"lower --max-tokens to at most {limit * S}")
    return np.arange(1, n + 1, dtype=np.int64)
