"""``planner sweep``: per context length, the best composed plan and the best FSDP2 baseline, with
the peak of every live set, the verdict and the predicted throughput (DESIGN §10)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.budget.terms import LIVE_SETS
from planner.schema import ClusterSpec, ModelSpec, Plan, PlanFile, Workload
from planner.search.rank import Candidate, search


@dataclass
class SweepRow:
    """One stack at one context length."""

    seq_len: int
    stack: str
    fits: bool
    peak_bytes: int
    capacity_bytes: int
    live_set_max_bytes: dict
    """Live set → maximum bytes over phases."""
    binding_live_set: str
    tokens_per_s_per_gpu: float | None
    plan: Plan
    assumed: list = field(default_factory=list)


def _row(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, cand: Candidate | None) -> SweepRow:
    from planner.api import check_planfile

    rep = check_planfile(PlanFile(model=model, cluster=cluster, workload=workload, plan=plan))
    return SweepRow(workload.seq_len, plan.stack, rep.fits, rep.peak_bytes, rep.capacity_bytes,
                    {ls: rep.live_set_bytes(ls)[1] for ls in LIVE_SETS}, rep.binding_live_set,
                    cand.tokens_per_s_per_gpu if cand else None, rep.planfile.plan, rep.assumed)


def sweep(model: ModelSpec, cluster: ClusterSpec, *, world_size: int, seq_lens: list[int],
          routing: str = "balanced", dtype: str = "bf16", progress=None) -> list[SweepRow]:
    """Best composed and best baseline at each length; where nothing fits, the stack's default plan
    (so the plot still shows how far over the HBM it is)."""
    rows: list[SweepRow] = []
    for j, S in enumerate(seq_lens):
        wl = Workload(seq_len=S)
        res = search(model, cluster, wl, world_size=world_size, routing=routing, dtype=dtype, top=1)
        comp = res.top[0] if res.top else None
        default_c = Plan(world_size=world_size, routing=routing, dtype=dtype)
        default_b = Plan(world_size=world_size, routing=routing, dtype=dtype, stack="fsdp2")
        rows.append(_row(model, cluster, wl, comp.plan if comp else default_c, comp))
        rows.append(_row(model, cluster, wl, res.baseline.plan if res.baseline else default_b, res.baseline))
        if progress:
            progress(j + 1, len(seq_lens))
    return rows
