"""``planner sweep``: per context length, the best composed plan and the best FSDP2 baseline
(DESIGN §10). Where a stack has no fitting plan, its default plan stands in, so a plot still shows
how far over the HBM it is. The verdict of each plan (peak per live set) is taken by ``api.sweep``."""

from __future__ import annotations

from dataclasses import dataclass

from planner.schema import ClusterSpec, ModelSpec, Plan
from planner.schema import Workload
from planner.search.rank import Candidate, search


@dataclass
class SweepPoint:
    """The two plans compared at one context length."""

    seq_len: int
    composed: Plan
    composed_candidate: Candidate | None
    """``None`` when no composed plan fits (``composed`` is then the default plan)."""
    baseline: Plan
    baseline_candidate: Candidate | None
    """``None`` when no FSDP2 plan fits (``baseline`` is then the default layout)."""


def best_plans(model: ModelSpec, cluster: ClusterSpec, *, world_size: int, seq_lens: list[int],
               routing: str = "balanced", dtype: str = "bf16", progress=None) -> list[SweepPoint]:
    """Search each length; keep the fastest fitting plan of each stack (or its default)."""
    out = []
    for j, S in enumerate(seq_lens):
        res = search(model, cluster, Workload(seq_len=S), world_size=world_size, routing=routing, dtype=dtype, top=1)
        comp = res.top[0] if res.top else None
        base = res.baseline
        out.append(SweepPoint(
            S, comp.plan if comp else Plan(world_size=world_size, routing=routing, dtype=dtype), comp,
            base.plan if base else Plan(world_size=world_size, routing=routing, dtype=dtype, stack="fsdp2"), base))
        if progress:
            progress(j + 1, len(seq_lens))
    return out
