"""Whole-step trace (DESIGN §8) of one rank of the composed step, phase by phase.

Setup (as ``planner.runtime.trace``): PyTorch's fake process group of ``W`` ranks as rank ``r``;
the groups and the device mesh, then the composed step itself
(``planner.runtime.mop.build_composed_step``), built **before** fake mode on the CPU (a mesh reads
its rank map with ``tolist``, and FSDP2's ``to_empty`` cannot swap meta parameters for fake ones):
the weights and the optimizer's host state are real, one rank's share. Then ``FakeTensorMode``
(real inputs allowed: the weights) with the shim's trace mode and CUDA-like SDPA allocations
(``trace_sdpa``), and ``MemTracker`` inside it with the model, the optimizer and the batch
registered through ``track_external``: a ``RealInputsTracker``, which counts the fake conversion of
a real weight, shard view or optimizer state as that real storage (the GPU allocates nothing for
it). Every MoE layer's dispatcher gets the integer plan of the
plan's routing profile and the Ring-DTP head its ``N_max`` (trace mode cannot read real counts).

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
from planner.runtime.validate import plan_dispatch, run_steps, synthetic_batch
from planner.runtime.validate_compare import Row, compare, verdict
from planner.runtime.validate_plan import GRAD_LIFETIMES, Prediction, predict, truncate

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


def _attach_without_pointer_check(dense) -> None:
    """The optimizer's proxies take the FSDP2 shards' gradients; the storage check of
    ``DenseShards.attach_grads`` reads ``data_ptr``, which fake tensors do not have."""
    def attach():
        for p, t in dense.pairs:
            t.grad = None if p.grad is None else p.grad.to_local()
    dense.attach_grads = attach


TRACE_EXCLUDES = ("workspace",)
"""Live sets a fake-tensor trace cannot see: library and kernel workspaces (measured constants)."""


def _planfile_arg(planfile, num_layers: int | None):
    """``planfile`` (a path or a ``PlanFile``) as a ``PlanFile``, cut to ``num_layers`` layers."""
    import os

    from planner.runtime.validation import check_int_range
    from planner.schema import PlanFile
    from planner.schema.io import load_planfile

    if isinstance(planfile, (str, os.PathLike)):
        planfile = load_planfile(planfile)
    elif not isinstance(planfile, PlanFile):
        raise ValueError(f"planfile ({type(planfile).__name__}) must be a plan file's path or a "
                         "planner.schema.PlanFile (planner search --out writes one)")
    if num_layers is not None:
        check_int_range("num_layers", num_layers, 1, planfile.model.num_layers,
                        fix="trace a few layers, e.g. num_layers=2")
    return truncate(planfile, num_layers).planfile


def trace_step(planfile, *, num_layers: int | None = None, rank: int = 0, grad_lifetime: str = "freed",
               steps: int = 2, tolerance: float = FORMULA_VS_TRACE) -> StepTrace:
    """Trace ``steps`` steps of rank ``rank`` of ``planfile``'s composed step; compare the last.

    ``planfile``: a plan file's path (``planner search --out``) or a ``PlanFile``; ``num_layers``:
    trace the model cut to that many decoder layers (``validate_plan.truncate``; widths, ``N``,
    degrees and knobs kept), ``None`` for all of them.

    Raises:
        ValueError: a bad argument (named) or plan file (``InvalidPlan``).
        RuntimeError: a non-fake process group is already initialised.
    """
    from planner.runtime.validation import check_choice, check_int_range, check_positive_ints

    planfile = _planfile_arg(planfile, num_layers)
    check_choice("grad_lifetime", grad_lifetime, GRAD_LIFETIMES)
    check_positive_ints(steps=steps)
    check_int_range("rank", rank, 0, planfile.plan.world_size - 1)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.runtime import mop_groups
    from planner.runtime.mop import build_composed_step, resolve_layout
    from planner.runtime.real_inputs_tracker import RealInputsTracker
    from planner.runtime.trace_sdpa import cuda_like_sdpa

    pred = predict(planfile, grad_lifetime, timing=False, dispatch_bound="expected", rank=rank)
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
        with shim.tracing():
            composed = build_composed_step(planfile, device=DEVICE, set_to_none=grad_lifetime == "freed")
        plan_dispatch(composed.model, pred.ctx)
        _attach_without_pointer_check(composed.dense)
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        # the real tensors' fake conversions count as the real storages, not as new allocations
        opt = _optimizer_holders(composed.optimizer)
        mt = RealInputsTracker(fake_mode, composed.model, *opt, composed.dense.proxies, composed.replicated.proxies)
        with fake_mode, shim.tracing(), cuda_like_sdpa():
            tokens, targets = synthetic_batch(pred.ctx, DEVICE, torch)
            mt.track_external(composed.model, *opt, tokens, targets)
            with mt:
                rec = PhaseRecorder(TrackerSource(mt, DEVICE.type))
                samples, start, _, _ = run_steps(composed, rec, tokens, targets, steps=steps)
            host = _host_bytes(mt)
    finally:
        mop_groups.make_groups = make_groups
        dist.destroy_process_group()
    rows = compare(pred, samples, start, under=tolerance, over=tolerance, exclude=TRACE_EXCLUDES)
    return StepTrace(pred, samples, start, rows, host)


def _optimizer_holders(optimizer) -> list:
    """The optimizer, and for ``MasterAdamW`` (``optimizer: gpu``) its inner AdamW (whose state holds
    the moments) and its fp32 masters: real tensors built with the step, outside the optimizer's own
    ``state``, that the tracker would otherwise not count (934 MB per rank for Qwen3-30B-A3B at
    W = 8 before they were)."""
    from planner.runtime.master_adamw import MasterAdamW

    if isinstance(optimizer, MasterAdamW):
        return [optimizer, optimizer.inner, *optimizer.device_tensors()]
    return [optimizer]


# ---- one checkpointed region ---------------------------------------------------------------------
@dataclass
class RegionTrace:
    """Traced bytes of one checkpointed region above its input (and the region's weights)."""

    kind: str
    forward_bytes: int
    """Peak of the non-saving forward (inside the region checkpoint), above the region input."""
    backward_bytes: int
    """Peak of recompute + backward above the region input and the incoming gradient, the
    region's weight gradients included."""
    weight_grad_bytes: int


def trace_region(planfile, r: int, *, rank: int = 0) -> RegionTrace:
    """Trace region ``r`` (1-based; ``attention`` or ``dense_mlp``) of ``planfile``'s decoder as the
    composed stack runs it: Ulysses over the plan's ``D``, non-reentrant region checkpoint, whole
    (gathered) weights, bf16. The MoE region's dispatch is traced by ``planner.runtime.dispatch_trace``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.budget.build import make_context
    from planner.runtime.attention import UlyssesCore, make_attention
    from planner.runtime.model_layers import GatedMLP, RMSNorm
    from planner.runtime.sco import checkpoint_region
    from planner.runtime.trace_sdpa import cuda_like_sdpa

    pf = planfile
    ctx = make_context(pf.model, pf.cluster, pf.workload, pf.plan)
    kind = ctx.regions[r - 1]
    if kind == "moe":
        raise ValueError("trace_region traces attention and dense_mlp regions")
    layer = (r - 1) // 2
    W, D = ctx.world_size, int(ctx.seq_parallel)
    B = int(ctx.seqs_per_microbatch)
    T, H, dt = int(ctx.tokens_per_rank) // B, ctx.hidden_size, torch.bfloat16
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=W)
    try:
        group = dist.new_group(list(range(D))) if D < W else dist.group.WORLD
        with FakeTensorMode(), shim.tracing(), cuda_like_sdpa():
            kw = dict(device=DEVICE, dtype=dt)
            norm = RMSNorm(H, **kw)
            if kind == "attention":
                body = make_attention(ctx.model, layer, UlyssesCore(group), **kw)
            else:
                body = GatedMLP(H, ctx.dense_ffn, **kw)
            mods = torch.nn.ModuleList([norm, body])
            pos = torch.arange(rank % D * T, rank % D * T + T, device=DEVICE)

            def region(h):
                x = norm(h)
                return h + (body(x, pos) if kind == "attention" else body(x))

            h = torch.empty(B, T, H, dtype=dt, device=DEVICE, requires_grad=True)
            mt = MemTracker()
            mt.track_external(mods, h, pos)
            src = TrackerSource(mt, DEVICE.type)
            with mt:
                base = src.current()
                src.reset()
                out = checkpoint_region(region, h)
                fwd = src.peak()[0] - base
                g = torch.empty_like(out)
                base_b = src.current()
                src.reset()
                out.backward(g)
                bwd = src.peak()[0] - (base_b - out.untyped_storage().nbytes())
            wg = sum(p.numel() * p.element_size() for p in mods.parameters())
    finally:
        dist.destroy_process_group()
    return RegionTrace(kind, fwd, bwd, wg)
