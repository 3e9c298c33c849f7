"""Communication times: NCCL collectives by group size, and host-device copies (DESIGN §4).

Legend: ``g`` ranks in the group, ``G_n`` GPUs per node, ``size`` bytes per rank in the
convention of ``CollectiveCurves`` (all-to-all: bytes each rank sends, its own share included;
all-gather: the gathered output; reduce-scatter: the input; p2p ring: bytes sent to the next rank).

Collectives, one rule per case, every rule but the first listed in ``assumed``:

1. **Measured** at ``g``: the measured points (``compute.points_s``: interpolated inside, the
   last segment's marginal rate above, listed; a gap below the smallest size).
2. **Not measured, ``g ≤ G_n``** (the group inside one node: groups are consecutive ranks, and
   ranks fill a node before the next): the bus bandwidth of the largest measured intra-node
   group of the same collective (its marginal rate ``β'`` × ``w(g')``) moves ``w(g)·size`` bytes,
   after that curve's smallest measured time. ``w(g) = (g−1)/g`` for all-to-all, all-gather and
   reduce-scatter (ring / pairwise algorithms), ``w = 1`` for a ring hop.
3. **Otherwise** (nothing measured in a node, or ``g > G_n``): the declared link constants below
   (``ASSUMED_LINKS``), with ``w(g)·size`` bytes on the slowest link a rank's traffic crosses.
   An all-to-all across nodes sends ``(g − G_n)/g`` of its bytes through the node's network and
   ``(G_n − 1)/g`` over NVLink at once; rings and all-gathers spanning nodes run at the network
   rate.

Host copies use the measured pinned ``h2d``/``d2h``/``bidir`` points (``lookups.points_s``). When
``r = min(W, G_n)`` ranks share a node, each copy is also bounded by the host-memory bandwidth a
rank gets, ``host_mem_bw/G_n`` (DESIGN §4: contention among 8 GPUs on one host's DRAM
cannot be measured on one GPU and stays assumed; each GPU is assumed to have its own PCIe link).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.errors import ProfileGap
from planner.timing import curves as C
from planner.timing.lookups import Lookups, marginal_rate, points_s


@dataclass(frozen=True)
class Link:
    """An assumed interconnect: achieved NCCL bus bandwidth per GPU and per direction, latency."""

    name: str
    bus_bytes_per_s: float
    latency_s: float


ASSUMED_LINKS = {
    "intra": Link("NVLink4/NVSwitch (900 GB/s per GPU bidirectional; NCCL busbw ~360 GB/s)", 360e9, 25e-6),
    "inter": Link("InfiniBand NDR, one 400 Gb/s NIC per GPU (NCCL busbw ~45 GB/s)", 45e9, 40e-6),
}
"""Declared H200 HGX link constants used only by rule 3 (always listed in ``assumed``)."""


def wire_fraction(collective: str, g):
    """``w(g)``: the share of ``size`` a rank puts on the wire."""
    g = np.asarray(g, dtype=float)
    return np.ones_like(g) if collective == "p2p_ring" else (g - 1.0) / np.maximum(g, 1.0)


def _intra_reference(lk: Lookups, collective: str):
    table = getattr(lk.curves.collectives, collective)
    ok = [g for g in table if g <= lk.topology.gpus_per_node]
    return (max(ok), table[max(ok)]) if ok else (None, None)


def collective_s(lk: Lookups, collective: str, group_size, size_bytes):
    """Seconds of one ``collective`` in groups of ``group_size`` moving ``size_bytes`` per rank.

    ``group_size`` may be an array (one per candidate); groups of 1 and zero sizes cost 0.
    """
    assert collective in C.COLLECTIVES, collective
    g_arr, size = np.broadcast_arrays(np.asarray(group_size, dtype=np.int64), np.asarray(size_bytes, dtype=float))
    out = np.zeros(g_arr.shape)
    G_n = lk.topology.gpus_per_node
    table = getattr(lk.curves.collectives, collective)
    for g in np.unique(g_arr):
        g = int(g)
        sel = (g_arr == g) & (size > 0)
        if g <= 1 or not sel.any():
            continue
        x = size[sel]
        if g in table:
            curve = table[g]
            out[sel] = points_s(lk, f"collectives.{collective}.{g}", curve.size_bytes, curve.time_s, x)
            continue
        g_ref, ref = _intra_reference(lk, collective)
        if g <= G_n and ref is not None:
            busbw = marginal_rate(ref.size_bytes, ref.time_s) * float(wire_fraction(collective, g_ref))
            lk.assume(f"collectives.{collective}.{g}: not measured; bus bandwidth of the measured group "
                      f"of {g_ref} ({busbw / 1e9:.0f} GB/s) after its smallest measured time")
            out[sel] = min(ref.time_s) + x * wire_fraction(collective, g) / busbw
            continue
        out[sel] = _assumed_link_s(lk, collective, g, x)
    return float(out) if out.ndim == 0 else out


def _assumed_link_s(lk: Lookups, collective: str, g: int, x):
    G_n = lk.topology.gpus_per_node
    intra, inter = ASSUMED_LINKS["intra"], ASSUMED_LINKS["inter"]
    if g <= G_n:
        lk.assume(f"collectives.{collective}.{g}: not measured; assumed {intra.name}")
        return intra.latency_s + x * wire_fraction(collective, g) / intra.bus_bytes_per_s
    lk.assume(f"collectives.{collective}.{g}: spans nodes; assumed {inter.name} "
              f"(and {intra.name} inside the node)")
    if collective == "all_to_all":
        t_net = x * (g - G_n) / g / inter.bus_bytes_per_s
        t_nvl = x * (G_n - 1) / g / intra.bus_bytes_per_s
        return inter.latency_s + np.maximum(t_net, t_nvl)
    return inter.latency_s + x * wire_fraction(collective, g) / inter.bus_bytes_per_s


# ------------------------------------------------------------------------------------------------
# host <-> device copies
# ------------------------------------------------------------------------------------------------
def ranks_per_node(lk: Lookups, world_size) -> int:
    """Ranks sharing one node's host memory: ``min(W, G_n)``."""
    return int(min(int(np.max(world_size)), lk.topology.gpus_per_node))


def host_share_bytes_per_s(lk: Lookups, ranks: int) -> float | None:
    """Host-memory bandwidth one rank gets when ``ranks`` share a node (None for one rank)."""
    if ranks <= 1:
        return None
    topo = lk.topology
    share = topo.host_mem_bw_bytes_per_s / topo.gpus_per_node
    lk.assume(f"host DRAM shared evenly by the node's GPUs: {topo.host_mem_bw_bytes_per_s / 1e9:.0f} GB/s "
              f"({'declared' if topo.topology_status == 'assumed' else 'measured'}) "
              f"/ {topo.gpus_per_node} = {share / 1e9:.0f} GB/s per GPU (8-GPU DRAM/PCIe contention "
              "not measured; one PCIe link per GPU)")
    return share


def host_copy_s(lk: Lookups, kind: str, nbytes, *, ranks: int = 1):
    """Seconds of one pinned copy of ``nbytes`` (``kind`` ∈ h2d, d2h, bidir: bytes each way, both
    directions at once), bounded by the host-memory share when ``ranks`` share the node."""
    curve = lk.required(kind)
    x = np.asarray(nbytes, dtype=float)
    if curve is None:
        return np.where(x == 0, 0.0, np.nan)
    t = points_s(lk, kind, curve.size_bytes, curve.time_s, x)
    share = host_share_bytes_per_s(lk, ranks)
    if share is not None:
        dram = x * (2.0 if kind == "bidir" else 1.0) / share
        t = np.maximum(t, dram)
    return t


def host_dram_s(lk: Lookups, nbytes, *, ranks: int):
    """Seconds for ``nbytes`` of host-memory traffic at the rank's share (0 for one rank per node)."""
    share = host_share_bytes_per_s(lk, ranks)
    x = np.asarray(nbytes, dtype=float)
    return np.zeros_like(x) if share is None else x / share


__all__ = ["ASSUMED_LINKS", "Link", "collective_s", "host_copy_s", "host_dram_s", "host_share_bytes_per_s",
           "ranks_per_node", "wire_fraction", "ProfileGap"]
