"""Run the search: enumerate, evaluate memory then time, rank by time per token (DESIGN §5).

DESIGN §4 ranks by predicted step time, which assumes every plan's step trains the same tokens.
Without ``--global-batch-tokens`` a step is one micro-step of ``W/D`` (composed) or ``W/(tp·cp)``
(FSDP2) sequences, so plans differ in tokens per step; the rank is then by seconds per token per
GPU (``step_s / tokens_per_step``), which orders plans exactly as step time does when the tokens
per step are equal.

The composed stack and the FSDP2 baseline are searched separately under the same routing
assumption; the result always carries the fastest baseline that fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from planner.budget.frontier import MIN_HEADROOM, within_headroom
from planner.plans.routing import launch_time_bound, with_routing
from planner.schema import ClusterSpec, ModelSpec, Plan, Workload
from planner.search.evaluate import Evaluated, Tally, evaluate_group, group_plan
from planner.search.space import baseline_groups, composed_groups
from planner.schema.knobs import default as knob_default


@dataclass
class Candidate:
    """One ranked configuration."""

    plan: Plan
    """The resolved plan (numeric knobs filled in)."""
    step_s: float
    tokens_per_step_per_rank: float
    """Distinct tokens per rank per optimizer step (plans differ in it without
    ``--global-batch-tokens``)."""
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    peak_bytes: int
    host_bytes: int
    binding_phase: str
    breakdown: dict = field(default_factory=dict)
    components: dict = field(default_factory=dict)
    """``StepTime.components``: compute, attention, recompute, optimizer, copies, communication."""

    @property
    def tokens_per_step(self) -> int:
        """Distinct tokens the whole job trains per optimizer step (``W`` ranks)."""
        return round(self.tokens_per_step_per_rank * self.plan.world_size)


@dataclass
class SearchResult:
    """Top composed plans, the best baseline, and the tallies."""

    top: list[Candidate]
    baseline: Candidate | None
    tally: Tally
    baseline_tally: Tally
    gaps: list[str]
    assumed: list[str]

    @property
    def speedup(self) -> float | None:
        """The first composed plan's tokens/s/GPU over the FSDP2 baseline's (the step-time ratio when
        both steps train the same tokens); None unless both stacks have a plan."""
        if not (self.top and self.baseline):
            return None
        return self.top[0].tokens_per_s_per_gpu / self.baseline.tokens_per_s_per_gpu


def _plan_of(ev: Evaluated, i: int) -> Plan:
    """Candidate ``i`` of a group as a plain plan (the SCO fraction becomes its budget in bytes)."""
    knobs = {k: int(v[i]) for k, v in ev.numeric.items()}
    if knobs.pop("sco_fraction_pct", None) is not None:
        knobs["sco_host_bytes"] = int(ev.sco_host_bytes[i])
    part = "composed" if ev.plan.stack == "composed" else "baseline"
    return ev.plan.model_copy(update={part: getattr(ev.plan, part).model_copy(update=knobs)})


def bounded_dispatch(plan: Plan) -> bool:
    """Whether the plan's verdict holds for every routing: a launch-time bound
    (``plans.routing.launch_time_bound``), or any operator sized under ``worst`` routing."""
    return plan.routing == "worst" or launch_time_bound(plan)



def _rows(evs: list[Evaluated]) -> list[tuple]:
    """``(s_per_token, peak, host, choices, knobs, ev, i)`` for every timed candidate of ``evs``:
    ``s_per_token`` is the predicted step's seconds per token per GPU (``step_s / tokens_per_step``,
    module docstring)."""
    rows = []
    for ev in evs:
        names = sorted(ev.numeric)
        choices = tuple(str(v) for _, v in sorted(ev.group.choices.items()))
        tokens = np.broadcast_to(ev.timing.tokens_per_step, ev.step_s.shape)
        for i in np.nonzero(np.isfinite(ev.step_s))[0]:
            i = int(i)
            knobs = tuple(int(ev.numeric[k][i]) for k in names)
            rows.append((float(ev.step_s[i]) / float(tokens[i]), int(ev.peak_bytes[i]), int(ev.host_bytes[i]),
                         choices, knobs, ev, i))
    return rows


def rank_key(row: tuple) -> tuple:
    """The ranking: plans whose dispatch has a launch-time bound first (``bounded_dispatch``: standard
    EP and LLEP's routed batch are sized by the routing assumption, DESIGN §3.2); then predicted
    seconds per token (the step time when every plan's step trains the same tokens), exactly; ties go to the lower per-rank HBM peak, then the lower host bytes, then the
    lexicographically smaller plan (categorical choices, then the numeric knobs in name order)."""
    return (row[5] is not None and not bounded_dispatch(row[5].plan), *row[:5])


def collapse(rows: list[tuple]) -> list[tuple]:
    """Keep one representative of each class of equivalent candidates, in rank order.

    Two candidates are equivalent when they make the same categorical choices and have the same
    predicted seconds per token and the same per-rank HBM peak: the numeric knobs in which they differ
    (typically the SCO host budget beyond what changes the offloaded count, or ``B_v``/``β`` where
    they do not change the binding phase) changed neither number, so the model does not tell them
    apart. The representative is the first in ``rank_key`` order: the one with the least host
    memory, then the lexicographically smallest knobs."""
    seen, out = set(), []
    for r in sorted(rows, key=rank_key):
        cls = (r[3], r[0], r[1])
        if cls not in seen:
            seen.add(cls)
            out.append(r)
    return out


def _candidates(evs: list[Evaluated], n: int) -> list[Candidate]:
    out = []
    for _, peak, host, _, _, ev, i in collapse(_rows(evs))[:n]:
        st = ev.timing
        step = float(ev.step_s[i])
        tok = float(np.broadcast_to(st.tokens_per_step, ev.step_s.shape)[i])
        fl = float(np.broadcast_to(st.model_flops, ev.step_s.shape)[i])
        out.append(Candidate(
            plan=_plan_of(ev, i), step_s=step, tokens_per_step_per_rank=tok, tokens_per_s_per_gpu=tok / step, tflops_per_gpu=fl / step / 1e12,
            peak_bytes=peak, host_bytes=host, binding_phase=ev.binding[i],
            breakdown={k: float(np.broadcast_to(v, ev.step_s.shape)[i]) for k, v in st.breakdown.items()},
            components={k: float(np.broadcast_to(v, ev.step_s.shape)[i]) for k, v in st.components.items()}))
    return out


def search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, world_size: int,
           routing: str | None = knob_default("routing"), dispatch_bound: str = knob_default("dispatch_bound"), dtype: str = knob_default("dtype"), top: int = 5,
           time_fn: Callable | None = None, progress: Callable[[int, int], None] | None = None,
           min_headroom: float = MIN_HEADROOM) -> SearchResult:
    """Search the composed space and the FSDP2 space; rank the fitting candidates by time per token."""
    if time_fn is None:
        from planner.timing.step import step_time as time_fn
    groups = composed_groups(model, workload, world_size) + baseline_groups(model, workload, world_size)
    tally, btally = Tally(), Tally()
    comp, base, gaps, assumed = [], [], [], []
    for j, g in enumerate(groups):
        plan = with_routing(model, group_plan(g, world_size, routing, dispatch_bound, dtype))
        t = tally if g.stack == "composed" else btally
        ev = evaluate_group(g, model, cluster, workload, plan, t, time_fn, min_headroom)
        if ev is not None:
            (comp if g.stack == "composed" else base).append(ev)
            gaps += [x for x in ev.timing.gaps if x not in gaps]
            assumed += [x for x in ev.timing.assumed if x not in assumed]
        if progress:
            progress(j + 1, len(groups))
    best_base = _candidates(base, 1)
    return SearchResult(_candidates(comp, top), best_base[0] if best_base else None, tally, btally, gaps, assumed)


def lowest_peak(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, world_size: int, stack: str,
                routing: str | None = knob_default("routing"), dispatch_bound: str = knob_default("dispatch_bound"), dtype: str = knob_default("dtype"),
                host_fallback: bool = False, min_headroom: float = 0.0) -> tuple[Plan, int, int]:
    """Memory only: the legal candidate of ``stack`` with the lowest per-rank peak among those that fit
    the host (``(plan, peak_bytes, fitting_count)``); no time model. Answers "does anything fit, and
    how close is the best?" where the time model has gaps. ``fitting_count`` counts the candidates
    that fit the host and leave ``min_headroom`` of the usable capacity free, as ``search`` does
    (0: the bare capacity, ``check``'s verdict); the lowest-peak plan is the same for any headroom.
    With ``host_fallback``, when no candidate fits the host, the one with the least host bytes
    stands in.

    Raises:
        Infeasible: no candidate fits the host (none is legal at all, with ``host_fallback``)."""
    from planner.budget.build import make_context
    from planner.budget.host import host_budget
    from planner.budget.peak import capacity_bytes, evaluate
    from planner.budget.work_bounds import TooCostly
    from planner.context.derive import global_batch_divides
    from planner.errors import Infeasible, InvalidPlan

    groups = composed_groups(model, workload, world_size) if stack == "composed" else \
        baseline_groups(model, workload, world_size)
    best: tuple | None = None
    least_host: tuple | None = None
    fitting = 0
    skipped = None
    for g in groups:
        plan = with_routing(model, group_plan(g, world_size, routing, dispatch_bound, dtype))
        try:
            ctx = make_context(model, cluster, workload, plan, resolved=True, overrides=dict(g.numeric))
            peak = np.broadcast_to(evaluate(ctx, critical=True, per_term=False).peak_bytes, (g.size,))
        except InvalidPlan as e:  # past 2^58 B per rank, or too costly to plan: never the closest
            if not isinstance(e, TooCostly) and e.field not in ("workload.seq_len", "workload.global_batch_tokens"):
                raise
            skipped = skipped or e
            continue
        host = host_budget(ctx)
        ok_host = np.broadcast_to((host.bytes <= host.capacity_bytes)   # and a whole number of micro-steps
                                  & global_batch_divides(workload, world_size, ctx.tokens_per_rank), (g.size,))
        fitting += int((within_headroom(peak, capacity_bytes(ctx), min_headroom) & ok_host).sum())
        cand = np.where(ok_host, peak, np.iinfo(np.int64).max)
        i = int(np.argmin(cand))
        if ok_host[i] and (best is None or cand[i] < best[0]):
            best = (int(cand[i]), g, plan, i)
        hb = np.broadcast_to(host.bytes, (g.size,))
        j = int(np.lexsort((peak, hb))[0])
        if least_host is None or (int(hb[j]), int(peak[j])) < least_host[0]:
            least_host = ((int(hb[j]), int(peak[j])), g, plan, j)
    if best is None and host_fallback and least_host is not None:
        best = (least_host[0][1], *least_host[1:])
    if best is None and skipped is not None:
        raise skipped
    if best is None:
        raise Infeasible(f"no legal {stack} candidate at W={world_size}" if host_fallback
                         else f"no {stack} candidate fits the host RAM at W={world_size}")
    peak, g, plan, i = best
    knobs = {k: int(np.asarray(v)[i]) for k, v in g.numeric.items()}
    pct = knobs.pop("sco_fraction_pct", None)
    if pct is not None:
        ctx = make_context(model, cluster, workload, plan, resolved=True,
                           overrides={k: np.asarray(v)[i:i + 1] for k, v in g.numeric.items()})
        knobs["sco_host_bytes"] = int(np.asarray(ctx.sco_host_bytes).reshape(-1)[0])
    part = "composed" if stack == "composed" else "baseline"
    return plan.model_copy(update={part: getattr(plan, part).model_copy(update=knobs)}), peak, fitting
