"""Rank layout, device meshes, activation checkpointing and tensor parallelism of the FSDP2
baseline (DESIGN §2); ``planner.runtime.fsdp2`` applies them in torchtitan's order.

Rank layout: ``rank = ((r_rep·dp_shard + r_shard)·cp + r_cp)·tp + r_tp``. Dense parameters are
sharded over ``dp_shard·cp`` (the ``fsdp`` mesh dimension) and replicated over ``dp_replicate``
(HSDP). Experts: ``ep`` consecutive ranks of one ``dp_shard·cp`` block form an expert group
(standard all-to-all EP, ``planner.runtime.expert_parallel``); each expert shard is FSDP-sharded
over the ``efsdp = dp_shard·cp/ep`` ranks holding it, times ``tp``.

Tensor parallelism (Megatron with sequence parallelism, torchtitan's plan): the embedding
row-parallel with a sequence-sharded output, norms ``SequenceParallel``, q/k/v and the gated FFN's
gate/up column-parallel, the output projections row-parallel back to the sequence layout, the
head column-parallel with its logits left sharded on the vocabulary for ``loss_parallel``. A MoE
block keeps its tokens local (the sequence shard): router, shared experts and experts are
replicated over ``tp``; so are QK-norm weights (the same tokens, a slice of the heads). Both
kinds are FSDP-sharded over a mesh that includes ``tp``, so their reduce-scatter also sums over
``tp``. Attention sinks are sliced per ``tp`` rank. MLA under ``tp > 1`` is not supported.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from planner.schema.knobs import default as knob_default

FP32 = torch.float32


@dataclass
class Layout:
    """Degrees of one baseline run (resolved ``BaselineKnobs`` plus ``W``)."""

    world_size: int
    tp: int = knob_default("tp")
    cp: int = knob_default("cp")
    dp_shard: int = 1
    dp_replicate: int = knob_default("dp_replicate")
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
                              "resolve the plan with planner.context.resolve")
        if (self.dp_shard * self.cp) % self.ep:
            raise InvalidPlan("layout.ep", self.ep, f"must divide dp_shard·cp ({self.dp_shard * self.cp})",
                              "resolve the plan with planner.context.resolve")

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
    compute-intensive ops, every SDPA variant (the CPU flash kernel too, so that the CPU trace
    keeps what the CUDA step keeps), ``linear``, ``max``, ``topk``, and the
    ``reduce_scatter_tensor`` / ``all_to_all_single`` functional collectives."""
    from torch._functorch.partitioners import get_default_op_list

    aten = torch.ops.aten
    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_flash_attention_for_cpu",
                 "max", "linear", "topk"):
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




# ---- tensor parallelism ---------------------------------------------------------------------

def is_moe(ffn: nn.Module) -> bool:
    from planner.runtime.moe_block import MoEBlock

    return isinstance(ffn, MoEBlock)


def tp_replicated_params(block: nn.Module) -> list[nn.Module]:
    """Sub-modules of a TP block whose parameters stay plain (replicated over ``tp``) and whose
    gradients must also be summed over ``tp``: QK-norms and the whole MoE block."""
    attn = block.attention
    out = [m for m in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)) if m is not None]
    if is_moe(block.ffn):
        out.append(block.ffn)
    return out


def apply_tp(decoder: nn.Module, tp_mesh, tp_rank: int) -> None:
    """Tensor parallelism over ``tp_mesh`` (module docstring).

    Raises:
        InvalidPlan: MLA attention or tied embeddings under ``tp > 1``.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   PrepareModuleInputOutput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    from planner.errors import InvalidPlan
    from planner.runtime.attention import Attention

    tp = tp_mesh.size()
    if decoder.head is None:
        raise InvalidPlan("plan.baseline.tp", tp, "needs an untied head (tied embeddings)", "use --tp 1")
    parallelize_module(decoder, tp_mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
    for block in decoder.layers:
        attn = block.attention
        if not isinstance(attn, Attention):
            raise InvalidPlan("plan.baseline.tp", tp, "is not supported with MLA attention", "use --tp 1")
        plan = {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None),
                                                desired_input_layouts=(Replicate(), None)),
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=Shard(1))}
        if is_moe(block.ffn):
            plan["ffn"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_input=True,
                output_layouts=(Shard(1),), desired_output_layouts=(Shard(1),), use_local_output=True)
        else:
            plan.update({"ffn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                         "ffn.w_gate": ColwiseParallel(), "ffn.w_up": ColwiseParallel(),
                         "ffn.w_down": RowwiseParallel(output_layouts=Shard(1))})
        parallelize_module(block, tp_mesh, plan)
        attn.nh, attn.nkv = attn.nh // tp, attn.nkv // tp          # heads of this rank
        if attn.sinks is not None:
            n = attn.nh
            attn.sinks = nn.Parameter(attn.sinks.detach()[tp_rank * n:(tp_rank + 1) * n].clone())
