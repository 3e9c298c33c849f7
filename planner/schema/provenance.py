"""``Provenance``: where and how a measured number was obtained (DESIGN §6).

Shared by the memory constants (``planner.schema.cluster``) and the time-model curves
(``planner.schema.curves``).
"""

from __future__ import annotations

from pydantic import Field

from planner.schema.base import Frozen


class Provenance(Frozen):
    """Where and how a number was measured."""

    device: str
    """Device name as the driver reports it, e.g. ``NVIDIA H200``."""
    torch: str = ""
    """torch version that measured it."""
    cuda: str = ""
    """CUDA runtime version."""
    nccl: str = ""
    """NCCL version (collective curves)."""
    date: str
    """ISO date of the measurement."""
    command: str
    """The exact command that produced the number."""
    gpus_on_machine: int = Field(default=1, ge=0)
    """How many GPUs the measuring machine had."""
    host_instance: str = ""
    """The measuring machine's boot id (``/proc/sys/kernel/random/boot_id``): host-CPU rates are
    comparable only between measurements that share it (virtual machines differ by ~20%)."""
