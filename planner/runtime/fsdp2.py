"""The FSDP2 baseline of DESIGN §2, applied to the shared decoder with torch's own APIs.

Order and options follow torchtitan's ``parallelize`` (read for understanding, not copied):

1. tensor parallelism (``planner.runtime.fsdp2_layout.apply_tp``), with ``loss_parallel``;
2. activation checkpointing per layer (``checkpoint_wrapper``): ``full``, ``selective`` with
   torchtitan's op-level policy (``fsdp2_layout.sac_policy``), or none;
3. ``fully_shard`` on the routed experts (expert mesh), the TP-replicated parameters (mesh with
   ``tp``), the embedding, each layer, ``[norm, head]`` (``reshard_after_forward=False``, what
   torchtitan's default policy sets for the last unit) and the root, all with
   ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32, cast_forward_inputs=False)`` and
   optionally ``CPUOffloadPolicy``; gradient division off and the loss divided by the global
   token count instead (torchtitan's convention), so HSDP, EP and CP all reduce sums;
4. context parallelism at step time: ``context_parallel(cp_mesh, buffers=[tokens, targets,
   positions])`` after ``set_rotate_method(cp_rotate)``;
5. AdamW (``fused=True``, torchtitan's default; the CPU kernel under CPU offload).

Heads (``head``): ``dense`` — ``cross_entropy(x @ w.T)`` with fp32 logits, and under ``tp > 1``
the vocabulary-sharded logits through ``loss_parallel``; ``chunked`` — the chunked linear
cross-entropy of ``planner.runtime.chunked_ce`` (``tp = 1``).

Gradient lifetime: ``freed`` calls ``zero_grad(set_to_none=True)`` after the optimizer (no
gradient exists in the next forward); ``accumulate`` zeroes them in place, as accumulation keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from planner.runtime.fsdp2_layout import (FP32, Layout, Meshes, apply_ac,
                                          apply_tp, build_meshes, is_moe, tp_replicated_params)
from planner.schema.plan import BaselineKnobs
from planner.schema.knobs import default as knob_default

HEAD_CHUNK_TOKENS = BaselineKnobs.model_fields["head_chunk_tokens"].default
"""The chunked head's tokens per chunk, as the plan schema declares it."""


@dataclass
class FSDPOptions:
    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = FP32
    cpu_offload: bool = knob_default("cpu_offload")

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




class LayerUnit(nn.Module):
    """One decoder layer as the baseline checkpoints and shards it (one region per layer)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, h_BTH, positions_T):
        return self.block.ffn_region(self.block.attention_region(h_BTH, positions_T))


def apply_fsdp(decoder: nn.Module, root: nn.Module, meshes: Meshes, opts: FSDPOptions) -> None:
    """``fully_shard`` per unit in torchtitan's order (module docstring, step 3)."""
    from torch.distributed.fsdp import fully_shard

    dense = opts.config(meshes.dp)
    fully_shard(decoder.embed, **dense, reshard_after_forward=True)
    for unit in decoder.layers:
        block = getattr(unit, "_checkpoint_wrapped_module", unit).block
        if is_moe(block.ffn):
            fully_shard(block.ffn.experts, **opts.config(meshes.expert_dp), reshard_after_forward=True)
        if meshes.layout.tp > 1:
            for m in tp_replicated_params(block):
                fully_shard(m, **opts.config(meshes.moe_dp), reshard_after_forward=True)
        fully_shard(unit, **dense, reshard_after_forward=True)
    fully_shard([decoder.norm, decoder.head], **dense, reshard_after_forward=False)
    fully_shard(root, **dense)
    for m in root.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)   # plain SUM (gloo has no PREMUL_SUM)


class BaselineLM(nn.Module):
    """FSDP's root: the decoder's layers and the chosen head's loss, summed over the rank's
    tokens and divided by ``divisor`` (the global token count)."""

    def __init__(self, decoder: nn.Module, head: str, tp: int, chunk_tokens: int) -> None:
        super().__init__()
        self.decoder, self.head_kind, self.tp, self.chunk_tokens = decoder, head, tp, chunk_tokens

    def forward(self, tokens_BT, targets_BT, positions_1T, divisor):
        import torch.nn.functional as F

        d = self.decoder
        positions_T = positions_1T.reshape(-1)
        h = d.embed(tokens_BT)
        for unit in d.layers:
            h = unit(h, positions_T)
        x = d.norm(h)
        del h   # the norm saved its own fp32 copy: the last layer's output need not live through the head
        if self.head_kind == "chunked":
            return d.head(x, targets_BT, divisor)
        logits = d.head(x).flatten(0, 1).float()   # vocabulary-sharded DTensor under tp (loss_parallel)
        return F.cross_entropy(logits, targets_BT.flatten(), reduction="sum") / divisor


def _chunked_forward(chunk_tokens: int):
    from planner.runtime.chunked_ce import chunked_linear_cross_entropy

    def forward(self, x_BTH, targets_BT, divisor):
        return chunked_linear_cross_entropy(x_BTH.flatten(0, 1), targets_BT.flatten(), self.weight,
                                            chunk_tokens=chunk_tokens, reduction="mean", divisor=divisor)
    return forward


@dataclass
class BaselineStep:
    """One rank's baseline training step: ``.model`` (FSDP root), ``.optimizer``, ``.step``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    layout: Layout
    meshes: Meshes
    cp_rotate: str = knob_default("cp_rotate")
    grad_lifetime: str = knob_default("grad_lifetime")
    hook: PhaseHook = field(default_factory=PhaseHook)

    @property
    def on_phase(self):
        return self.hook.on_phase

    @on_phase.setter
    def on_phase(self, fn) -> None:
        self.hook.on_phase = fn

    def forward_backward(self, tokens_BT, targets_BT):
        """Forward and backward of one micro-step on this rank's data-parallel batch (whole
        sequences: context parallelism shards them here); returns the rank's loss share."""
        L = self.layout
        divisor = tokens_BT.numel() * L.data_parallel
        positions_1T = torch.arange(tokens_BT.shape[1], device=tokens_BT.device)[None]
        if L.tp > 1:   # the loss and its backward both inside loss_parallel
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                return self._forward_backward(tokens_BT, targets_BT, positions_1T, divisor)
        return self._forward_backward(tokens_BT, targets_BT, positions_1T, divisor)

    def _forward_backward(self, tokens_BT, targets_BT, positions_1T, divisor):
        L = self.layout
        if L.cp == 1:
            loss = self.model(tokens_BT, targets_BT, positions_1T, divisor)
            loss.backward()
            return loss.detach()
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(self.cp_rotate)
        bufs = [tokens_BT.clone(), targets_BT.clone(), positions_1T]
        with context_parallel(self.meshes.cp, buffers=bufs, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(bufs)):
            loss = self.model(*bufs, divisor)
            loss.backward()
        return loss.detach()

    def step(self, tokens_BT, targets_BT):
        """A micro-step and the optimizer. Returns this rank's share of the global mean loss (the
        shares of the ranks with ``r_tp = 0`` sum to it)."""
        loss = self.forward_backward(tokens_BT, targets_BT)
        self.hook("optimizer", None)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.grad_lifetime == "freed")
        return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


def _install_phase_hooks(decoder: nn.Module, hook: PhaseHook) -> None:
    for r, unit in enumerate(decoder.layers, start=1):
        unit.register_forward_pre_hook(lambda m, a, r=r: hook("forward", r))
        unit.register_forward_hook(lambda m, a, out, r=r: _BackwardMark.apply(out, lambda: hook("backward", r)))
    decoder.norm.register_forward_pre_hook(lambda m, a: hook("head", None))


def check_knobs(layout: Layout, ac: str, head: str, cp_rotate: str, grad_lifetime: str) -> None:
    """The operator's own argument checks (the planner's ``check`` refuses these earlier)."""
    from planner.errors import InvalidPlan

    allowed = {"plan.baseline.ac": (ac, ("full", "selective", "none")),
               "plan.baseline.head": (head, ("dense", "chunked")),
               "plan.baseline.cp_rotate": (cp_rotate, ("allgather", "alltoall")),
               "plan.baseline.grad_lifetime": (grad_lifetime, ("freed", "accumulate"))}
    for name, (v, ok) in allowed.items():
        if v not in ok:
            raise InvalidPlan(name, v, f"must be one of {', '.join(ok)}", f"use {ok[0]}")
    if head == "chunked" and layout.tp > 1:
        raise InvalidPlan("plan.baseline.head", head, "needs tp = 1", "set baseline.head: dense (loss parallel), or tp = 1")


def build_fsdp2_step(spec, layout: Layout, rank: int, *, num_layers: int | None = None, device=None,
                     ac: str = knob_default("ac"), head: str = knob_default("head"), head_chunk_tokens: int = HEAD_CHUNK_TOKENS,
                     cpu_offload: bool = knob_default("cpu_offload"), cp_rotate: str = knob_default("cp_rotate"), grad_lifetime: str = knob_default("grad_lifetime"),
                     param_dtype: torch.dtype = torch.bfloat16, master_dtype: torch.dtype = FP32,
                     lr: float = 1e-3, seed: int = 0, on_phase: Callable | None = None) -> BaselineStep:
    """Build the decoder of ``spec`` and apply the baseline layout (module docstring).

    Every rank initialises the whole model from ``seed`` (the same values as a single-process
    model built with that seed) and keeps its ``E/ep`` experts. Parameters are held in
    ``master_dtype`` (fp32, torchtitan's default) and computed in ``param_dtype``.
    """
    from planner.runtime.expert_mlp import ExpertShard
    from planner.runtime.expert_parallel import ExpertParallel
    from planner.runtime.model import Decoder

    check_knobs(layout, ac, head, cp_rotate, grad_lifetime)
    from planner.errors import InvalidPlan

    kv = spec.num_heads if spec.attention == "mla" else spec.num_kv_heads
    if spec.num_heads % layout.tp or kv % layout.tp:
        raise InvalidPlan("plan.baseline.tp", layout.tp, f"must divide the heads ({spec.num_heads}) and KV heads ({kv})",
                          "resolve the plan with planner.context.resolve")
    if spec.num_experts and spec.num_experts % layout.ep:
        raise InvalidPlan("plan.baseline.ep", layout.ep, f"must divide model.num_experts ({spec.num_experts})",
                          "resolve the plan with planner.context.resolve")
    device = torch.device(device or "cpu")
    meshes = build_meshes(layout, device.type)
    E, ep = spec.num_experts, layout.ep
    c = layout.coords(rank)
    first = c["ep"] * (E // ep) if E else 0
    torch.manual_seed(seed)
    full = Decoder(spec, num_layers=num_layers, device=device, dtype=master_dtype,
                   head=nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device, dtype=master_dtype)
                   if not spec.tie_embeddings else "dense")
    full.init_weights()
    ep_group = meshes.ep_group

    def moe_block(i):
        src = full.layers[i].ffn.experts.shard
        shard = ExpertShard(E // ep, spec.hidden_size, spec.expert_ffn, dtype=master_dtype, device=device,
                            first_expert=first)
        with torch.no_grad():
            shard.w_up_nHJ.copy_(src.w_up_nHJ[first:first + E // ep])
            shard.w_down_nIH.copy_(src.w_down_nIH[first:first + E // ep])
        return ExpertParallel(shard, E, spec.top_k, ep_group)

    decoder = Decoder(spec, num_layers=num_layers, device=device, dtype=master_dtype, moe_block=moe_block,
                      head=nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device, dtype=master_dtype)
                      if not spec.tie_embeddings else "dense")
    own = {n for n, _ in decoder.named_parameters()}
    with torch.no_grad():
        src = dict(full.named_parameters())
        for n, p in decoder.named_parameters():
            if "experts.shard" not in n:
                p.copy_(src[n])
        for (n, b), (_, b0) in zip(decoder.named_buffers(), full.named_buffers()):
            b.copy_(b0)
    del full, own
    if decoder.head is None:
        from planner.errors import InvalidPlan

        raise InvalidPlan("model.tie_embeddings", True, "the FSDP2 baseline runtime needs an untied head",
                          "validate an untied model")
    return apply_baseline(decoder, layout, meshes, rank=rank, ac=ac, head=head, head_chunk_tokens=head_chunk_tokens,
                          cpu_offload=cpu_offload, cp_rotate=cp_rotate, grad_lifetime=grad_lifetime,
                          param_dtype=param_dtype, lr=lr, on_phase=on_phase)


def apply_baseline(decoder, layout: Layout, meshes: Meshes, *, rank: int, ac: str, head: str,
                   head_chunk_tokens: int, cpu_offload: bool, cp_rotate: str, grad_lifetime: str,
                   param_dtype, lr: float, on_phase=None) -> BaselineStep:
    """TP → AC → FSDP → optimizer on a built decoder (module docstring)."""
    import types

    if layout.tp > 1:
        apply_tp(decoder, meshes.tp, layout.coords(rank)["tp"])
    if head == "chunked":
        decoder.head.forward = types.MethodType(_chunked_forward(head_chunk_tokens), decoder.head)
    router_shapes = {(b.ffn.router.weight.shape[1], b.ffn.router.weight.shape[0])
                     for b in decoder.layers if is_moe(b.ffn)}
    for i, block in enumerate(list(decoder.layers)):
        extra = [block.ffn.experts.plan_reuse] if is_moe(block.ffn) else []
        decoder.layers[i] = apply_ac(LayerUnit(block), ac, router_shapes=router_shapes, extra_context=extra)
    root = BaselineLM(decoder, head, layout.tp, head_chunk_tokens)
    apply_fsdp(decoder, root, meshes, FSDPOptions(param_dtype=param_dtype, cpu_offload=cpu_offload))
    hook = PhaseHook(on_phase)
    _install_phase_hooks(decoder, hook)
    params = [p for p in root.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, fused=True)   # torchtitan's default; CUDA and CPU kernels
    return BaselineStep(root, opt, layout, meshes, cp_rotate=cp_rotate, grad_lifetime=grad_lifetime, hook=hook)


class _EmulatedCounts:
    """Under the fake process group (one rank emulating ``W``) the route counts of the other
    ranks never arrive: plan as if every rank of the expert group drew this rank's counts."""

    @staticmethod
    def install(op) -> None:
        import types

        import numpy as np

        from planner.runtime import shim
        from planner.runtime.routing import local_counts

        def make_plan(self, ids_Nk):
            mine = local_counts(ids_Nk, self.num_experts).cpu().numpy().astype(np.int64)
            counts = np.tile(mine[None], (shim.group_size(self.group), 1))
            self.plans_computed += 1
            return self.plan_from_counts(counts, self._num_chunks(ids_Nk.shape[0]))

        op.make_plan = types.MethodType(make_plan, op)


def build_from_planfile(pf, *, device, rank: int, grad_lifetime: str | None = None) -> BaselineStep:
    """The baseline step of an ``fsdp2`` plan file on this rank (the process group is up), its
    knobs resolved as the planner resolves them (bf16 compute, fp32 parameters)."""
    import torch.distributed as dist

    from planner.context.resolve import resolve_baseline

    k = resolve_baseline(pf.model, pf.workload, pf.plan)
    layout = Layout(world_size=pf.plan.world_size, tp=k.tp, cp=k.cp, dp_shard=k.dp_shard,
                    dp_replicate=k.dp_replicate, ep=k.ep)
    dtype = torch.bfloat16 if pf.plan.dtype == "bf16" else FP32
    step = build_fsdp2_step(pf.model, layout, rank, device=device, ac=k.ac, head=k.head,
                            head_chunk_tokens=k.head_chunk_tokens, cpu_offload=k.cpu_offload,
                            cp_rotate=k.cp_rotate, grad_lifetime=grad_lifetime or k.grad_lifetime,
                            param_dtype=dtype)
    if dist.get_backend() == "fake":
        for unit in step.model.decoder.layers:
            block = getattr(unit, "_checkpoint_wrapped_module", unit).block
            if is_moe(block.ffn):
                _EmulatedCounts.install(block.ffn.experts)
    return step
