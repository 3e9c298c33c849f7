"""The composed stack's FSDP2 units per region (``planner.budget.gathered``'s legend): each region's
dense parameters, the unit after the last region, and the per-region term helper both
``gathered`` and ``gathered_unshard`` build their terms with.
"""

from __future__ import annotations

import numpy as np

from planner.budget import regions
from planner.context.ctx import Ctx

SOURCE = "DESIGN §2 MoP layout / FSDP2 layout, §3.2 Gathered"


def as_int(v):
    """A 0-d count as an int, an array as it is."""
    return int(v) if np.ndim(v) == 0 else v


def by_region(cnt: list):
    """A per-region count list as a term's ``(count, at)``: the largest over regions (the term's
    size), and region ``r``'s in ``Phase r``."""
    big = cnt[0]
    for c in cnt[1:]:
        big = np.maximum(big, c)
    return as_int(big), lambda ph: as_int(cnt[ph.region - 1])


def unit_params(ctx: Ctx, P) -> list:
    """Dense parameters of the FSDP2 unit of each region (forward order), then of the unit after the
    last region: ``[norm, head]`` when the head is ZeRO-3 (``P = 1`` or a dense head), else the norm."""
    m = ctx.model
    per = {"attention": regions.attention_region_params(m), "moe": regions.moe_region_dense_params(m),
           "dense_mlp": regions.dense_region_params(m) if m.num_dense_layers else 0}
    VH = ctx.vocab_size * ctx.hidden_size
    head = VH if ctx.vocab == "dense" else np.where(P == 1, VH, 0)
    return [per[k] for k in ctx.regions] + [ctx.hidden_size + head]
