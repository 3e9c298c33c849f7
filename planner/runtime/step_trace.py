"""Whole-step trace (DESIGN §8) of one rank of the composed step, phase by phase.

Setup (as ``planner.runtime.trace``): PyTorch's fake process group of ``W`` ranks as rank ``r``,
the device mesh built **before** fake mode (a mesh's rank map is read with ``tolist``), then
``FakeTensorMode`` with the shim's trace mode, the composed step built inside it
(``planner.runtime.mop.build_composed_step``: device tensors fake ``cpu``, host buffers fake
``meta``), and ``MemTracker`` entered inside fake mode with the model, the optimizer state and the
batch registered through ``track_external``.

Per phase: the step's ``on_phase`` hook drives a ``PhaseRecorder`` over ``MemTracker``'s current
and peak bytes of the fake ``cpu`` device (``TrackerSource``), the same recorder ``planner
validate`` drives over the CUDA allocator. The comparison (``validate_compare.compare``) is the
same too, so a trace and a GPU measurement of one plan line up row by row.

``trace_step(planfile, ...)`` runs ``steps`` steps (the first creates the optimizer's lazy state;
the last is compared) and returns the rows; ``trace_planfile`` builds the plan file of a shipped
model at a given ``W``, ``S`` and depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from planner.runtime import shim
from planner.runtime.phase_recorder import PhaseRecorder, TrackerSource
from planner.runtime.trace import DEVICE
from planner.runtime.validate import run_steps, synthetic_batch
from planner.runtime.validate_compare import Row, compare, verdict
from planner.runtime.validate_plan import Prediction, predict, truncate

FORMULA_VS_TRACE = 0.01
"""DESIGN §8: formula vs trace, both ways."""


@dataclass
class StepTrace:
    """One traced rank: the prediction, the per-phase samples and the rows."""

    prediction: Prediction
    samples: dict
    step_start_bytes: int
    rows: list[Row]
    host_peak_bytes: int

    @property
    def ok(self) -> bool:
        return verdict(self.rows)

    def worst(self) -> Row:
        """The judged row furthest from its measurement."""
        judged = [r for r in self.rows if r.judged and r.measured]
        return max(judged, key=lambda r: abs((r.ratio or 0) - 1))


def trace_planfile(model: str, *, world_size: int, seq_len: int, layers: int = 2, **overrides):
    """The composed plan file of a shipped ``model`` at ``W``, ``S``, truncated to ``layers``."""
    from planner.api import build_planfile

    pf = build_planfile(model=model, gpus=world_size, seq_len=seq_len, overrides=overrides)
    return truncate(pf, layers).planfile


def _host_bytes(mt) -> int:
    return sum(int(c.get("Total", 0)) for d, c in mt.get_tracker_snapshot("peak").items()
               if torch.device(d).type == "meta")


TRACE_EXCLUDES = ("workspace",)
"""Live sets a fake-tensor trace cannot see: library and kernel workspaces (measured constants)."""


def trace_step(planfile, *, rank: int = 0, grad_lifetime: str = "freed", steps: int = 2,
               tolerance: float = FORMULA_VS_TRACE) -> StepTrace:
    """Trace ``steps`` steps of rank ``rank`` of ``planfile``'s composed step; compare the last.

    Raises:
        RuntimeError: a non-fake process group is already initialised.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.runtime import mop_groups
    from planner.runtime.mop import build_composed_step, resolve_layout
    from planner.runtime.trace_sdpa import cuda_like_sdpa

    pred = predict(planfile, grad_lifetime, timing=False, dispatch_bound="expected")
    W = pred.ctx.world_size
    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise RuntimeError("trace_step needs a process without a real process group")
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=W)
    make_groups = mop_groups.make_groups
    try:
        # the groups and the mesh are built before fake mode (a mesh reads its rank map with tolist)
        lay = resolve_layout(planfile)
        groups = make_groups(lay.W, lay.D, lay.Ep, lay.P, DEVICE.type)
        mop_groups.make_groups = lambda *a, **k: groups
        with FakeTensorMode(allow_non_fake_inputs=False), shim.tracing(), cuda_like_sdpa():
            composed = build_composed_step(planfile, device=DEVICE, set_to_none=grad_lifetime == "freed")
            tokens, targets = synthetic_batch(pred.ctx, DEVICE, torch)
            mt = MemTracker()
            mt.track_external(composed.model, composed.optimizer, tokens, targets)
            with mt:
                rec = PhaseRecorder(TrackerSource(mt, DEVICE.type))
                samples, start, _, _ = run_steps(composed, rec, tokens, targets, steps=steps)
            host = _host_bytes(mt)
    finally:
        mop_groups.make_groups = make_groups
        dist.destroy_process_group()
    rows = compare(pred, samples, start, under=tolerance, over=tolerance, exclude=TRACE_EXCLUDES)
    return StepTrace(pred, samples, start, rows, host)
