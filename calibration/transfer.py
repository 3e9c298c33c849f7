"""Host-device copy bandwidth by message size, and the host-memory copy bandwidth.

- ``h2d``: pinned host → device, ``dev[:n].copy_(host[:n], non_blocking=True)``.
- ``d2h``: device → pinned host.
- ``bidir``: one H2D and one D2H of ``n`` bytes each, on two side streams at once; the time is
  until both end, so ``n / t`` is the rate each way (DESIGN §4: OffloadStreamAdamW moves its
  buckets both ways at once).

Without CUDA (``--smoke`` only) the same code times pageable host-to-host copies, so the curves it
writes are marked ``device: cpu``. Sanity reference (one H200, 16 host cores, measured before, not
used by the code): H2D 54.2 GB/s, D2H 54.5 GB/s, bidirectional 44.1 GB/s each way.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from pydantic import ValidationError

from calibration.config import Grid
from planner.errors import InvalidPlan
from planner.runtime.measure import time_rep
from planner.timing.curves import BandwidthCurve, bandwidth_curve

Tick = Callable[[int], None]


def _fit_checked(sizes, measure: Callable[[int], float], prov: dict, note: str) -> BandwidthCurve:
    """Measure every size, fit; re-measure once if the noise makes the curve non-monotone."""
    times = [measure(n) for n in sizes]
    try:
        return bandwidth_curve(sizes, times, provenance=prov, note=note)
    except (ValidationError, InvalidPlan):  # a noisy run: one retry, then the error stands
        times = [measure(n) for n in sizes]
        return bandwidth_curve(sizes, times, provenance=prov, note=note)


def transfer_curves(grid: Grid, device: torch.device, prov: dict, tick: Tick) -> dict[str, BandwidthCurve]:
    """``{"h2d", "d2h", "bidir"}`` latency-bandwidth curves over ``grid.transfer_bytes``."""
    cuda = device.type == "cuda"
    n_max = max(grid.transfer_bytes)
    host_src = torch.empty(n_max, dtype=torch.uint8, pin_memory=cuda).fill_(1)
    host_dst = torch.empty(n_max, dtype=torch.uint8, pin_memory=cuda)
    dev_a = torch.empty(n_max, dtype=torch.uint8, device=device).fill_(2)
    dev_b = torch.empty(n_max, dtype=torch.uint8, device=device)
    streams = (torch.cuda.Stream(), torch.cuda.Stream()) if cuda else (None, None)

    def h2d(n):
        dev_b[:n].copy_(host_src[:n], non_blocking=True)

    def d2h(n):
        host_dst[:n].copy_(dev_a[:n], non_blocking=True)

    def bidir(n):
        if not cuda:
            h2d(n)
            d2h(n)
            return
        cur = torch.cuda.current_stream()
        for s in streams:
            s.wait_stream(cur)
        with torch.cuda.stream(streams[0]):
            h2d(n)
        with torch.cuda.stream(streams[1]):
            d2h(n)
        for s in streams:
            cur.wait_stream(s)

    kind_note = "pinned" if cuda else "pageable host-to-host (no CUDA: smoke only)"
    out = {}
    for name, fn in (("h2d", h2d), ("d2h", d2h), ("bidir", bidir)):
        def measure(n, fn=fn):
            t = time_rep(lambda: fn(n), min_time_s=grid.min_time_s, iters=grid.iters, device=device)
            tick(1)
            return t
        note = {"h2d": f"{kind_note} host → device", "d2h": f"device → {kind_note} host",
                "bidir": f"{kind_note}: H2D and D2H of size_bytes each at once on two streams"}[name]
        out[name] = _fit_checked(grid.transfer_bytes, measure, prov, note)
    del host_src, host_dst, dev_a, dev_b
    return out


def host_copy_bytes_per_s(grid: Grid, threads: int | None = None) -> float:
    """Host-memory copy bandwidth (bytes read + written per second) of a ``torch`` copy of
    ``grid.host_copy_bytes`` with ``threads`` intra-op threads (default: all)."""
    n = grid.host_copy_bytes
    src = torch.ones(n // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    prev = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        dst.copy_(src)
        best = float("inf")
        for _ in range(max(3, grid.iters)):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(prev)
    return 2.0 * src.numel() * 4 / best


def counts(grid: Grid) -> dict[str, int]:
    """Progress units of the transfer section (each size measured once per kind; a noisy retry
    adds more)."""
    return {"transfer": 3 * len(grid.transfer_bytes)}
