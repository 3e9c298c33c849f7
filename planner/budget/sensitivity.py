"""Routing sensitivity of a plan: its verdict under ``balanced``, the named skew and ``worst``
routing (DESIGN §3.2 "No launch-time bound, no balanced default").

Standard EP and LLEP's whole routed batch are sized by the routing the router draws; a bounded
PipelinedLLEP guarantee is not. Printing the three verdicts side by side shows which kind of
plan this is: a plan whose peak moves with the routing has no launch-time bound.
"""

from __future__ import annotations

import numpy as np

from planner.budget.build import make_context
from planner.budget.peak import capacity_bytes, evaluate
from planner.plans.routing import NAMED_SKEW, named_skew

ROUTINGS = ("balanced", NAMED_SKEW, "worst")
"""The routings of the sensitivity, in print order (``NAMED_SKEW`` becomes ``named_skew`` of the
model where ``80/16`` is no top-k routing of it)."""


def routing_sensitivity(model, cluster, workload, plan, *, resolved: bool = False) -> dict[str, dict]:
    """``{routing: {"peak_bytes", "fits_hbm"}}`` for each of ``ROUTINGS`` (HBM verdict only: the
    host does not depend on the routing). ``resolved``: ``plan`` is already resolved
    (``Ctx.plan`` of the verdict); no degree depends on the routing, so it is not resolved again."""
    out = {}
    skew = named_skew(model.num_experts, model.top_k)
    for r in (ROUTINGS[0], skew, ROUTINGS[2]):
        ctx = make_context(model, cluster, workload, plan.model_copy(update={"routing": r}), resolved=resolved)
        peak = int(np.max(evaluate(ctx).peak_bytes))
        out[r] = {"peak_bytes": peak, "fits_hbm": bool(peak <= capacity_bytes(ctx))}
    return out
