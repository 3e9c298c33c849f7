"""The composed training step: the MoP layout of DESIGN §2 applied to ``planner.runtime.model``'s
decoder from a plan file, every operator switchable as the plan says (issue 11).

Legend: ``W`` ranks, ``D``/``E_p``/``P`` the sequence / expert / vocabulary degrees, ``B`` sequences
and ``T = S/D`` tokens per rank and micro-step (``N = B·T``), ``M`` micro-steps per optimizer step,
``L_b = 2L`` checkpointed regions.

Layout (``mop_groups``): dense weights (attention, norms, routers, shared experts, dense FFNs,
embedding, the head when ``P = 1``, Ring-DTP's included) are ZeRO-3 over all ``W`` with FSDP2
``fully_shard``: one unit
per region (``[attention_norm, attention]`` and ``[ffn_norm, ffn]``, the routed experts ignored),
one for the embedding, one for ``[norm, head]``, and the root. Routed experts live whole per
expert shard (EP / LLEP / PipelinedLLEP over the expert group; PipelinedLLEP in the variant the
plan's ``dispatch_residue`` names, source-side by default); the head is Ring-DTP or
vocab-parallel over the vocabulary group when ``P > 1``; their gradients are reduce-scattered over
the replicas (ZeRO-2) before the optimizer. Attention is Ulysses over the sequence group.
Checkpointing: none / per region / SCO. Optimizer: AdamW on the GPU (fp32 masters), CPU offload,
OffloadStreamAdamW, over this rank's shards only.

Gradients are those of the global mean loss ``(1/W)·Σ_r loss_r`` (every rank's mean over its own
tokens; FSDP2 averages dense gradients over ``W``; replicated shards are summed and divided by
``W``); with ``M`` micro-steps each micro-step's loss is divided by ``M``.

Under torch's fake process group (one rank of a larger ``W``, no-op communication) the step runs
with real memory and meaningless values (Ring-DTP's losses are NaN/inf there).

Phases (``on_phase(name, r)``, DESIGN §3.1): ``forward`` r and ``backward`` r (1-based regions,
from the decoder), ``head``, and ``optimizer`` before the replicated gradients are reduced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from planner.runtime import shim

DEFAULT_LR = 1e-4
"""AdamW defaults of the training entry point (``build_composed_step`` arguments override them)."""


@dataclass(frozen=True)
class Layout:
    """The resolved degrees and micro-batch shape of one plan."""

    W: int
    D: int
    Ep: int
    P: int
    batch: int                 # B: sequences per micro-step on this rank
    tokens: int                # T = S/D
    sco_host_bytes: int


def resolve_layout(pf, num_layers: int | None = None) -> Layout:
    """Degrees and shapes of ``pf`` (``planner.budget`` resolves the defaults and the SCO budget)."""
    from planner.budget.build import make_context
    from planner.runtime.model import truncate_spec

    model = truncate_spec(pf.model, num_layers)
    ctx = make_context(model, pf.cluster, pf.workload, pf.plan)
    sco = int(ctx.sco_host_bytes) if ctx.checkpoint == "sco" else 0
    D = int(ctx.seq_parallel)
    return Layout(int(ctx.world_size), D, int(ctx.expert_parallel), int(ctx.vocab_parallel),
                  int(pf.workload.seqs_per_microbatch), pf.workload.seq_len // D, sco)


def _dispatcher(name: str, spec, groups, knobs, device, dtype):
    from planner.runtime import expert_parallel, llep, pipelined_llep, pipelined_llep_source
    from planner.runtime.expert_mlp import ExpertShard

    # PipelinedLLEP runs the variant the plan's dispatch_residue names (the budget counts that one)
    pipelined = (pipelined_llep_source.PipelinedLLEPSource if knobs.dispatch_residue == "source"
                 else pipelined_llep.PipelinedLLEP)
    cls = {"ep": expert_parallel.ExpertParallel, "llep": llep.LLEP, "pipelined_llep": pipelined}[name]
    Ep, r = shim.group_size(groups.expert), shim.group_rank(groups.expert)
    n = spec.num_experts // Ep

    def make(layer: int):
        shard = ExpertShard(n, spec.hidden_size, spec.expert_ffn, dtype=dtype, device=device,
                            first_expert=r * n)
        return cls(shard, spec.num_experts, spec.top_k, groups.expert, token_budget=knobs.token_budget,
                   max_chunks=knobs.max_chunks, alpha=knobs.llep_alpha, min_tokens=knobs.llep_min_tokens,
                   lam=knobs.llep_lambda, max_imports=knobs.max_imports)
    return make


def _head(vocab: str, spec, groups, knobs, device, dtype):
    from planner.runtime.gathered_vocab_head import GatheredVocabParallelHead
    from planner.runtime.ring_dtp import RingDTPHead

    if vocab == "dense" or shim.group_size(groups.vocab) == 1 and vocab == "vocab_parallel":
        return "dense"
    if vocab == "ring_dtp":
        return RingDTPHead(spec.hidden_size, spec.vocab_size, group=groups.vocab,
                           vocab_blocks=knobs.vocab_blocks, device=device, dtype=dtype)
    return GatheredVocabParallelHead(spec.hidden_size, spec.vocab_size, group=groups.vocab,
                                     device=device, dtype=dtype)


def _shard(decoder, mesh, expert_params: set, head_replicated: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    for b in decoder.layers:
        fully_shard([b.attention_norm, b.attention], mesh=mesh)
        fully_shard([b.ffn_norm, b.ffn], mesh=mesh, ignored_params=expert_params)
    ignored = set(expert_params)
    if decoder.head is not None:
        fully_shard(decoder.embed, mesh=mesh)
        if head_replicated:
            ignored |= set(decoder.head.parameters())
            fully_shard(decoder.norm, mesh=mesh)
        else:
            fully_shard([decoder.norm, decoder.head], mesh=mesh)
    fully_shard(decoder, mesh=mesh, ignored_params=ignored)


def _optimizer(kind: str, params, knobs, lr, betas, eps, weight_decay):
    hp = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if kind == "stream_offload":
        from planner.runtime.offload_adamw import OffloadStreamAdamW
        return OffloadStreamAdamW(params, bucket_params=knobs.bucket_params,
                                  staging_slots=knobs.staging_slots, **hp)
    if kind == "cpu_offload":
        from planner.runtime.cpu_offload_adamw import CPUOffloadAdamW
        return CPUOffloadAdamW(params, **hp)
    if kind == "gpu":
        from planner.runtime.master_adamw import MasterAdamW
        return MasterAdamW(params, **hp)
    raise ValueError(f"plan.composed.optimizer ({kind!r}) must be gpu, cpu_offload or stream_offload")


def _lazy_init(model) -> None:
    """FSDP2's lazy initialisation (it may re-pad the sharded storage) before the optimizer takes
    views of the shards."""
    state = model._get_fsdp_state() if hasattr(model, "_get_fsdp_state") else None
    if state is not None:
        state._lazy_init()


class ComposedStep:
    """A built composed stack: ``model``, ``optimizer``, ``step(tokens, targets) -> loss``.

    ``tokens``/``targets``: ``[B, T]`` (one micro-step) or ``[M, B, T]`` (``M`` micro-steps of
    gradient accumulation, gradients kept across them) int64 on the device: this rank's ``T``
    positions (``T = S/D``; rank ``i`` of a sequence group holds positions ``i·T …``). Returns this
    rank's mean loss over its tokens (detached fp32; ``global_loss`` averages it over ``W``).
    Gradients are freed after the optimizer (``zero_grad(set_to_none=True)``), so none exists
    during the next forward unless ``set_to_none=False`` was asked for.
    """

    def __init__(self, model, optimizer, dense, replicated, groups, layout, sco, set_to_none: bool) -> None:
        self.model, self.optimizer = model, optimizer
        self.dense, self.replicated, self.groups, self.layout, self.sco = dense, replicated, groups, layout, sco
        self.set_to_none = set_to_none
        self._on_phase: Callable | None = None

    @property
    def on_phase(self):
        return self._on_phase

    @on_phase.setter
    def on_phase(self, fn) -> None:
        self._on_phase = fn
        self.model.on_phase = fn

    def _phase(self, name, r=None) -> None:
        if self._on_phase is not None:
            self._on_phase(name, r)

    def micro_step(self, tokens_BT, targets_BT, scale: float = 1.0) -> torch.Tensor:
        """Forward and backward of one micro-batch; gradients accumulate."""
        loss = self.model(tokens_BT, targets_BT)
        (loss * scale if scale != 1.0 else loss).backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        """Reduce the replicated gradients, update every shard, gather, free the gradients."""
        self._phase("optimizer")
        self.replicated.reduce()
        self.dense.attach_grads()
        self.optimizer.step()
        self.replicated.gather()
        # The gather rewrote the whole replicated shards (this replica's slice with its own value):
        # OffloadStreamAdamW must not take that for a user's in-place change and reload its fp32
        # master from the working dtype.
        record = getattr(self.optimizer, "_record_versions", None)
        if record is not None and self.replicated.gathers:
            record()
        self.zero_grad()

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=self.set_to_none)
        self.dense.zero_grad()
        self.replicated.zero_grad()

    def step(self, tokens, targets) -> torch.Tensor:
        if tokens.dim() == 2:
            tokens, targets = tokens[None], targets[None]
        M = tokens.shape[0]
        losses = [self.micro_step(tokens[m], targets[m], 1.0 / M) for m in range(M)]
        self.optimizer_step()
        return torch.stack(losses).mean()

    def global_loss(self, loss: torch.Tensor) -> float:
        """The mean of every rank's ``loss`` (one all-reduce)."""
        t = loss.detach().float().reshape(1).clone()
        if dist.get_backend() == "nccl" and not t.is_cuda:
            t = t.cuda()
        shim.all_reduce(t, "sum")
        return float(t.item()) / self.layout.W

    def close(self) -> None:
        """Release pinned host memory (SCO pool, offloaded optimizer state)."""
        if self.sco is not None:
            self.sco.close()
        if hasattr(self.optimizer, "close"):
            self.optimizer.close()


def build_composed_step(plan_file, *, num_layers: int | None = None, device=None, dtype=None,
                        init_state: dict | None = None, seed: int = 0, lr: float = DEFAULT_LR,
                        betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.0,
                        set_to_none: bool = True) -> ComposedStep:
    """Build the composed stack of ``plan_file`` (a ``PlanFile`` or a path) on this rank.

    Every rank of the launched world calls it together (``torch.distributed`` initialised, world
    size ``plan.world_size``). ``num_layers`` truncates the depth (widths and degrees kept).
    ``dtype``: default the plan's (``bf16`` or ``fp32``). ``init_state``: a full state dict of an
    unsharded ``Decoder`` of the same spec (tests: the single-process reference) copied into this
    rank's shards; otherwise random initialisation on the device (dense shards differ per rank;
    replicas of one expert / vocabulary shard are identical).

    Raises:
        ValueError / InvalidPlan: a degree that does not divide, a plan for another world size, a
        stack other than ``composed``.
    """
    from planner.runtime.attention import LocalCore, UlyssesCore
    from planner.runtime.model import Decoder, truncate_spec
    from planner.runtime.mop_groups import DenseShards, ReplicatedShards, make_groups
    from planner.runtime.mop_init import init_composed, load_full_state
    from planner.runtime.sco import SCO
    from planner.schema import PlanFile

    if not isinstance(plan_file, PlanFile):
        from planner.schema.io import load_planfile
        plan_file = load_planfile(plan_file)
    plan = plan_file.plan
    if plan.stack != "composed":
        raise ValueError(f"plan.stack ({plan.stack!r}) must be 'composed' for build_composed_step; fix: "
                         "use the FSDP2 baseline runner for stack fsdp2")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or {"bf16": torch.bfloat16, "fp32": torch.float32}[plan.dtype]
    lay = resolve_layout(plan_file, num_layers)
    knobs = plan.composed
    spec = truncate_spec(plan_file.model, num_layers)
    groups = make_groups(lay.W, lay.D, lay.Ep, lay.P, device.type)
    meta = torch.device("meta")
    core = UlyssesCore(groups.seq) if lay.D > 1 else LocalCore()
    moe = _dispatcher(knobs.dispatch, spec, groups, knobs, meta, dtype) if spec.is_moe else "dense"
    head = _head(knobs.vocab, spec, groups, knobs, meta, dtype)
    model = Decoder(spec, device=meta, dtype=dtype, attention=core, moe_block=moe, head=head,
                    position_offset=shim.group_rank(groups.seq) * lay.tokens)
    experts = [p for b in model.layers if b.is_moe for p in b.ffn.experts.parameters()]
    head_replicated = head != "dense" and lay.P > 1   # P = 1: the head is a ZeRO-3 dense weight
    _shard(model, groups.mesh, set(experts), head_replicated)
    model.to_empty(device=device)
    experts = [p for b in model.layers if b.is_moe for p in b.ffn.experts.parameters()]  # new objects
    init_composed(model, groups, seed)
    if init_state is not None:
        load_full_state(model, init_state, groups)
    replicated = [(p, groups.expert_replicas) for p in experts]
    if head_replicated:
        replicated += [(p, groups.vocab_replicas) for p in model.head.parameters()]
    _lazy_init(model)
    rep = ReplicatedShards(replicated, lay.W)
    rep_ids = {id(p) for p, _ in replicated}
    plain = [n for n, p in model.named_parameters() if id(p) not in rep_ids and not hasattr(p, "to_local")]
    if plain:
        raise RuntimeError(f"parameters outside FSDP2 and the replicated shards: {plain}")
    dense = DenseShards([p for p in model.parameters() if id(p) not in rep_ids])
    sco = None
    if knobs.checkpoint == "sco":
        sco = SCO(num_boundaries=model.num_boundaries, boundary_shape=(lay.batch, lay.tokens, spec.hidden_size),
                  dtype=dtype, device=device, host_budget_bytes=lay.sco_host_bytes)
        model.checkpoint = sco
    else:
        model.checkpoint = knobs.checkpoint
    opt = _optimizer(knobs.optimizer, dense.proxies + rep.proxies, knobs, lr, betas, eps, weight_decay)
    return ComposedStep(model, opt, dense, rep, groups, lay, sco, set_to_none)
