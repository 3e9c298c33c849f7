"""Whole-step trace of one rank of the FSDP2 baseline (DESIGN §8), phase by phase.

``fully_shard`` cannot be built under ``FakeTensorMode`` here: FSDP2 allocates its sharded and
padded parameters, and reads the mesh and the process group, while it is applied, outside any
fake-tensor contract; so the baseline is traced on **real CPU tensors** at a small width under
PyTorch's fake process group (``W`` ranks emulated, collectives that move nothing), with
``MemTracker`` counting the CPU storages (``TrackerSource``) through the step's ``on_phase`` hook
— the same recorder and comparison ``planner validate`` uses over the CUDA allocator. The CPU
SDPA kernel is not the CUDA one (its saved tensors differ), so the compared live sets leave out
``workspace``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from planner.runtime.phase_recorder import PhaseRecorder, TrackerSource
from planner.runtime.validate import plan_dispatch, run_steps, synthetic_batch
from planner.runtime.validate_compare import compare
from planner.runtime.validate_plan import predict

TRACE_EXCLUDES = ("workspace",)


def trace_fsdp2(planfile, *, rank: int = 0, grad_lifetime: str = "freed", steps: int = 2,
                tolerance: float = 0.01):
    """``(prediction, samples, step_start_bytes, rows)`` of rank ``rank`` of an ``fsdp2`` plan file."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.runtime.fsdp2 import build_from_planfile

    pred = predict(planfile, grad_lifetime, timing=False, dispatch_bound="expected", rank=rank)
    W = pred.ctx.world_size
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=W)
    try:
        torch.manual_seed(0)
        step = build_from_planfile(planfile, device=torch.device("cpu"), rank=rank, grad_lifetime=grad_lifetime)
        plan_dispatch(step.model, pred.ctx)   # the plan's routing profile, as `planner validate` runs it
        tokens, targets = synthetic_batch(pred.ctx, "cpu", torch)
        for _ in range(steps - 1):   # untracked: creates AdamW's state (MemTracker traces one iteration)
            step.step(tokens, targets)
        mt = MemTracker()
        mt.track_external(step.model, step.optimizer, tokens, targets)
        with mt:
            rec = PhaseRecorder(TrackerSource(mt, "cpu"))
            samples, start, _, _ = run_steps(step, rec, tokens, targets, steps=1)
    finally:
        dist.destroy_process_group()
    rows = compare(pred, samples, start, under=tolerance, over=tolerance, exclude=TRACE_EXCLUDES)
    return pred, samples, start, rows
