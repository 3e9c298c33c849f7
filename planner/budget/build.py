"""Build the ``Ctx`` of one configuration: the resolution layer's symbols (``planner.context``)
plus the SCO host budget and ``n_off``, which need the memory model (DESIGN §3.3)."""

from __future__ import annotations

import dataclasses

from planner.context.ctx import Ctx
from planner.context.derive import derive_context
from planner.schema import ClusterSpec, ModelSpec, Plan, Workload


def make_context(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, *,
                 resolved: bool = False, overrides: dict | None = None) -> Ctx:
    """``planner.context.derive.derive_context`` (see it for the arguments and errors) with the
    SCO budget and ``n_off`` filled."""
    ctx, sco_pct = derive_context(model, cluster, workload, plan, resolved=resolved, overrides=overrides)
    return _with_sco(ctx, sco_pct)


def _with_sco(ctx: Ctx, pct=None) -> Ctx:
    """Fill the SCO host budget (default: what host RAM leaves, DESIGN §3.3, or ``pct`` percent of
    it for the search) and ``n_off``."""
    if ctx.stack != "composed" or ctx.checkpoint != "sco":
        return dataclasses.replace(ctx, sco_host_bytes=0, num_offloaded=0)
    from planner.budget.host import default_sco_budget
    from planner.plans.sco import num_offloaded

    budget = ctx.sco_host_bytes
    if budget is None:
        budget = default_sco_budget(ctx)
        if pct is not None:
            budget = budget * pct // 100
    n_off = num_offloaded(ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes, ctx.num_boundaries, budget)
    return dataclasses.replace(ctx, sco_host_bytes=budget, num_offloaded=n_off)
