"""Live set ``persistent`` of the FSDP2 baseline, from the tensor inventory of
``planner/runtime/fsdp2.py`` (DESIGN §2, §3.2).

Per rank, with ``F = dp_shard·cp`` (dense units) and ``efsdp·tp = (F/ep)·tp`` (experts), every
parameter tensor padded on its sharded dimension (``planner.plans.fsdp2_shards``, one count per
FSDP unit: the embedding, ``[norm, head]``, each layer):

    fp32 parameter shards   4·Θ_shard                       every phase
    AdamW m, v              8·Θ_shard                       every phase (created at the first step)
    fp32 gradient shards    4·Θ_shard                       accumulate: every phase
                                                            freed: a unit's shard exists once its
                                                            reduce-scatter ran: [norm, head] from
                                                            backward[L], layer j's in backward[r<j],
                                                            all in optimizer; none in forward / head

HSDP replicates the shards ``dp_replicate`` times: the per-rank count is the same as FSDP over
``F``. With ``CPUOffloadPolicy`` all of it is on the host (``planner.budget.optimizer.host_terms``).
"""

from __future__ import annotations

import numpy as np

from planner.context.ctx import Ctx
from planner.budget.terms import ALWAYS, Phase, Term
from planner.plans import fsdp2_shards

SOURCE = "tensor inventory of planner/runtime/fsdp2.py (fully_shard units); planner/plans/fsdp2_shards.py"
GRAD_PHASES = ("backward", "optimizer")


def unit_shards(ctx: Ctx) -> dict:
    """Padded shard elements per FSDP unit of one rank (see the module legend)."""
    fsdp = np.asarray(ctx.dp_shard) * np.asarray(ctx.cp)
    return fsdp2_shards.shard_params_by_unit(ctx.model, tp=ctx.tp, fsdp=fsdp, ep=ctx.ep)


def total_shard(ctx: Ctx, u: dict):
    kinds = ctx.regions
    n_moe, n_dense = kinds.count("moe"), kinds.count("dense_mlp")
    return u["embedding"] + u["head"] + u["mtp"] + n_moe * u["moe"] + n_dense * u["dense_mlp"]


def reduced_shards(ctx: Ctx, u: dict) -> list:
    """Padded shard elements of the units already reduced when backward[r] runs, per ``r`` (index
    ``r − 1``): the ``[norm, head]`` unit's (and MTP's) and every layer ``j > r``'s."""
    kinds = ctx.regions
    after = [0] * len(kinds)                # after[r-1]: layers j > r
    for r in range(len(kinds) - 1, 0, -1):
        after[r - 1] = after[r] + u[kinds[r]]
    return [u["head"] + u["mtp"] + np.asarray(a) for a in after]


def terms(ctx: Ctx) -> list[Term]:
    if ctx.cpu_offload:
        return []
    u = unit_shards(ctx)
    total = total_shard(ctx, u)
    reduced = reduced_shards(ctx, u)

    def grads(ph: Phase):
        if ph.kind == "optimizer":
            return total
        if ph.kind == "backward":
            return reduced[ph.region - 1]
        return 0 * total

    freed = ctx.grad_lifetime == "freed"
    return [
        Term("fp32 parameter shards", "persistent", total, 4, "Σ_units padded shard (Θ/F)", ALWAYS, source=SOURCE),
        Term("AdamW m, v", "persistent", total, 8, "Σ_units padded shard (m, v: 4+4 B)", ALWAYS, source=SOURCE),
        Term("fp32 gradient shards", "persistent", total, 4,
             "freed: [norm, head] + layers j > r in backward[r], all in optimizer" if freed
             else "Σ_units padded shard (kept across micro-steps)",
             GRAD_PHASES if freed else ALWAYS, at=grads if freed else None, source=SOURCE),
    ]
