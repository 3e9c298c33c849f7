"""The registry of cluster constants: one declaration per memory-model constant (DESIGN §3.1, §6).

Each ``ClusterConstant`` holds everything the code needs to know about one constant:

- ``doc``: what it is (the docstring of its ``MemoryConstants`` field, which is built from here);
- ``default``, ``default_status``, ``default_note``: its **unmeasured default**, what a profile that
  does not give it holds, and what ``python -m calibration`` writes when its run does not measure it
  (``assumed``, or ``policy`` for a chosen safety margin);
- ``merge``: how ``calibration.merge`` folds a measurement in (``replace``, or ``keep_larger``:
  a smaller measurement never replaces a larger value, for floors that only grow);
- ``measured_by``: where it is measured (``module:function``; empty for a policy);
- ``used_by``: the planner modules that read it, and ``used_when``: ``always`` or ``multi_rank``
  (only when ``W > 1``). ``planner.budget.peak.constants_used`` is derived from these, so every
  constant a verdict reads and nobody measured is reported as assumed with no list kept by hand;
  ``tests/unit/test_cluster_constants.py`` checks ``used_by`` against the code's reads.

Adding a constant: one entry here, and the read in its consumer (README, "Adding a cluster constant").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ClusterConstant:
    """One scalar constant of the memory model (see the module docstring)."""

    name: str
    doc: str
    default: float
    default_note: str
    default_status: Literal["assumed", "policy"] = "assumed"
    merge: Literal["replace", "keep_larger"] = "replace"
    measured_by: str = ""
    used_by: tuple[str, ...] = ()
    used_when: Literal["always", "multi_rank"] = "always"


_NEEDS_CUDA = "not measured (needs CUDA)"

CONSTANTS: tuple[ClusterConstant, ...] = (
    ClusterConstant(
        "cuda_context_bytes",
        "CUDA context and driver state per GPU, outside PyTorch's allocator (NVML used − reserved).",
        0.0, "not measured (no CUDA device on the measuring machine)", merge="keep_larger",
        measured_by="calibration.constants:context_bytes", used_by=("planner.budget.peak",)),
    ClusterConstant(
        "nccl_buffer_bytes", "NCCL communicator buffers per rank, outside PyTorch's allocator.",
        0.0, "not measured: run `torchrun -m calibration.collectives` and merge it",
        measured_by="calibration.collectives:measure", used_by=("planner.budget.peak",),
        used_when="multi_rank"),
    ClusterConstant(
        "reserve_fraction", "Minimum share of the usable HBM held back for fragmentation (at least 0.02).",
        0.02, "DESIGN §3.1 floor of the fragmentation reserve", default_status="policy",
        used_by=("planner.budget.peak",)),
    ClusterConstant(
        "fragmentation_fraction",
        "Measured (reserved − allocated) / reserved at peak; the reserve is never smaller.",
        0.0, _NEEDS_CUDA, measured_by="calibration.constants:fragmentation", used_by=("planner.budget.peak",)),
    ClusterConstant(
        "cublas_workspace_bytes", "cuBLAS workspace per handle/stream, in the allocator.",
        0.0, _NEEDS_CUDA, measured_by="calibration.constants:blas_workspaces",
        used_by=("planner.budget.workspace",)),
    ClusterConstant(
        "cublaslt_workspace_bytes", "cuBLASLt workspace, in the allocator (0 when unified with cuBLAS's).",
        0.0, _NEEDS_CUDA, measured_by="calibration.constants:blas_workspaces",
        used_by=("planner.budget.workspace",)),
    ClusterConstant(
        "flash_workspace_bytes_per_elem",
        "FlashAttention backward workspace (fp32 ``dq_accum`` + ``softmax_d``) per element of q.",
        0.0, _NEEDS_CUDA, measured_by="calibration.constants:flash_workspace",
        used_by=("planner.budget.workspace", "planner.budget.fsdp2_layer")),
    ClusterConstant(
        "host_baseline_bytes_per_rank",
        "Host RSS of one training process before any offload (torch, CUDA, data loader).",
        0.0, _NEEDS_CUDA, merge="keep_larger", measured_by="calibration.constants:host_baseline",
        used_by=("planner.budget.host",)),
    ClusterConstant(
        "host_reserve_fraction",
        "Share of host RAM held back for the OS, page cache and data loaders (default 0.10).",
        0.10, "DESIGN §3.3 default share of host RAM kept for the OS and loaders", default_status="policy",
        used_by=("planner.budget.host",)),
    ClusterConstant(
        "pin_seconds_per_gib",
        "Cost of pinning host memory with ``cudaHostRegister``, seconds per GiB (once per job).",
        0.0, _NEEDS_CUDA, measured_by="calibration.constants:pin_seconds_per_gib"),
)
"""Every cluster constant, in the order of the profile's ``memory`` section."""

BY_NAME = {c.name: c for c in CONSTANTS}
"""``name → ClusterConstant``."""


def keep_larger() -> tuple[str, ...]:
    """Constants ``calibration.merge`` never replaces by a smaller measurement."""
    return tuple(c.name for c in CONSTANTS if c.merge == "keep_larger")


def used(world_size: int) -> list[str]:
    """The constants a verdict at ``world_size`` ranks reads: those read always, in declaration order,
    then those read only when ``W > 1``."""
    always = [c.name for c in CONSTANTS if c.used_by and c.used_when == "always"]
    multi = [c.name for c in CONSTANTS if c.used_by and c.used_when == "multi_rank" and world_size > 1]
    return always + multi
