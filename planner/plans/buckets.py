"""Flat-slice bucket partition of OffloadStreamAdamW (DESIGN §3.2 Optimizer step, §7).

Legend: ``β`` bucket size in parameters (``bucket_params``), ``G`` buckets, ``Θ_r`` parameters of
one rank's optimizer (the sum of ``numels``), ``s`` staging slots.

A rank's parameters are concatenated in order into one flat range ``[0, Θ_r)`` and cut into
buckets of at most ``β`` parameters; a tensor may span several buckets. Every bucket is a list of
slices ``(param index, offset in the param, length, offset in the bucket)``.

**Alignment.** A cut inside a tensor lands on a multiple of ``align`` elements from the tensor's
start (default 16 = 64 B of fp32). Torch's fused CPU AdamW kernel splits each tensor into 64-byte
aligned task units and runs a scalar tail only at the tensor's end; its vector and scalar paths
differ in the last bit (checked in tests/runtime/test_offload_adamw.py), so an unaligned cut would
move elements between the two paths and break bitwise equality. The CUDA fused kernel does the
same arithmetic on every path, so the alignment costs nothing there. A bucket therefore closes up
to ``align - 1`` parameters short of ``β`` when the next tensor cannot be cut at that point, and
``G`` can exceed ``ceil(Θ_r/β)`` by the few buckets this costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.errors import InvalidPlan
from planner.units import ceil_div

BUCKET_ALIGN = 16
"""Elements: cuts inside a tensor land on multiples of this from the tensor's start (64 B fp32)."""


@dataclass(frozen=True)
class Slice:
    """Part of one parameter inside one bucket."""

    param: int
    """Index of the parameter in the rank's flat order."""
    offset: int
    """First element of the slice inside the parameter (flattened)."""
    length: int
    """Elements in the slice."""
    bucket_offset: int
    """First element of the slice inside its bucket (and staging slot)."""


@dataclass(frozen=True)
class Bucket:
    """One flat range ``[start, start + length)`` of the rank's parameters."""

    index: int
    start: int
    """Flat offset of the bucket's first element."""
    length: int
    """Elements (≤ β)."""
    slices: tuple[Slice, ...]


@dataclass(frozen=True)
class BucketPlan:
    """The partition of one rank's parameters."""

    numels: tuple[int, ...]
    """Elements of each parameter, in flat order."""
    bucket_params: int
    """``β``."""
    align: int
    buckets: tuple[Bucket, ...]

    @property
    def num_buckets(self) -> int:
        """``G``."""
        return len(self.buckets)

    @property
    def total(self) -> int:
        """``Θ_r``: elements over all parameters."""
        return sum(self.numels)

    @property
    def max_bucket(self) -> int:
        """Elements of the largest bucket (the staging slot size), ``≤ min(β, Θ_r)``."""
        return max((b.length for b in self.buckets), default=0)

    @property
    def param_offsets(self) -> tuple[int, ...]:
        """Flat offset of each parameter's first element."""
        out, pos = [], 0
        for n in self.numels:
            out.append(pos)
            pos += n
        return tuple(out)


def partition(numels: Sequence[int], bucket_params: int, align: int = BUCKET_ALIGN) -> BucketPlan:
    """Cut the concatenation of ``numels`` into buckets of at most ``bucket_params`` elements.

    Raises:
        InvalidPlan: ``bucket_params < align``, ``align < 1`` or a negative numel.
    """
    if align < 1:
        raise InvalidPlan("align", align, "must be >= 1", "use the default 16")
    if bucket_params < align:
        raise InvalidPlan("plan.composed.bucket_params", bucket_params, f"must be >= the cut alignment ({align})",
                          "use a bucket of at least a few million parameters")
    if any(n < 0 for n in numels):
        raise InvalidPlan("numels", min(numels), "must be >= 0", "pass tensor element counts")
    buckets: list[Bucket] = []
    cur: list[Slice] = []
    start = used = 0
    pos = 0  # flat offset of the next element to place

    def close() -> None:
        nonlocal cur, start, used
        if cur:
            buckets.append(Bucket(len(buckets), start, used, tuple(cur)))
        cur, start, used = [], pos, 0

    for i, n in enumerate(numels):
        off = 0
        while off < n:
            room = bucket_params - used
            rest = n - off
            take = rest if rest <= room else room - room % align
            if take == 0:
                close()
                continue
            cur.append(Slice(i, off, take, used))
            used += take
            off += take
            pos += take
            if used == bucket_params:
                close()
    close()
    return BucketPlan(tuple(int(n) for n in numels), int(bucket_params), int(align), tuple(buckets))


def num_buckets(total_params, bucket_params):
    """``G ≈ ceil(Θ_r/β)`` for the budget (ints or numpy arrays); the alignment can add a few."""
    return ceil_div(total_params, bucket_params)
