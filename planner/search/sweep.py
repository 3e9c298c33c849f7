"""``planner sweep``: per context length, the best composed plan and the best FSDP2 baseline
(DESIGN §10). Where a stack has no fitting plan, its lowest-peak legal plan stands in, so a plot
still shows how far over the HBM its best attempt is. The verdict of each plan (peak per live set) is taken by ``api.sweep``."""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import Infeasible
from planner.schema import ClusterSpec, ModelSpec, Plan
from planner.schema import Workload
from planner.search.rank import Candidate, lowest_peak, search
from planner.schema.knobs import default as knob_default


@dataclass
class SweepPoint:
    """The two plans compared at one context length."""

    seq_len: int
    composed: Plan
    composed_candidate: Candidate | None
    """``None`` when no composed plan fits (``composed`` is then the lowest-peak plan)."""
    baseline: Plan
    baseline_candidate: Candidate | None
    """``None`` when no FSDP2 plan fits (``baseline`` is then the lowest-peak layout)."""


def best_plans(model: ModelSpec, cluster: ClusterSpec, *, world_size: int, seq_lens: list[int],
               routing: str | None = knob_default("routing"), dtype: str = knob_default("dtype"), global_batch_tokens: int | None = None,
               progress=None, min_headroom: float | None = None) -> list[SweepPoint]:
    """Search each length; keep the fastest fitting plan of each stack (or its default)."""
    out = []
    for j, S in enumerate(seq_lens):
        wl = Workload(seq_len=S, global_batch_tokens=global_batch_tokens)
        res = search(model, cluster, wl, world_size=world_size, routing=routing, dtype=dtype, top=1,
                     **({} if min_headroom is None else {"min_headroom": min_headroom}))
        comp, base = (res.top[0] if res.top else None), res.baseline

        def fallback(stack: str) -> Plan:
            try:
                return lowest_peak(model, cluster, wl, world_size=world_size, stack=stack, routing=routing,
                                   dtype=dtype)[0]
            except Infeasible:  # nothing even fits the host: the stack's default plan
                return Plan(world_size=world_size, routing=routing, dtype=dtype, stack=stack)

        out.append(SweepPoint(S, comp.plan if comp else fallback("composed"), comp,
                              base.plan if base else fallback("fsdp2"), base))
        if progress:
            progress(j + 1, len(seq_lens))
    return out
