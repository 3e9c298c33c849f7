"""The caching allocator's mode for a run of a plan: the one its cluster file was measured under.

The budget's memory constants (fragmentation, workspaces) are measured with the mode the cluster
file declares (``memory.expandable_segments``, ``true`` for the shipped H200 file), and every live
set is a sum of the bytes each tensor *requests*. PyTorch's caching allocator only keeps those two
equal in that mode: with ``expandable_segments:True`` a block is split whenever at least 512 B
remain, so each tensor holds its size rounded up to 512 B. Without it, a large-pool block is split
only when more than 1 MiB would remain (``should_split`` in ``c10/cuda/CUDACachingAllocator.cpp``),
so a tensor just under a 2 MiB multiple (an 11 MiB expert shard in its 12 MiB segment) holds up to
1 MiB more than it asked for, and ``memory_allocated`` counts it. ``planner validate`` and
``planner.train`` therefore run in the cluster's mode (``bench/allocator_modes.py`` measures both).
"""

from __future__ import annotations

import os

from planner.errors import InvalidPlan

ENV_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""Where a user sets the allocator's options (the first is the newer name, read first)."""


def env_settings() -> str:
    """The allocator options of the environment (``""`` when none are set)."""
    return next((os.environ[v] for v in ENV_VARS if os.environ.get(v)), "")


def setting(expandable_segments: bool) -> str:
    return f"expandable_segments:{expandable_segments}"


def configure(torch, expandable_segments: bool) -> str:
    """Put this process's CUDA caching allocator in the cluster's mode; returns the line that says
    so (naming an environment setting it overrides). Segments created from here on follow it, so
    call it before the model is built.

    Raises:
        InvalidPlan: this torch cannot set the allocator's options at run time.
    """
    if not isinstance(expandable_segments, bool):
        raise InvalidPlan("memory.expandable_segments", expandable_segments, "must be true or false",
                          "write expandable_segments: true in the cluster file")
    text = setting(expandable_segments)
    # torch ≥ 2.10 names the setter in torch._C (the torch.cuda.memory one warns that it is deprecated)
    set_fn = (getattr(torch._C, "_accelerator_setAllocatorSettings", None) if hasattr(torch, "_C") else None) or \
        getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if set_fn is None:
        raise InvalidPlan("torch", torch.__version__, "cannot set the CUDA allocator's options at run time",
                          "install torch>=2.11 (the runtime extra)")
    set_fn(text)
    line = f"allocator: {text} (memory.expandable_segments of the cluster file)"
    env = env_settings()
    other = setting(not expandable_segments).lower()
    if other in env.replace(" ", "").lower():
        line += f"; the environment's '{env}' is overridden for this run"
    return line
