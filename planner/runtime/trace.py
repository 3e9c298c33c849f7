"""Fake-tensor peak trace of one rank's execution at full scale (DESIGN §8).

Setup, exactly as DESIGN §8 prescribes:

- ``FakeTensorMode`` with PyTorch's fake process group
  (``init_process_group("fake", store=FakeStore(), rank=r, world_size=W)``), so collectives are
  no-ops on fake tensors and any ``W`` can be traced on one CPU;
- ``MemTracker`` entered **inside** ``FakeTensorMode``, with every input registered through
  ``track_external`` (tensors created before entry are otherwise missed);
- device tensors are fake ``cpu`` tensors and host buffers fake ``meta`` tensors (fake ``cuda``
  aborts a CPU-only build), so device and host bytes are counted apart;
- streams, events and ``.item()`` go through the shim's trace mode or the real-valued plan, which
  the caller computes **outside** fake mode and closes over in ``build``.

``trace_rank`` asserts the peak is positive. ``trace_ranks`` traces one representative rank per
plan signature and returns the maximum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from planner.runtime import shim

DEVICE = torch.device("cpu")
"""Where traced device tensors live (fake ``cpu``)."""
HOST = torch.device("meta")
"""Where traced host buffers live (fake ``meta``)."""

Build = Callable[[], tuple[Sequence[torch.Tensor], Callable[[], None]]]
"""Called inside fake mode: returns (inputs to register, the step to trace)."""


@dataclass
class TraceResult:
    """Peak of one traced rank (or the maximum over ranks)."""

    peak_bytes: int
    """Device peak (fake ``cpu``), bytes."""
    host_peak_bytes: int
    """Host peak (fake ``meta``), bytes."""
    by_category: dict[str, int]
    """Device bytes at the peak by MemTracker category (Parameter, Gradient, Activation, Temp, …)."""
    rank: int
    """The rank (of the maximum, for ``trace_ranks``)."""
    per_rank: dict[int, int] = field(default_factory=dict)
    """Device peak of every traced rank."""


def _snapshot_bytes(snap: dict, device: torch.device) -> tuple[int, dict[str, int]]:
    for dev, cats in snap.items():
        if torch.device(dev).type == device.type:
            total = int(cats.get("Total", 0))
            return total, {getattr(k, "value", str(k)): int(v) for k, v in cats.items() if k != "Total"}
    return 0, {}


def trace_rank(build: Build, *, rank: int, world_size: int) -> TraceResult:
    """Trace one rank: fake process group of ``world_size`` as ``rank``, fake tensors, MemTracker.

    Raises:
        RuntimeError: torch.distributed already holds a non-fake process group.
        AssertionError: the traced device peak is not positive (nothing was tracked).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise RuntimeError("trace_rank needs a process without a real process group")
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with FakeTensorMode(allow_non_fake_inputs=False), shim.tracing():
            inputs, step = build()
            mt = MemTracker()
            if inputs:
                mt.track_external(*inputs)
            with mt:
                step()
            snap = mt.get_tracker_snapshot("peak")
    finally:
        dist.destroy_process_group()
    peak, cats = _snapshot_bytes(snap, DEVICE)
    host_peak, _ = _snapshot_bytes(snap, HOST)
    assert peak > 0, "traced device peak must be positive: were the inputs registered?"
    return TraceResult(peak, host_peak, cats, rank, {rank: peak})


def trace_ranks(build_for_rank: Callable[[int], Build], ranks: Iterable[int], *,
                world_size: int) -> TraceResult:
    """Trace each rank in ``ranks`` (one per class of ranks sharing a plan signature); return the max."""
    best: TraceResult | None = None
    per_rank: dict[int, int] = {}
    for r in ranks:
        res = trace_rank(build_for_rank(r), rank=r, world_size=world_size)
        per_rank[r] = res.peak_bytes
        if best is None or res.peak_bytes > best.peak_bytes:
            best = res
    assert best is not None, "trace_ranks needs at least one rank"
    best.per_rank = per_rank
    return best
