"""Run the search: enumerate, evaluate memory then time, rank by step time (DESIGN §5).

The composed stack and the FSDP2 baseline are searched separately under the same routing
assumption; the result always carries the fastest baseline that fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from planner.schema import ClusterSpec, ModelSpec, Plan, Workload
from planner.search.evaluate import Evaluated, Tally, evaluate_group, group_plan
from planner.search.space import baseline_groups, composed_groups


@dataclass
class Candidate:
    """One ranked configuration."""

    plan: Plan
    """The resolved plan (numeric knobs filled in)."""
    step_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    peak_bytes: int
    host_bytes: int
    binding_phase: str
    breakdown: dict = field(default_factory=dict)


@dataclass
class SearchResult:
    """Top composed plans, the best baseline, and the tallies."""

    top: list[Candidate]
    baseline: Candidate | None
    tally: Tally
    baseline_tally: Tally
    gaps: list[str]
    assumed: list[str]


def _plan_of(ev: Evaluated, i: int) -> Plan:
    """Candidate ``i`` of a group as a plain plan (the SCO fraction becomes its budget in bytes)."""
    knobs = {k: int(v[i]) for k, v in ev.numeric.items()}
    if knobs.pop("sco_fraction_pct", None) is not None:
        knobs["sco_host_bytes"] = int(ev.sco_host_bytes[i])
    part = "composed" if ev.plan.stack == "composed" else "baseline"
    return ev.plan.model_copy(update={part: getattr(ev.plan, part).model_copy(update=knobs)})


def _candidates(evs: list[Evaluated], n: int) -> list[Candidate]:
    rows = []
    for ev in evs:
        for i in np.nonzero(np.isfinite(ev.step_s))[0]:
            rows.append((float(ev.step_s[i]), ev, int(i)))
    # Equal step times (knobs the time model does not see) rank the plan with more headroom first.
    rows.sort(key=lambda r: (round(r[0], 3), int(r[1].peak_bytes[r[2]])))
    out = []
    for step, ev, i in rows[:n]:
        st = ev.timing
        tok = float(np.broadcast_to(st.tokens_per_step, ev.step_s.shape)[i])
        fl = float(np.broadcast_to(st.model_flops, ev.step_s.shape)[i])
        out.append(Candidate(
            plan=_plan_of(ev, i), step_s=step, tokens_per_s_per_gpu=tok / step, tflops_per_gpu=fl / step / 1e12,
            peak_bytes=int(ev.peak_bytes[i]), host_bytes=int(ev.host_bytes[i]), binding_phase=ev.binding[i],
            breakdown={k: float(np.broadcast_to(v, ev.step_s.shape)[i]) for k, v in st.breakdown.items()}))
    return out


def search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, world_size: int,
           routing: str = "balanced", dispatch_bound: str = "guarantee", dtype: str = "bf16", top: int = 5,
           time_fn: Callable | None = None, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Search the composed space and the FSDP2 space; rank the fitting candidates by step time."""
    if time_fn is None:
        from planner.timing.step import step_time as time_fn
    groups = composed_groups(model, workload, world_size) + baseline_groups(model, workload, world_size)
    tally, btally = Tally(), Tally()
    comp, base, gaps, assumed = [], [], [], []
    for j, g in enumerate(groups):
        plan = group_plan(g, world_size, routing, dispatch_bound, dtype)
        t = tally if g.stack == "composed" else btally
        ev = evaluate_group(g, model, cluster, workload, plan, t, time_fn)
        if ev is not None:
            (comp if g.stack == "composed" else base).append(ev)
            gaps += [x for x in ev.timing.gaps if x not in gaps]
            assumed += [x for x in ev.timing.assumed if x not in assumed]
        if progress:
            progress(j + 1, len(groups))
    best_base = _candidates(base, 1)
    return SearchResult(_candidates(comp, top), best_base[0] if best_base else None, tally, btally, gaps, assumed)


def lowest_peak(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, world_size: int, stack: str,
                routing: str = "balanced", dispatch_bound: str = "guarantee", dtype: str = "bf16") -> tuple[Plan, int, int]:
    """Memory only: the legal candidate of ``stack`` with the lowest per-rank peak among those that fit
    the host (``(plan, peak_bytes, fitting_count)``); no time model. Answers "does anything fit, and
    how close is the best?" where the time model has gaps."""
    from planner.budget.build import make_context
    from planner.budget.host import host_budget
    from planner.budget.peak import capacity_bytes, evaluate
    from planner.budget.work_bounds import TooCostly
    from planner.errors import InvalidPlan

    groups = composed_groups(model, workload, world_size) if stack == "composed" else \
        baseline_groups(model, workload, world_size)
    best: tuple | None = None
    fitting = 0
    skipped = None
    for g in groups:
        plan = group_plan(g, world_size, routing, dispatch_bound, dtype)
        try:
            ctx = make_context(model, cluster, workload, plan, resolved=True, overrides=dict(g.numeric))
            peak = np.broadcast_to(evaluate(ctx, critical=True, per_term=False).peak_bytes, (g.size,))
        except InvalidPlan as e:  # past 2^58 B per rank, or too costly to plan: never the closest
            if not isinstance(e, TooCostly) and e.field != "workload.seq_len":
                raise
            skipped = skipped or e
            continue
        host = host_budget(ctx)
        ok_host = np.broadcast_to(host.bytes <= host.capacity_bytes, (g.size,))
        fitting += int(((peak <= capacity_bytes(ctx)) & ok_host).sum())
        cand = np.where(ok_host, peak, np.iinfo(np.int64).max)
        i = int(np.argmin(cand))
        if ok_host[i] and (best is None or cand[i] < best[0]):
            best = (int(cand[i]), g, plan, i)
    if best is None and skipped is not None:
        raise skipped
    assert best is not None, "no candidate fits the host"
    peak, g, plan, i = best
    knobs = {k: int(np.asarray(v)[i]) for k, v in g.numeric.items()}
    pct = knobs.pop("sco_fraction_pct", None)
    if pct is not None:
        ctx = make_context(model, cluster, workload, plan, resolved=True,
                           overrides={k: np.asarray(v)[i:i + 1] for k, v in g.numeric.items()})
        knobs["sco_host_bytes"] = int(np.asarray(ctx.sco_host_bytes).reshape(-1)[0])
    part = "composed" if stack == "composed" else "baseline"
    return plan.model_copy(update={part: getattr(plan, part).model_copy(update=knobs)}), peak, fitting
