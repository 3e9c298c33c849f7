"""``ClusterSpec``: the declared topology of a cluster, kept apart from what was measured on it.

Every measured constant carries a ``status`` (``measured`` or ``assumed``) and, when measured, its
provenance (DESIGN §6). Verdicts list the assumed constants they used.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError

from planner.schema.base import SCHEMA_VERSION, Frozen, check_name, check_schema_version
from planner.schema.cluster_constants import CONSTANTS, ClusterConstant
from planner.schema.curves import Curves
from planner.schema.provenance import Provenance

MAX_DEVICE_BYTES = 1 << 50
"""Largest per-GPU or per-process byte constant (HBM, workspaces, host baseline): 1 PiB, so that
every per-rank sum the budget forms stays far inside int64."""
MAX_HOST_RAM_BYTES = 1 << 56
"""Largest host RAM per node: 64 PiB."""
MAX_BYTES_PER_ELEM = 1 << 10
"""Largest per-element workspace constant."""
MAX_SECONDS = 1e6
"""Largest time constant (seconds per GiB and the like)."""
MAX_BANDWIDTH = 1e16
"""Largest bandwidth in bytes/s (10 PB/s)."""


class Constant(Frozen):
    """One scalar constant of the memory or time model, measured or assumed."""

    value: float = Field(allow_inf_nan=False)
    """The value, in the unit its name states (``_bytes``, ``_s``, ``_fraction``); finite. The
    range its name implies is checked by ``MemoryConstants``."""
    status: Literal["measured", "assumed", "policy"] = "assumed"
    """``measured`` on the cluster (with provenance), ``assumed`` until it is, or ``policy``: a
    chosen safety margin rather than a fact about the hardware (the reserve floors)."""
    provenance: Provenance | None = None
    """How it was measured; required when ``status == "measured"``."""
    note: str = ""
    """What the number is and, when assumed, why this value."""

    @model_validator(mode="after")
    def _measured_has_provenance(self) -> "Constant":
        if self.status == "measured" and self.provenance is None:
            raise PydanticCustomError("measured_without_provenance",
                                      "status 'measured' needs provenance (device, date, command)")
        return self


class Topology(Frozen):
    """Declared hardware: what the cluster is said to be, not what was measured."""

    gpu_name: str
    """GPU model, e.g. ``NVIDIA H200``."""
    hbm_bytes: int = Field(gt=0, le=MAX_DEVICE_BYTES)
    """HBM per GPU as the driver reports it, in bytes (H200: 143,771 MiB)."""
    gpus_per_node: int = Field(gt=0, le=1 << 16)
    """GPUs per node."""
    host_ram_bytes: int = Field(gt=0, le=MAX_HOST_RAM_BYTES)
    """Host RAM per node, in bytes."""
    host_cores: int = Field(gt=0, le=1 << 20)
    """Host CPU cores per node."""
    host_mem_bw_bytes_per_s: float = Field(gt=0, le=MAX_BANDWIDTH, allow_inf_nan=False)
    """Host-memory bandwidth per node, in bytes/s."""
    interconnect: str = ""
    """Intra- and inter-node interconnect, e.g. ``NVLink4 intra-node, 8x400G InfiniBand``."""
    topology_status: Literal["measured", "assumed"] = "assumed"
    """Whether the declared topology was checked on a real node."""


class _MemoryConstantsBase(Frozen):
    """Constants of the memory model (DESIGN §3.1): what lives outside the allocator, the reserve,
    in-allocator workspaces, host-side baselines. One ``Constant`` field per entry of
    ``planner.schema.cluster_constants.CONSTANTS`` (its docstring and unmeasured default come from
    there); a profile that omits one holds that default, marked as the registry says."""

    @model_validator(mode="after")
    def _ranges(self) -> "_MemoryConstantsBase":
        """Bytes and seconds are >= 0; fractions lie in [0, 1] (a negative reserve or context would
        inflate the capacity and give a false "fits"; a fraction of 1 leaves no capacity, which is
        safe)."""
        from planner.errors import InvalidPlan

        for name in type(self).model_fields:
            c = getattr(self, name)
            if not isinstance(c, Constant):
                continue
            v, field = c.value, f"cluster.memory.{name}.value"
            assert math.isfinite(v), name          # Constant.value rejects inf/NaN
            if name.endswith("_fraction"):
                if not 0.0 <= v < 1.0:
                    raise InvalidPlan(field, v, "must be in [0, 1)", "give a share of the memory, e.g. 0.02")
            elif v < 0:
                raise InvalidPlan(field, v, "must be >= 0", "give a non-negative measured or assumed value")
            elif v > (top := _constant_bound(name)):
                raise InvalidPlan(field, v, f"must be <= {top:.4g}, far past any real machine",
                                  "give the measured or assumed value in the unit its name states")
        return self


EXPANDABLE_SEGMENTS_DOC = ("Whether the constants were measured with "
                           "``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (recommended).")


def _default_constant(entry: ClusterConstant):
    return lambda: Constant(value=entry.default, status=entry.default_status, note=entry.default_note)


MemoryConstants = create_model(
    "MemoryConstants", __base__=_MemoryConstantsBase, __module__=__name__,
    **{c.name: (Constant, Field(default_factory=_default_constant(c), description=c.doc)) for c in CONSTANTS},
    expandable_segments=(bool, Field(default=True, description=EXPANDABLE_SEGMENTS_DOC)))
MemoryConstants.__doc__ = _MemoryConstantsBase.__doc__


def _constant_bound(name: str) -> float:
    """Upper bound of a memory constant by the unit its name states."""
    if name.endswith("_bytes_per_elem"):
        return MAX_BYTES_PER_ELEM
    if "_bytes" in name:
        return MAX_DEVICE_BYTES
    return MAX_SECONDS


class ClusterSpec(Frozen):
    """A cluster profile: declared topology + measured constants (+ time-model curves)."""

    schema_version: int = SCHEMA_VERSION
    """Schema version of this profile."""
    name: str
    """Profile name, e.g. ``h200``."""
    topology: Topology
    """Declared hardware."""
    memory: MemoryConstants
    """Memory-model constants with provenance."""
    curves: Curves = Field(default_factory=lambda: Curves())
    """Time-model curves (``planner calibrate``): schema in ``planner.schema.curves``, fits and
    lookups in ``planner.timing.curves``."""

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        return check_schema_version(v, "cluster.schema_version")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "cluster.name")

    @model_validator(mode="after")
    def _usable(self) -> "ClusterSpec":
        check_usable_hbm(self)
        return self

    def assumed_constants(self) -> list[str]:
        """Names of the memory constants still marked ``assumed``."""
        out = []
        for name in type(self.memory).model_fields:
            v = getattr(self.memory, name)
            if isinstance(v, Constant) and v.status == "assumed":
                out.append(f"memory.{name}")
        if self.topology.topology_status == "assumed":
            out.append("topology")
        out += [f"curves.{name}" for name, c in self.curves.named() if c.status == "assumed"]
        return out


def check_usable_hbm(spec: ClusterSpec) -> None:
    """The HBM must exceed what lives outside the allocator (CUDA context + NCCL buffers), or every
    verdict would be against a negative capacity (``--hbm-gib 1`` with the H200 profile).

    Raises:
        InvalidPlan: naming ``topology.hbm_bytes``, what takes it, and both fixes.
    """
    from planner.errors import InvalidPlan
    from planner.units import GiB

    outside = spec.memory.cuda_context_bytes.value + spec.memory.nccl_buffer_bytes.value
    if spec.topology.hbm_bytes <= outside:
        raise InvalidPlan("cluster.topology.hbm_bytes", f"{spec.topology.hbm_bytes / GiB:.3g} GiB",
                          f"leaves no usable memory: the CUDA context and NCCL buffers alone take {outside / GiB:.3g} GiB",
                          "give the GPU's HBM (--hbm-gib, in GiB), or lower memory.cuda_context_bytes / "
                          "memory.nccl_buffer_bytes")
