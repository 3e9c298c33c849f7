"""The chunk-count calibration hook of PipelinedLLEP (``calibration/chunks.py`` loads it by name).

It builds the operator through ``planner.runtime.dispatch_trace`` (the traced-layer builder), which
imports the operator; kept out of ``pipelined_llep.py`` so that the operator does not import its own
harness.

On one GPU (no process group) the curve is measured on rank 0 of ``EMULATED_EXPERT_PARALLEL``
expert-parallel ranks under the fake process group (``emulation``): real memory and kernels, no-op
communication, every all-to-all output written from random data (``emulated_fill``).
"""

from __future__ import annotations

import contextlib

import torch

from planner.runtime import shim
from planner.runtime.dispatch_trace import DispatchShape, build_layer, make_plan
from planner.runtime.emulated_fill import FilledAllToAll
from planner.runtime.exchange import _is_fake
from planner.units import ceil_div

EMULATED_EXPERT_PARALLEL = 8
"""``E_p`` of the curve measured on one GPU: the expert-parallel degree the search picks for
PipelinedLLEP on a node (shape A's 128 experts, 16 per rank; ``K = 10`` chunks of 16 slots), whose
chunk loops are GPU-bound. At ``E_p = 1`` (128 slots per chunk) the loops of ``K ≥ 5`` are bound by
the host's launches, so the curve's measured/replayed ratio there is the host's pace, which moves by
up to 1.5× within one instance (README: the time model)."""
FULL_DIMS = dict(N=65536, H=7168, I=2048, E=128, k=8)
"""Reference shape A per rank."""
SMOKE_DIMS = dict(N=512, H=64, I=32, E=16, k=4)
"""Tiny shape of ``--smoke`` (the same code paths)."""


@contextlib.contextmanager
def emulation(device: torch.device):
    """Around the curve's runs: without a process group, the fake one at ``E_p =
    EMULATED_EXPERT_PARALLEL`` (this process is rank 0) with every all-to-all output filled from
    random data, yielding the ``FilledAllToAll`` (its ``nbytes`` counts the fills); on a real
    process group, nothing (the curve runs on it; yields None)."""
    if shim.dist.is_initialized():
        yield None
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    shim.dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=EMULATED_EXPERT_PARALLEL)
    try:
        with FilledAllToAll(device) as fill:
            yield fill
    finally:
        shim.dist.destroy_process_group()


def calibration_case(num_chunks: int, *, smoke: bool, device, dims: dict | None = None):
    """Hook of ``calibration/chunks.py``: one forward+backward of PipelinedLLEP with
    ``K = num_chunks`` on the current process group (under ``emulation``: rank 0 of the fake one),
    balanced routing.

    Shape per rank: ``dims`` (``N, H, I, E, k``; default reference shape A, ``FULL_DIMS``, or
    ``SMOKE_DIMS`` under ``smoke``), ``E_p`` =
    the group size, ``c = ceil(N/K)``, ``K_max = max(K, 10)``. On a real group the plan comes from
    the real route counts (all-gather and all-reduce-max); on the fake one from the balanced
    routing's counts. Returns ``(run, shape)``.
    """
    if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive int, got {num_chunks!r}")
    world = shim.group_size(None)
    dims = dims or (SMOKE_DIMS if smoke else FULL_DIMS)
    if dims["E"] % world:
        raise ValueError(f"the process group's {world} ranks must divide the curve's {dims['E']} experts")
    s = DispatchShape(**dims, E_p=world, c=ceil_div(dims["N"], num_chunks), K_max=max(num_chunks, 10),
                      m=8 if smoke else 1024)
    plan = make_plan("pipelined_llep", s, "balanced") if world > 1 and _is_fake(None) else None
    _, run = build_layer("pipelined_llep", s, plan, "balanced", device=device, init=True)
    shape = dict(tokens_per_rank=s.N, hidden_size=s.H, expert_ffn=s.I, num_experts=s.E, top_k=s.k,
                 expert_parallel=world)
    return (lambda: run()), shape
