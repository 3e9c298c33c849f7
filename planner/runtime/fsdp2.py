"""The FSDP2 baseline of DESIGN §2, applied to the shared decoder with torch's own APIs.

Order and options follow torchtitan's ``parallelize`` (read for understanding, not copied):

1. tensor parallelism (``parallelize_module``): the embedding row-parallel with a sequence-parallel
   output, norms ``SequenceParallel``, q/k/v and the gated-FFN up projections column-parallel, the
   output projections row-parallel back to the sequence-parallel layout, and the head
   column-parallel with its output kept sharded on the vocabulary for ``loss_parallel``. A MoE
   block takes its tokens local (sequence-parallel shard): its router, shared experts and experts
   are replicated over ``tp`` and their gradients reduced over ``dp_shard·cp·tp`` by FSDP;
2. activation checkpointing per block (``checkpoint_wrapper``): ``full``, ``selective`` with
   torchtitan's op-level policy (``sac_policy``), or none;
3. ``fully_shard`` on the routed experts (expert mesh), the embedding, each block, ``[norm, head]``
   (``reshard_after_forward=False``, as torchtitan's default policy sets for the last unit) and the
   root, with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32, cast_forward_inputs=False)``
   and optionally ``CPUOffloadPolicy``; gradient division off, the loss divided by the global token
   count instead (torchtitan's convention);
4. context parallelism at step time: ``context_parallel(cp_mesh, buffers=[tokens, targets, positions])``
   with ``set_rotate_method(cp_rotate)``;
5. AdamW (``fused`` on CUDA, ``foreach`` on CPU) over the sharded parameters.

Rank layout: ``rank = ((r_rep·dp_shard + r_shard)·cp + r_cp)·tp + r_tp``. Dense parameters are
sharded over ``dp_shard·cp`` (the ``fsdp`` mesh dimension) and replicated over ``dp_replicate``
(HSDP). Experts: ``ep`` consecutive ranks of one ``dp_shard·cp`` block form an expert group
(standard all-to-all EP, ``planner.runtime.expert_parallel``); each expert shard is FSDP-sharded
over the ``efsdp = dp_shard·cp/ep`` groups times ``tp``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

FP32 = torch.float32


@dataclass
class Layout:
    """Degrees of one baseline run (resolved ``BaselineKnobs`` plus ``W``)."""

    world_size: int
    tp: int = 1
    cp: int = 1
    dp_shard: int = 1
    dp_replicate: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        from planner.errors import InvalidPlan

        for name in ("tp", "cp", "dp_shard", "dp_replicate", "ep"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise InvalidPlan(f"layout.{name}", v, "must be a positive int", "resolve the plan first")
        prod = self.dp_replicate * self.dp_shard * self.cp * self.tp
        if prod != self.world_size:
            raise InvalidPlan("layout", (self.dp_replicate, self.dp_shard, self.cp, self.tp),
                              f"dp_replicate·dp_shard·cp·tp = {prod} must equal world_size ({self.world_size})",
                              "resolve the plan with planner.budget.resolve")
        if (self.dp_shard * self.cp) % self.ep:
            raise InvalidPlan("layout.ep", self.ep, f"must divide dp_shard·cp ({self.dp_shard * self.cp})",
                              "resolve the plan with planner.budget.resolve")

    @property
    def fsdp(self) -> int:
        return self.dp_shard * self.cp

    @property
    def efsdp(self) -> int:
        return self.fsdp // self.ep

    def coords(self, rank: int) -> dict:
        """``r_rep, r_shard, r_cp, r_tp`` and the expert coordinates of ``rank``."""
        r_tp = rank % self.tp
        r_cp = rank // self.tp % self.cp
        r_shard = rank // (self.tp * self.cp) % self.dp_shard
        r_rep = rank // (self.tp * self.cp * self.dp_shard)
        f = r_shard * self.cp + r_cp
        return dict(rep=r_rep, shard=r_shard, cp=r_cp, tp=r_tp, ep=f % self.ep, efsdp=f // self.ep,
                    batch=r_rep * self.dp_shard + r_shard)

    @property
    def data_parallel(self) -> int:
        """Distinct batches per micro-step (``dp_replicate·dp_shard``)."""
        return self.dp_replicate * self.dp_shard


@dataclass
class Meshes:
    """Device meshes of one layout (built collectively on every rank)."""

    dense: object          # ("dp_replicate", "fsdp", "tp")
    cp: object             # ("cp",) per data-parallel coordinate
    expert: object         # ("dp_replicate", "ep", "efsdp_tp")
    flat: object           # ("dp_replicate", "fsdp_tp"): replicated-over-tp MoE parameters
    layout: Layout

    @property
    def dp(self):
        """The FSDP mesh of dense parameters: ``fsdp`` (or ``dp_replicate × fsdp`` for HSDP)."""
        return self.dense["dp_replicate", "fsdp"] if self.layout.dp_replicate > 1 else self.dense["fsdp"]

    @property
    def tp(self):
        return self.dense["tp"]

    @property
    def ep_group(self):
        return self.expert["ep"].get_group()

    @property
    def expert_dp(self):
        m = self.expert
        return m["dp_replicate", "efsdp_tp"] if self.layout.dp_replicate > 1 else m["efsdp_tp"]

    @property
    def moe_dp(self):
        m = self.flat
        return m["dp_replicate", "fsdp_tp"] if self.layout.dp_replicate > 1 else m["fsdp_tp"]


def build_meshes(layout: Layout, device_type: str) -> Meshes:
    """Every mesh of the layout, over ``arange(W)`` reshaped as in the module docstring."""
    from torch.distributed.device_mesh import DeviceMesh

    L = layout
    ranks = torch.arange(L.world_size).reshape(L.dp_replicate, L.dp_shard, L.cp, L.tp)
    dense = DeviceMesh(device_type, ranks.reshape(L.dp_replicate, L.fsdp, L.tp),
                       mesh_dim_names=("dp_replicate", "fsdp", "tp"))
    cp = DeviceMesh(device_type, ranks.permute(0, 1, 3, 2).reshape(-1, L.cp), mesh_dim_names=("dp_tp", "cp"))
    # expert layout: the fsdp block splits as (efsdp, ep); ep groups are consecutive in fsdp
    e = ranks.reshape(L.dp_replicate, L.efsdp, L.ep, L.tp).permute(0, 2, 1, 3)
    expert = DeviceMesh(device_type, e.reshape(L.dp_replicate, L.ep, L.efsdp * L.tp),
                        mesh_dim_names=("dp_replicate", "ep", "efsdp_tp"))
    flat = DeviceMesh(device_type, ranks.reshape(L.dp_replicate, L.fsdp * L.tp),
                      mesh_dim_names=("dp_replicate", "fsdp_tp"))
    return Meshes(dense=dense, cp=cp["cp"], expert=expert, flat=flat, layout=L)


# ---- activation checkpointing ---------------------------------------------------------------

def sac_save_ops() -> set:
    """Ops whose outputs torchtitan's op-level selective AC saves: the partitioner's
    compute-intensive ops, every SDPA variant, ``linear``, ``max``, ``topk``, and the
    ``reduce_scatter_tensor`` / ``all_to_all_single`` functional collectives."""
    from torch._functorch.partitioners import get_default_op_list

    aten = torch.ops.aten
    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_fused_attention_overrideable", "max", "linear", "topk"):
        if hasattr(aten, name):
            ops.add(getattr(aten, name).default)
    c10d = torch.ops._c10d_functional
    ops.update({c10d.reduce_scatter_tensor.default, c10d.all_to_all_single.default})
    return ops


def sac_policy(recompute_mm_shapes: set) -> Callable:
    """A fresh policy of torchtitan's op-level SAC: save the ``sac_save_ops`` outputs except every
    second ``mm``/``linear`` (counted separately in forward and recompute), always recompute
    matmuls whose weight has one of ``recompute_mm_shapes`` (``(in, out)``: the router gate), and
    save device→host copies."""
    from torch.utils.checkpoint import CheckpointPolicy

    save = sac_save_ops()
    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if (func == torch.ops.aten._to_copy.default and args[0].device.type == "cuda"
                and str(kwargs.get("device", "")) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            shape = tuple(args[1].shape)
            if func == torch.ops.aten.linear.default:
                shape = shape[::-1]
            if shape in recompute_mm_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            count[mode] += 1
        if func in save:
            if func in mm_ops and count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _combined(fns: list) -> tuple:
    """One (forward, recompute) context pair entering every pair of ``fns``."""
    pairs = [f() for f in fns]

    @contextlib.contextmanager
    def enter(i):
        with contextlib.ExitStack() as st:
            for p in pairs:
                st.enter_context(p[i])
            yield

    return enter(0), enter(1)


def apply_ac(block: nn.Module, mode: str, *, router_shapes: set, extra_context: list) -> nn.Module:
    """``block`` wrapped for ``mode`` (``full`` | ``selective`` | ``none``). ``extra_context``:
    ``context_fn``s to enter too (the EP operator's plan reuse)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if mode == "none":
        return block
    fns = list(extra_context)
    if mode == "selective":
        fns.append(lambda: create_selective_checkpoint_contexts(sac_policy(router_shapes)))
    elif mode != "full":
        from planner.errors import InvalidPlan

        raise InvalidPlan("plan.baseline.ac", mode, "must be full, selective or none", "use --ac full")
    kw = dict(context_fn=lambda: _combined(fns)) if fns else {}
    return checkpoint_wrapper(block, preserve_rng_state=False, early_stop=False, **kw)


@dataclass
class FSDPOptions:
    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = FP32
    cpu_offload: bool = False

    def config(self, mesh) -> dict:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        mp = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype,
                                  cast_forward_inputs=False)
        cfg = dict(mesh=mesh, mp_policy=mp)
        if self.cpu_offload:
            cfg["offload_policy"] = CPUOffloadPolicy()
        return cfg


@dataclass
class PhaseHook:
    """Calls ``on_phase(name, r)`` at the DESIGN §3.1 phase boundaries of the baseline step
    (``r`` = 1-based layer: one checkpointed region per block)."""

    on_phase: Callable | None = None
    log: list = field(default_factory=list)

    def __call__(self, name: str, r: int | None) -> None:
        self.log.append((name, r))
        if self.on_phase is not None:
            self.on_phase(name, r)


class _BackwardMark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cb):
        ctx.cb = cb
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.cb()
        return g, None
