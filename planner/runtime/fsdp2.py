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


# ---- tensor parallelism ---------------------------------------------------------------------

ATTN_COL = ("wq", "wk", "wv", "wq_a", "wq_b", "wkv_a", "wkv_b")
ATTN_ROW = ("wo",)
FFN_COL = ("w1", "w3")
FFN_ROW = ("w2",)


def _linear_plan(module: nn.Module, col: tuple, row: tuple, *, sp_output: bool = True) -> dict:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for name, sub in module.named_children():
        if not isinstance(sub, nn.Linear):
            continue
        if name in col:
            plan[name] = ColwiseParallel()
        elif name in row:
            plan[name] = RowwiseParallel(output_layouts=Shard(1)) if sp_output else RowwiseParallel()
    return plan


def is_moe(ffn: nn.Module) -> bool:
    """A MoE block exposes its routed experts as ``ffn.experts`` (an ``ExpertShard``)."""
    return hasattr(ffn, "experts") and hasattr(ffn, "router")


def apply_tp(model: nn.Module, tp_mesh, *, loss_parallel_head: bool) -> None:
    """Megatron-style TP with sequence parallelism over ``tp_mesh`` (module docstring, step 1).

    Raises:
        InvalidPlan: a block's attention has no q/k/v/o projections to shard.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   PrepareModuleInputOutput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    from planner.errors import InvalidPlan

    top = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
           "norm": SequenceParallel()}
    if model.head is not None:
        top["head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel_head
                                      else Replicate(), use_local_output=not loss_parallel_head)
    parallelize_module(model, tp_mesh, top)
    for block in model.layers:
        attn = block.attention
        plan = {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))}
        lin = _linear_plan(attn, ATTN_COL, ATTN_ROW)
        if not any(isinstance(v, RowwiseParallel) for v in lin.values()):
            raise InvalidPlan("plan.baseline.tp", tp_mesh.size(), "needs attention projections wq/wk/wv/wo "
                              "to shard", "use --tp 1 for this model")
        plan.update({f"attention.{k}": v for k, v in lin.items()})
        if is_moe(block.ffn):
            # tokens stay on their sequence-parallel rank; MoE parameters replicated over tp
            plan["ffn"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_input=True,
                output_layouts=(Shard(1),), desired_output_layouts=(Shard(1),), use_local_output=False)
        else:
            plan["ffn"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan.update({f"ffn.{k}": v for k, v in _linear_plan(block.ffn, FFN_COL, FFN_ROW).items()})
        parallelize_module(block, tp_mesh, plan)


# ---- FSDP2 ------------------------------------------------------------------------------------

def apply_fsdp(model: nn.Module, root: nn.Module, meshes: Meshes, opts: FSDPOptions) -> None:
    """``fully_shard`` per unit, in torchtitan's order (module docstring, step 3).

    ``model`` is the decoder (its blocks possibly checkpoint-wrapped); ``root`` the module whose
    forward runs the step (FSDP's root)."""
    from torch.distributed.fsdp import fully_shard

    dense = opts.config(meshes.dp)
    if model.embed is not None:
        fully_shard(model.embed, **dense, reshard_after_forward=True)
    for block in model.layers:
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        if is_moe(inner.ffn):
            fully_shard(inner.ffn.experts, **opts.config(meshes.expert_dp), reshard_after_forward=True)
            if meshes.layout.tp > 1:   # router / shared experts replicated over tp: reduce over tp too
                fully_shard(inner.ffn, **opts.config(meshes.moe_dp), reshard_after_forward=True)
        fully_shard(block, **dense, reshard_after_forward=True)
    last = [m for m in (model.norm, model.head) if m is not None]
    fully_shard(last, **dense, reshard_after_forward=False)
    fully_shard(root, **dense)
    for m in root.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)   # the loss is divided by the global token count


# ---- the step -------------------------------------------------------------------------------

def _install_chunked_head(head: nn.Linear, chunk_tokens: int) -> None:
    """Make ``head(x, targets, divisor)`` return the chunked linear cross-entropy, so the loss runs
    inside the head's own forward (FSDP's hooks unshard and reduce its weight as usual)."""
    import types

    from planner.runtime.chunked_ce import chunked_linear_cross_entropy

    def forward(self, x, targets, divisor):
        return chunked_linear_cross_entropy(x.flatten(0, 1), targets.flatten(), self.weight,
                                            chunk_tokens=chunk_tokens, reduction="sum", divisor=divisor)

    head.forward = types.MethodType(forward, head)


class BaselineLM(nn.Module):
    """FSDP's root: embedding, blocks, final norm and the loss of the chosen head, summed over
    the local tokens and divided by ``divisor`` (the global token count)."""

    def __init__(self, decoder: nn.Module, head_kind: str, tp: int) -> None:
        super().__init__()
        self.decoder, self.head_kind, self.tp = decoder, head_kind, tp

    def forward(self, tokens, targets, divisor):
        import torch.nn.functional as F

        d = self.decoder
        x = d.embed(tokens)
        for block in d.layers:
            x = block(x)
        x = d.norm(x)
        if self.head_kind == "chunked":
            return d.head(x, targets, divisor)
        w_head = d.head if d.head is not None else None
        logits = w_head(x) if w_head is not None else x @ d.embed.weight.t()
        if self.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum") / divisor
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum") / divisor


@dataclass
class BaselineStep:
    """The FSDP2 baseline's training step on one rank: ``.model``, ``.optimizer``, ``.step``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    layout: Layout
    meshes: Meshes
    cp_rotate: str = "allgather"
    grad_lifetime: str = "freed"
    hook: PhaseHook = field(default_factory=PhaseHook)

    def step(self, tokens, targets):
        """One micro-step and the optimizer: ``tokens``/``targets`` ``[B, S]`` are this rank's
        data-parallel batch (whole sequences; context parallelism shards them here). Returns the
        rank's share of the global mean loss (sum over the dp/cp ranks of one tp coordinate)."""
        L = self.layout
        divisor = tokens.numel() * L.data_parallel
        if L.cp > 1:
            from torch.distributed.tensor.experimental import context_parallel
            from torch.distributed.tensor.experimental._attention import set_rotate_method

            set_rotate_method(self.cp_rotate)
            tokens, targets = tokens.clone(), targets.clone()
            with context_parallel(self.meshes.cp, buffers=[tokens, targets], buffer_seq_dims=[1, 1],
                                  no_restore_buffers={tokens, targets}):
                loss = self.model(tokens, targets, divisor)
                loss.backward()
        else:
            loss = self.model(tokens, targets, divisor)
            loss.backward()
        self.hook("optimizer", None)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.grad_lifetime == "freed")
        loss = loss.detach()
        return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


def _install_phase_hooks(decoder: nn.Module, hook: PhaseHook) -> None:
    for i, block in enumerate(decoder.layers, start=1):
        block.register_forward_pre_hook(lambda m, a, r=i: hook("forward", r))
        block.register_forward_hook(
            lambda m, a, out, r=i: _BackwardMark.apply(out, lambda: hook("backward", r)))
    decoder.norm.register_forward_pre_hook(lambda m, a: hook("head", None))


def set_ep_group(decoder: nn.Module, group) -> None:
    """Point every MoE block's all-to-all operator at the expert group."""
    for block in decoder.layers:
        if is_moe(block.ffn):
            block.ffn.dispatch.group = group


def build_baseline_step(decoder: nn.Module, layout: Layout, *, ac: str = "full", head: str = "dense",
                        head_chunk_tokens: int = 4096, cpu_offload: bool = False,
                        cp_rotate: str = "allgather", grad_lifetime: str = "freed",
                        param_dtype: torch.dtype = torch.bfloat16, lr: float = 1e-3,
                        on_phase: Callable | None = None, meshes: Meshes | None = None) -> BaselineStep:
    """Apply the baseline layout to ``decoder`` (built with the *whole* model on every rank, its
    MoE blocks holding this rank's ``E/ep`` experts) and return its step.

    Raises:
        InvalidPlan: a knob torch's APIs would reject (checked before anything is built).
    """
    from planner.errors import InvalidPlan

    if head not in ("dense", "chunked"):
        raise InvalidPlan("plan.baseline.head", head, "must be dense or chunked", "use --head dense")
    if head == "chunked" and (layout.tp > 1 or decoder.head is None):
        raise InvalidPlan("plan.baseline.head", head, "needs tp = 1 and an untied head", "use --head dense")
    if cp_rotate not in ("allgather", "alltoall"):
        raise InvalidPlan("plan.baseline.cp_rotate", cp_rotate, "must be allgather or alltoall",
                          "use --cp-rotate allgather")
    if grad_lifetime not in ("freed", "kept"):
        raise InvalidPlan("plan.baseline.grad_lifetime", grad_lifetime, "must be freed or kept",
                          "use --grad-lifetime freed")
    device = next(decoder.parameters()).device
    meshes = meshes or build_meshes(layout, device.type)
    set_ep_group(decoder, meshes.ep_group)
    if layout.tp > 1:
        apply_tp(decoder, meshes.tp, loss_parallel_head=True)
    if head == "chunked":
        _install_chunked_head(decoder.head, head_chunk_tokens)
    router_shapes = set()
    for i, block in enumerate(decoder.layers):
        extra = [block.ffn.dispatch.plan_reuse] if is_moe(block.ffn) else []
        if is_moe(block.ffn):
            w = block.ffn.router.weight
            router_shapes.add((w.shape[1], w.shape[0]))
        decoder.layers[i] = apply_ac(block, ac, router_shapes=router_shapes, extra_context=extra)
    root = BaselineLM(decoder, head, layout.tp)
    apply_fsdp(decoder, root, meshes, FSDPOptions(param_dtype=param_dtype, cpu_offload=cpu_offload))
    hook = PhaseHook(on_phase)
    _install_phase_hooks(decoder, hook)
    params = [p for p in root.parameters() if p.requires_grad]
    on_cuda = params[0].device.type == "cuda" or cpu_offload
    opt = torch.optim.AdamW(params, lr=lr, fused=True) if on_cuda else torch.optim.AdamW(params, lr=lr, foreach=True)
    return BaselineStep(root, opt, layout, meshes, cp_rotate=cp_rotate, grad_lifetime=grad_lifetime, hook=hook)
