"""Host memory per node (DESIGN §3.3).

Per rank the host holds the process baseline, the offloaded optimizer state and its pinned staging
(``optimizer.host_terms``) and SCO's pinned boundaries (``n_off · roundup(N·H·b, 4 KiB)``). A node
runs ``min(W, gpus_per_node)`` ranks and keeps ``host_reserve_fraction`` of its RAM back. A plan
that fits the HBM but not the host does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.context.ctx import Ctx
from planner.units import PAGE_BYTES, round_up


@dataclass(frozen=True)
class HostBudget:
    """Host bytes of one node (arrays for vectorised candidates)."""

    baseline_bytes: object
    """Process baselines of the node's ranks."""
    optimizer_bytes: object
    """Offloaded optimizer state + pinned staging of the node's ranks."""
    sco_bytes: object
    """SCO pinned boundaries of the node's ranks (physical pinned bytes)."""
    capacity_bytes: int
    """Node RAM less the host reserve."""
    ranks_per_node: int
    """Ranks sharing the node."""

    @property
    def bytes(self):
        """Total host bytes the node needs."""
        return self.baseline_bytes + self.optimizer_bytes + self.sco_bytes

    @property
    def fits(self):
        """Whether the node's RAM holds it."""
        return self.bytes <= self.capacity_bytes


def ranks_per_node(ctx: Ctx) -> int:
    """Ranks that share one node's host RAM."""
    return min(ctx.world_size, ctx.cluster.topology.gpus_per_node)


def capacity_bytes(ctx: Ctx) -> int:
    """Node RAM less the reserve for the OS, page cache and data loaders."""
    topo, mem = ctx.cluster.topology, ctx.cluster.memory
    return int(topo.host_ram_bytes * (1.0 - mem.host_reserve_fraction.value))


def optimizer_host_bytes_per_rank(ctx: Ctx):
    """Host bytes one rank's optimizer needs (state + pinned staging), from ``optimizer.host_terms``."""
    from planner.budget.optimizer import host_terms

    total = np.int64(0)
    for t in host_terms(ctx):
        total = total + t.bytes
    return total


def sco_bytes_per_rank(ctx: Ctx):
    """Physical pinned bytes of SCO's offloaded boundaries on one rank."""
    per = round_up(np.asarray(ctx.tokens_per_rank, dtype=np.int64) * ctx.hidden_size * ctx.act_bytes, PAGE_BYTES)
    return np.asarray(ctx.num_offloaded, dtype=np.int64) * per


def default_sco_budget(ctx: Ctx):
    """What host RAM leaves per rank once baselines, optimizer state and the reserve are taken."""
    n = ranks_per_node(ctx)
    base = int(ctx.cluster.memory.host_baseline_bytes_per_rank.value)
    left = capacity_bytes(ctx) - n * (base + optimizer_host_bytes_per_rank(ctx))
    return np.maximum(left // n, 0)


def host_budget(ctx: Ctx) -> HostBudget:
    """The node's host budget for ``ctx``."""
    n = ranks_per_node(ctx)
    base = int(ctx.cluster.memory.host_baseline_bytes_per_rank.value)
    return HostBudget(
        baseline_bytes=np.int64(n * base),
        optimizer_bytes=n * optimizer_host_bytes_per_rank(ctx),
        sco_bytes=n * sco_bytes_per_rank(ctx),
        capacity_bytes=capacity_bytes(ctx),
        ranks_per_node=n,
    )
