"""Evaluate candidates: memory first (vectorised, critical phases), then time for those that fit.

Rejections are tallied by reason (STYLE §8): over HBM in a named phase, over host RAM, or a time
model gap (a curve outside its measured range).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from planner.budget.build import make_context
from planner.budget.frontier import within_headroom
from planner.budget.host import host_budget
from planner.budget.peak import capacity_bytes, evaluate
from planner.budget.work_bounds import TooCostly
from planner.context.derive import global_batch_divides
from planner.errors import InvalidPlan
from planner.schema import ClusterSpec, ModelSpec, Plan, Workload
from planner.search.space import Group
from planner.units import fmt_share, plural


class Rejection(str, Enum):
    """Why a legal candidate was not ranked."""

    OVER_HBM = "over HBM"
    """Its per-rank device peak exceeds the usable capacity (the phase is named in the tally)."""
    OVER_HOST = "over host RAM"
    """It fits the HBM but not the node's host RAM."""
    PROFILE_GAP = "time model gap"
    """It fits, but a calibrated curve does not cover one of its shapes (never extrapolated)."""


@dataclass
class Evaluated:
    """The fitting candidates of one group with their memory and time."""

    group: Group
    plan: Plan
    numeric: dict
    """Knob → array over the fitting candidates."""
    peak_bytes: np.ndarray
    host_bytes: np.ndarray
    step_s: np.ndarray
    tokens_per_rank: np.ndarray
    binding: list[str]
    """Binding phase label of each fitting candidate."""
    timing: object = None
    """The ``planner.timing.step.StepTime`` of the fitting candidates."""
    sco_host_bytes: np.ndarray | None = None
    """Resolved SCO budget of each fitting candidate (physical pinned bytes per rank)."""


@dataclass
class Tally:
    """Counts of candidates by outcome."""

    evaluated: int = 0
    fit: int = 0
    reasons: Counter = field(default_factory=Counter)

    def add(self, reason: str, n: int) -> None:
        if n:
            self.reasons[reason] += int(n)

    def text(self) -> str:
        parts = [plural(self.evaluated, "candidate", grouped=False), f"{self.fit} fit"]
        parts += [f"{n} {r}" for r, n in self.reasons.most_common()]
        return ", ".join(parts)


def group_plan(group: Group, W: int, routing: str, dispatch_bound: str, dtype: str) -> Plan:
    """The scalar part of a group's plan (numeric knobs come as overrides)."""
    base = dict(world_size=W, routing=routing, dispatch_bound=dispatch_bound, dtype=dtype, stack=group.stack)
    if group.stack == "composed":
        base["composed"] = group.choices
    else:
        base["baseline"] = group.choices
    return Plan.model_validate(base)


BATCH_REJECTION = "global batch not a whole number of micro-steps of W·N tokens (--global-batch-tokens)"
"""Why a candidate whose ``W·N`` does not divide the global batch is dropped."""


def evaluate_group(group: Group, model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan,
                   tally: Tally, time_fn, min_headroom: float = 0.0) -> Evaluated | None:
    """Memory for every candidate of ``group``; time (``time_fn(ctx)``) for those that fit and
    leave at least ``min_headroom`` of the usable capacity free."""
    try:
        ctx = make_context(model, cluster, workload, plan, resolved=True, overrides=dict(group.numeric))
    except InvalidPlan as e:     # N this large is past 2^58 B per rank: far over any HBM, not bad input
        if e.field not in ("workload.seq_len", "workload.global_batch_tokens"):
            raise
        tally.evaluated += group.size
        tally.add(f"{Rejection.OVER_HBM.value} (per-rank bytes past 2^58)" if e.field == "workload.seq_len"
                  else BATCH_REJECTION, group.size)
        return None
    try:
        ev = evaluate(ctx, critical=True, per_term=False)
    except TooCostly:            # a routing-profile dispatch plan too costly to build at this E_p
        tally.evaluated += group.size
        tally.add("not sized (dispatch plan on the routing profile too costly at this E_p)", group.size)
        return None
    host = host_budget(ctx)
    n = group.size
    peak = np.broadcast_to(ev.peak_bytes, (n,))
    hb = np.broadcast_to(host.bytes, (n,))
    cap = capacity_bytes(ctx)
    batch = np.broadcast_to(global_batch_divides(workload, plan.world_size, ctx.tokens_per_rank), (n,))
    over_hbm = batch & (peak > cap)
    over_host = batch & ~over_hbm & (hb > host.capacity_bytes)
    short = batch & ~over_hbm & ~over_host & ~within_headroom(peak, cap, min_headroom)
    tally.evaluated += n
    tally.add(BATCH_REJECTION, int((~batch).sum()))
    bind = np.broadcast_to(ev.binding_index, (n,))
    idx, counts = np.unique(bind[over_hbm], return_counts=True)
    for i, c in zip(idx, counts):
        tally.add(f"{Rejection.OVER_HBM.value} in {ev.phases[int(i)].label}", int(c))
    tally.add(Rejection.OVER_HOST.value, int(over_host.sum()))
    if short.any():
        tally.add(f"under {fmt_share(min_headroom)} headroom (--min-headroom)", int(short.sum()))
    ok = batch & ~over_hbm & ~over_host & ~short
    if not ok.any():
        return None
    numeric = {k: np.asarray(v)[ok] for k, v in group.numeric.items()}
    sub = make_context(model, cluster, workload, plan, resolved=True, overrides=dict(numeric))
    st = time_fn(sub)
    step = np.broadcast_to(np.asarray(st.total_s, dtype=float), (int(ok.sum()),))
    gap = ~np.isfinite(step)
    tally.add(Rejection.PROFILE_GAP.value, int(gap.sum()))
    tally.fit += int(ok.sum())
    return Evaluated(group, plan, numeric, peak[ok], hb[ok], step,
                     np.broadcast_to(sub.tokens_per_rank, step.shape),
                     [ev.phases[int(i)].label for i in bind[ok]], st,
                     np.broadcast_to(np.asarray(sub.sco_host_bytes, dtype=np.int64), step.shape))

