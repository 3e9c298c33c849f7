"""``Plan``: every knob of DESIGN §1 and §10 for the composed stack and the FSDP2 baseline."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator

from planner.schema.base import (MAX_BUCKET_PARAMS, MAX_BYTES, MAX_CHUNKS, MAX_IMPORTS,
                                 MAX_STAGING_SLOTS, MAX_TOKENS, MAX_WORLD_SIZE, Frozen)

Dispatch = Literal["ep", "llep", "pipelined_llep"]
Vocab = Literal["dense", "vocab_parallel", "ring_dtp"]
Optimizer = Literal["gpu", "cpu_offload", "stream_offload"]
Checkpoint = Literal["none", "per_layer", "sco"]
DispatchBound = Literal["guarantee", "expected"]
DispatchResidue = Literal["source", "destination"]
ActDtype = Literal["bf16", "fp32"]
AC = Literal["full", "selective", "none"]
RotateMethod = Literal["allgather", "alltoall"]
BaselineHead = Literal["dense", "chunked"]
GradLifetime = Literal["freed", "accumulate"]

@dataclass(frozen=True)
class Cli:
    """How a knob appears on the command line (``planner.schema.knobs`` derives the options).

    ``parse``: ``plain`` (typer converts), ``count`` (``128k``), ``params`` (``100M``) or ``gib``
    (a GiB float stored as bytes). ``flag`` defaults to ``--`` + the name with dashes. ``live``:
    ``(operator knob, choices)`` under which the knob does anything; given for another choice it
    is refused (``check_inert``)."""

    help: str
    parse: str = "plain"
    flag: str | None = None
    show_default: str | None = None
    live: tuple[str, tuple[str, ...]] | None = None


ROUTING_DEFAULT_TEXT = "the named skew where the dispatch has no launch-time bound, else balanced (README: routing)"
"""``--help`` text of the routing default (``planner.plans.routing.default_routing``)."""

_SKEW = re.compile(r"^([0-9]{1,3})/([0-9]{1,9})$", re.ASCII)
"""``R/H`` in ASCII digits (``\\d`` would take any script's digits, which ``int`` reads)."""


def parse_routing(text: str) -> tuple[str, float, int]:
    """``balanced`` | ``worst`` | ``R/H`` → (kind, hot token share r, hot experts h).

    ``80/16`` means the first 80% of token positions pick among 16 hot experts (DESIGN §3.2).
    """
    if text in ("balanced", "worst"):
        return text, 0.0, 0
    m = _SKEW.match(text)
    assert m, text
    return "skew", int(m.group(1)) / 100.0, int(m.group(2))


class ComposedKnobs(Frozen):
    """Knobs of the composed (MoP) stack. ``None`` means "resolve the DESIGN §10 default"."""

    dispatch: Annotated[Dispatch, Cli("Expert dispatch operator.")] = "pipelined_llep"
    """Expert dispatch operator: standard all-to-all EP, LLEP, or PipelinedLLEP."""
    dispatch_residue: Annotated[DispatchResidue, Cli("PipelinedLLEP state across chunks: source (bounded for any router) | destination.")] = "source"
    """PipelinedLLEP's state kept across chunks: ``source`` (token indices on the sending rank, each
    chunk re-dispatched in backward; bounded whatever the router does) or ``destination`` (every
    chunk's received rows until the layer's backward; one dispatch all-to-all fewer per chunk, but
    sized by the routing)."""
    vocab: Annotated[Vocab, Cli("Vocabulary head.")] = "ring_dtp"
    """Vocabulary head: dense (ZeRO-3 head, full logits), vocab-parallel (Megatron), or Ring-DTP."""
    optimizer: Annotated[Optimizer, Cli("Optimizer placement.")] = "stream_offload"
    """AdamW on the GPU, CPU offload (ZeRO-Offload style), or OffloadStreamAdamW."""
    checkpoint: Annotated[Checkpoint, Cli("Activation checkpointing.")] = "sco"
    """Activation checkpointing: none, per checkpointed region, or SCO (per region + host offload)."""
    seq_parallel: Annotated[int | None, Cli("D: Ulysses degree.")] = Field(default=None, gt=0, le=MAX_WORLD_SIZE)
    """``D`` (≤ 2^20): Ulysses sequence-parallel degree; default the largest divisor of ``W`` dividing the
    KV heads (GQA) or heads (MHA/MLA)."""
    expert_parallel: Annotated[int | None, Cli("E_p (baseline: ep).")] = Field(default=None, gt=0, le=MAX_WORLD_SIZE)
    """``E_p`` (≤ 2^20): expert-parallel degree; default the largest divisor of ``W`` that divides ``E``."""
    vocab_parallel: Annotated[int | None, Cli("P: vocabulary group size.", live=("vocab", ("ring_dtp", "vocab_parallel")))] = Field(default=None, gt=0, le=MAX_WORLD_SIZE)
    """``P`` (≤ 2^20): Ring-DTP / vocab-parallel group size; default the largest divisor of ``W`` ≤ 8."""
    vocab_blocks: Annotated[int, Cli("B_v: blocks per vocab shard.", live=("vocab", ("ring_dtp",)))] = Field(default=1, gt=0, le=MAX_IMPORTS)
    """``B_v`` (≤ 2^20): vocabulary blocks per Ring-DTP shard (strip = ``N × V/(P·B_v)``)."""
    token_budget: Annotated[int, Cli("c: per-source tokens per chunk.", parse="count", live=("dispatch", ("pipelined_llep",)))] = Field(default=4096, gt=0, le=MAX_TOKENS)
    """``c`` (≤ 2^32): per-source token budget per dispatch chunk."""
    max_chunks: Annotated[int, Cli("K_max.", live=("dispatch", ("pipelined_llep",)))] = Field(default=10, gt=0, le=MAX_CHUNKS)
    """``K_max`` (≤ 4096): most dispatch chunks per layer."""
    llep_alpha: Annotated[float, Cli("α: LLEP capacity factor.", live=("dispatch", ("llep", "pipelined_llep")))] = Field(default=1.0, ge=1.0, allow_inf_nan=True)
    """``α`` (≥ 1: the ranks' capacity must hold every route): LLEP capacity factor; ``inf`` means no
    cap, and the dispatch guarantee is capped at the total routes ``E_p·k·N_max``."""
    llep_min_tokens: Annotated[int, Cli("m: min tokens per spilled GEMM.", live=("dispatch", ("llep", "pipelined_llep")))] = Field(default=1024, ge=1, le=MAX_TOKENS)
    """``m`` (≤ 2^32): minimum tokens per spilled GEMM."""
    llep_lambda: Annotated[float, Cli("λ: imbalance threshold.", live=("dispatch", ("llep", "pipelined_llep")))] = Field(default=1.3, ge=1.0)
    """``λ``: imbalance (max/mean load) below which LLEP is skipped."""
    max_imports: Annotated[int, Cli("n_import_max.", live=("dispatch", ("llep", "pipelined_llep")))] = Field(default=4, ge=0, le=MAX_IMPORTS)
    """``n_import_max`` (≤ 2^20): most foreign experts one rank may import per layer."""
    bucket_params: Annotated[int, Cli("β: bucket size in params (100M).", parse="params", live=("optimizer", ("stream_offload",)))] = Field(default=100_000_000, gt=0, le=MAX_BUCKET_PARAMS)
    """``β`` (≤ 2^40): OffloadStreamAdamW bucket size, in parameters; at least the cut alignment of
    ``planner.plans.buckets`` (checked where the plan is resolved)."""
    staging_slots: Annotated[int, Cli("s: staging slots.", live=("optimizer", ("stream_offload",)))] = Field(default=2, ge=1, le=MAX_STAGING_SLOTS)
    """``s`` (≤ 64): OffloadStreamAdamW staging slots."""
    sco_host_bytes: Annotated[int | None, Cli("SCO host budget per rank, GiB (pinned).", parse="gib", flag="--sco-host-gib", show_default="what host RAM leaves", live=("checkpoint", ("sco",)))] = Field(default=None, ge=0, le=MAX_BYTES)
    """SCO host budget per rank (≤ 2^60), in physical pinned bytes; ``None`` = what host RAM leaves (§3.3)."""


class BaselineKnobs(Frozen):
    """Knobs of the FSDP2 baseline (DESIGN §2). ``None`` means "resolve the default layout"."""

    tp: Annotated[int, Cli("Baseline tensor parallel.")] = Field(default=1, gt=0, le=MAX_WORLD_SIZE)
    """Tensor-parallel degree (≤ 2^20) (head becomes loss-parallel when > 1)."""
    cp: Annotated[int, Cli("Baseline context parallel.")] = Field(default=1, gt=0, le=MAX_WORLD_SIZE)
    """Context-parallel degree (≤ 2^20)."""
    dp_shard: Annotated[int | None, Cli("Baseline FSDP shard degree.")] = Field(default=None, gt=0, le=MAX_WORLD_SIZE)
    """FSDP shard degree (≤ 2^20); default ``W / (tp·cp)``."""
    ep: int | None = Field(default=None, gt=0, le=MAX_WORLD_SIZE)
    """Expert-parallel degree (≤ 2^20), borrowed from ``dp_shard·cp``; default the largest divisor of
    ``dp_shard·cp`` that divides ``E``."""
    ac: Annotated[AC, Cli("Baseline activation checkpointing.")] = "full"
    """Per-layer activation checkpointing: full, torch's op-level selective, or none."""
    cpu_offload: Annotated[bool, Cli("Baseline CPUOffloadPolicy.", flag="--cpu-offload", show_default="off")] = False
    """``CPUOffloadPolicy``: parameters, gradients and optimizer state on the host."""
    dp_replicate: int = Field(default=1, gt=0, le=MAX_WORLD_SIZE)
    """HSDP replicate degree (≤ 2^20): ``W = dp_replicate·dp_shard·cp·tp``; parameters are sharded
    over ``dp_shard·cp`` and replicated ``dp_replicate`` times."""
    cp_rotate: RotateMethod = "allgather"
    """Context-parallel rotate method (``set_rotate_method``): torchtitan's default ``allgather``
    gathers every shard's K/V; ``alltoall`` passes them round the ring."""
    head: BaselineHead = "dense"
    """Output head: ``dense`` (``cross_entropy(x @ w.T)``; loss parallel when ``tp > 1``) or
    ``chunked`` (chunked linear cross-entropy, Liger-style; ``tp = 1`` only)."""
    head_chunk_tokens: int = Field(default=4096, gt=0, le=MAX_TOKENS)
    """Tokens per chunk of the chunked head (≤ 2^32)."""
    grad_lifetime: GradLifetime = "accumulate"
    """``accumulate`` (the conservative default): gradients kept across micro-steps, resident in
    every phase; ``freed``: ``zero_grad(set_to_none=True)`` every step, so no gradient exists
    during the forward."""


class Plan(Frozen):
    """A launch configuration: the stack, its degrees and operator choices."""

    stack: Literal["composed", "fsdp2"] = "composed"
    """Which stack runs: the composed operators or the FSDP2 baseline."""
    world_size: int = Field(gt=0, le=MAX_WORLD_SIZE)
    """``W`` (≤ 2^20): ranks (GPUs) in the job."""
    routing: Annotated[str | None, Cli("balanced | worst | R/H (e.g. 80/16).", show_default=ROUTING_DEFAULT_TEXT)] = None
    """Routing assumption shared by both stacks: ``balanced``, ``worst`` or a skew ``R/H``; ``None``:
    the operator's default (``planner.plans.routing.default_routing``: the named skew where the
    dispatch has no launch-time bound, else ``balanced``)."""
    dispatch_bound: Annotated[DispatchBound, Cli("Dispatch size the verdict uses.")] = "guarantee"
    """Which dispatch size the verdict uses: the launch-time guarantee or the plan-evaluated
    expected size under ``routing``."""
    dtype: Annotated[ActDtype, Cli("Activation dtype.")] = "bf16"
    """Activation and working-weight dtype (``b`` = 2 for bf16, 4 for fp32)."""
    composed: ComposedKnobs = ComposedKnobs()
    """Knobs of the composed stack (ignored when ``stack == "fsdp2"``)."""
    baseline: BaselineKnobs = BaselineKnobs()
    """Knobs of the FSDP2 baseline (ignored when ``stack == "composed"``)."""

    @field_validator("routing")
    @classmethod
    def _routing(cls, v: str | None) -> str | None:
        from planner.errors import InvalidPlan

        if v is None:
            return v
        m = _SKEW.match(v)
        if v in ("balanced", "worst"):
            return v
        if not m or not (0 <= int(m.group(1)) <= 100) or int(m.group(2)) < 1:
            raise InvalidPlan("plan.routing", v, "must be balanced, worst or R/H with 1<=R<=100, H>=1 "
                              "(ASCII digits)", "write e.g. --routing 80/16")
        if int(m.group(1)) == 0:
            raise InvalidPlan("plan.routing", v, "has no hot tokens (R = 0), so it is no skew",
                              "use --routing balanced, or R >= 1")
        return v
