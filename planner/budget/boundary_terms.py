"""The ``boundaries`` live set of either stack: the composed stack's checkpoint boundaries
(``boundaries``) or the FSDP2 baseline's saved activations (``fsdp2_boundaries``, which reads the
per-token saved counts of ``boundaries``)."""

from __future__ import annotations

from planner.budget import boundaries, fsdp2_boundaries
from planner.budget.terms import Term
from planner.context.ctx import Ctx


def terms(ctx: Ctx) -> list[Term]:
    """Boundary (and saved-activation) terms of one rank, on the plan's stack."""
    return fsdp2_boundaries.terms(ctx) if ctx.stack == "fsdp2" else boundaries.terms(ctx)
