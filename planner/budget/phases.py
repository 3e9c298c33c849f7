"""The phases of one training step with per-region checkpointing (DESIGN §3.1).

``full_phases`` lists every ``forward[r]``, the ``head``, every ``backward[r]`` (``r = L_b … 1``)
and the ``optimizer`` step. ``critical_phases`` keeps only the phases that can hold the peak:
forward[1] and backward[1] (the embedding gather and its dense gradient), the last two forward and
backward regions of each (previous kind, kind, next kind) of region (retained boundaries grow with
``r``; every other term depends only on the region's kind and its neighbours': the previous unit's
all-gather output at the forward's unshard and the backward's prefetch, the reduce-scatter input
held from the next region in ``backward[r]``, the final norm [and head]'s in ``backward[L_b]``), the last
sliding-window attention region (its block copies), the head and the optimizer. A test checks the
two agree.
"""

from __future__ import annotations

from planner.budget.attention_sliding import local_regions
from planner.context.ctx import Ctx
from planner.budget.terms import Phase


def full_phases(ctx: Ctx) -> list[Phase]:
    """Every phase of the step, in execution order."""
    kinds = ctx.regions
    fwd = [Phase("forward", r, kinds[r - 1]) for r in range(1, len(kinds) + 1)]
    bwd = [Phase("backward", r, kinds[r - 1]) for r in range(len(kinds), 0, -1)]
    return [*fwd, Phase("head"), *bwd, Phase("optimizer")]


def critical_phases(ctx: Ctx) -> list[Phase]:
    """The phases that can bind: region 1, the last two regions of each (previous, own, next) kind,
    head, optimizer."""
    kinds = ctx.regions
    keep = {1}
    n = len(kinds)
    around = lambda r: (kinds[r - 2] if r > 1 else None, kinds[r - 1], kinds[r] if r < n else None)  # noqa: E731
    for key in {around(r) for r in range(1, n + 1)}:
        keep.update(sorted(r for r in range(1, n + 1) if around(r) == key)[-2:])
    local = [r for r in local_regions(ctx) if r <= len(kinds)]
    if local:
        keep.add(max(local))
    rs = sorted(keep)
    return ([Phase("forward", r, kinds[r - 1]) for r in rs] + [Phase("head")]
            + [Phase("backward", r, kinds[r - 1]) for r in reversed(rs)] + [Phase("optimizer")])
