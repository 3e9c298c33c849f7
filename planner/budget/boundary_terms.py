"""The ``boundaries`` live set of either stack: the composed stack's checkpoint boundaries
(``boundaries``) or, without checkpointing, its saved activations (``saved_composed``), or the
FSDP2 baseline's saved activations (``fsdp2_boundaries``, which reads the per-token saved counts of
``boundaries``)."""

from __future__ import annotations

from planner.budget import boundaries, fsdp2_boundaries, saved_composed
from planner.budget.terms import Term
from planner.context.ctx import Ctx


def terms(ctx: Ctx) -> list[Term]:
    """Boundary (and saved-activation) terms of one rank, on the plan's stack and checkpointing."""
    if ctx.stack == "fsdp2":
        return fsdp2_boundaries.terms(ctx)
    if ctx.checkpoint != "none":
        return boundaries.terms(ctx)
    comps, name = None, ""
    if ctx.model.is_moe and "moe" in set(ctx.regions):
        from planner.budget import dispatch

        op, _, comps, _ = dispatch.components(ctx)
        name = dispatch.OPERATOR_NAMES[op]
    return saved_composed.terms(ctx, comps, name)
