"""Live set ``optimizer_step`` (phase ``optimizer``) and the optimizer's host bytes (DESIGN §3.2, §3.3).

Legend: ``Θ_r`` parameters whose optimizer state one rank holds (composed: ``Θ_dense+head``/W +
``Θ_exp/W``, the count of ``persistent``'s fp32 master/m/v; FSDP2: ``Θ/W``), ``β`` bucket size,
``s`` staging slots, ``G = ceil(Θ_r/β)`` buckets, ``b`` working-weight bytes.

Device, phase ``optimizer`` (counted off the tensor inventories of ``planner/runtime``):

    stream_offload (OffloadStreamAdamW)  staging min(s, G)·min(β, Θ_r)·4 fp32 (master, m, v, grad);
                                         nothing else (one fp32 step counter per tensor, a few KiB)
    cpu_offload (CPUOffloadAdamW)        0: bf16 grads go straight into pinned host memory and the
                                         bf16 weights come straight back
    gpu (composed, fp32 master on device) fp32 grad upcast 4·Θ_r for torch's fused AdamW, whose own
                                         kernel runs in place
    FSDP2 (fused AdamW, torchtitan's default) 0: ``_fused_adam`` bumps the step tensors and calls
                                         ``torch._fused_adamw_`` in place (torch/optim/adam.py);
                                         confirmed by trace; also 0 with CPUOffloadPolicy (host step)

Host, per rank (``host_terms``; ``planner.budget.host`` sums them):

    stream_offload   roundup(12·Θ_r, 4 KiB) pinned (master, m, v through planner/runtime/pinned.py)
    cpu_offload      roundup(8·Θ_r, 4 KiB) pinned (master, fp32 grads) + roundup(b·Θ_r, 4 KiB) pinned
                     transfer buffer + 8·Θ_r pageable m, v (torch's CPU allocator, exact)
    FSDP2 + CPUOffloadPolicy  Σ_tensors pow2ceil(4·shard) pinned fp32 parameter shards
                     + the same for the fp32 gradient shards (torch's caching host allocator rounds
                     each block to a power of two) + 8·Θ/W pageable m, v
"""

from __future__ import annotations

import numpy as np

from planner.context.ctx import Ctx
from planner.context.derive import rank_params  # noqa: F401  (Θ_r, derived in the resolution layer)
from planner.budget.terms import ALWAYS, Term
from planner.plans import fsdp2_shards
from planner.plans.buckets import num_buckets
from planner.units import PAGE_BYTES, ceil_div, round_up

SOURCE = "DESIGN §3.2 Optimizer step; planner/runtime/offload_adamw.py, cpu_offload_adamw.py inventory"
OPT = ("optimizer",)


def stream_staging_bytes(theta_r, bucket_params, staging_slots):
    """OffloadStreamAdamW device staging: ``min(s, G)·min(β, Θ_r)·16`` bytes (ints or arrays)."""
    beta = np.asarray(bucket_params, dtype=np.int64)
    return np.minimum(staging_slots, num_buckets(theta_r, beta)) * np.minimum(beta, theta_r) * 16


def stream_host_bytes(theta_r):
    """OffloadStreamAdamW pinned host state: ``roundup(12·Θ_r, 4 KiB)`` bytes."""
    return round_up(12 * np.asarray(theta_r, dtype=np.int64), PAGE_BYTES)


def terms(ctx: Ctx) -> list[Term]:
    """Device terms of the optimizer step of one rank."""
    n = rank_params(ctx)
    if ctx.stack == "fsdp2":
        return [Term("fused AdamW temporaries (in place)", "optimizer_step", 0 * n, 4,
                     "0 (torch._fused_adamw_ in place; CPU step with CPUOffloadPolicy)", OPT, source=SOURCE)]
    out = _replica_slices(ctx)
    if ctx.optimizer == "stream_offload":
        staged = stream_staging_bytes(n, ctx.bucket_params, ctx.staging_slots) // 16
        return out + [Term("staging slots (fp32 master, m, v, grad)", "optimizer_step", 4 * staged, 4,
                           "min(s, G)·min(β, Θ_r)·4, G = ceil(Θ_r/β)", OPT, source=SOURCE)]
    if ctx.optimizer == "cpu_offload":
        return out + [Term("grad copy down / weight copy up", "optimizer_step", 0 * n, ctx.act_bytes,
                     "0 (straight between the bf16 tensors and pinned host memory)", OPT, source=SOURCE)]
    return out + [Term("fp32 grad upcast for fused AdamW", "optimizer_step", n, 4, "Θ_r", OPT, source=SOURCE)]


def _replica_slices(ctx: Ctx) -> list[Term]:
    """Composed stack: the reduce-scattered gradient slice of every replicated whole shard (experts
    over their ``W/E_p`` replicas, the vocabulary shard over ``W/P`` when ``P > 1``), a new tensor of
    ``ceil(n/R)`` elements per parameter held from the reduce to the end of the optimizer step
    (``planner/runtime/mop_groups.ReplicatedShards``; whole-step trace)."""
    if ctx.stack != "composed":
        return []
    p, W = ctx.params, ctx.world_size
    P = np.asarray(ctx.vocab_parallel)
    experts = ceil_div(ceil_div(p["experts"], ctx.expert_parallel), W // np.asarray(ctx.expert_parallel))
    head = np.where((P > 1) & (ctx.vocab != "dense"),
                    ceil_div(ceil_div(ctx.vocab_size, P) * ctx.hidden_size, W // P), 0)
    return [Term("replicated shards' reduced gradient slices", "optimizer_step", experts + head, ctx.act_bytes,
                 "Θ_exp/E_p / (W/E_p) + [P>1]·ceil(V/P)·H / (W/P)", OPT, source=SOURCE + "; mop_groups")]


def host_terms(ctx: Ctx) -> list[Term]:
    """Host bytes one rank's optimizer needs (state and pinned buffers); empty when on the device.

    Each term's ``bytes`` is host bytes per rank (its ``live_set``/``phases`` are nominal: host
    terms never enter the device peak).
    """
    n = rank_params(ctx)
    b = ctx.act_bytes

    def host(name, count, elem, formula, provisional=False):
        return Term(name, "optimizer_step", count, elem, formula, ALWAYS, provisional=provisional,
                    source=SOURCE + "; DESIGN §3.3")

    if ctx.stack == "fsdp2":
        if not ctx.cpu_offload:
            return []
        kw = dict(tp=ctx.tp, fsdp=np.asarray(ctx.dp_shard) * np.asarray(ctx.cp), ep=ctx.ep)
        pinned = fsdp2_shards.pinned_shard_bytes(ctx.model, **kw)
        return [
            host("fp32 parameter shards (pinned, power-of-two blocks)", pinned, 1,
                 "Σ_tensors pow2ceil(4·shard_numel)", provisional=True),
            host("fp32 gradient shards (pinned, power-of-two blocks)", pinned, 1,
                 "Σ_tensors pow2ceil(4·shard_numel)", provisional=True),
            host("AdamW m, v (pageable)", 2 * fsdp2_shards.shard_params(ctx.model, **kw), 4, "2·Θ/W (4 B each)",
                 provisional=True),
        ]
    if ctx.optimizer == "stream_offload":
        return [host("fp32 master, m, v (pinned, cudaHostRegister)", stream_host_bytes(n), 1,
                     "roundup(12·Θ_r, 4 KiB)")]
    if ctx.optimizer == "cpu_offload":
        return [
            host("fp32 master + grads (pinned, cudaHostRegister)", round_up(8 * n, PAGE_BYTES), 1,
                 "roundup(8·Θ_r, 4 KiB)"),
            host("bf16 grad/weight transfer buffer (pinned)", round_up(b * n, PAGE_BYTES), 1,
                 "roundup(b·Θ_r, 4 KiB)"),
            host("AdamW m, v (pageable)", 2 * n, 4, "2·Θ_r (4 B each)"),
        ]
    return []
