"""The FSDP2 baseline's gradient reductions and one-rank all-gathers as sub-steps of a layer phase
(``planner.budget.fsdp2_layer``): what torch's ``fully_shard`` allocates at each unit's
post-backward and, on a mesh of one rank, at its unshard.

Legend: ``Θ^e`` the layer's ``E/ep`` routed experts (their own FSDP unit, mesh ``F_e = F·tp/ep``),
``Θ^d`` its dense part (the layer unit, mesh ``F = dp_shard·cp``), ``b`` the parameter (compute)
dtype's bytes, ``[c]`` 1 when ``c`` holds, ``held(r)`` the fp32 reduce-scatter input FSDP2 keeps
from the previous unit's reduction (``planner.budget.fsdp2_gathered.held_rs_input``).

A unit's post-backward (``FSDPParamGroup.post_backward``, torch 2.11) first reshards the unit (its
``b``-byte parameters are freed), releases the previous unit's held reduce-scatter input
(``reduce_scatter_max_input_buffers = 1``), then ``foreach_reduce`` allocates the fp32
reduce-scatter input ``4Θ`` and copies the ``b``-byte gradients into it (both live: ``Θ·(b+4)``),
frees the gradients, and allocates the fp32 output ``4⌈Θ/F⌉`` (the new gradient shard under freed
gradients; a temporary added into the kept shard under accumulation). On a mesh of one rank no
collective runs: the output is filled by ``reduce_output.copy_(reduce_scatter_input /
gradient_divide_factor)``, whose quotient is one more ``4Θ`` temporary (the runtime sets the divide
factor to 1: torchtitan's sum convention). So the reduction holds

    R(Θ, F) = max(Θ·(b+4), 4Θ + 4⌈Θ/F⌉ + [F = 1]·4Θ)

(DeepSeek-V2-Lite W = 1 backward[2], ``bench/results/memory_snapshot/fsdp2-dsv2-W1-selective.json``:
the experts' three 2112 MiB fp32 blocks, two from ``empty_cuda``, one the quotient; backward[1]:
the embedding's three 800 MiB blocks.)

The routed experts reduce first, when their own backward ends (the rest of the layer's backward
still to run: the attention's saved tensors, the FFN norm's, the routed tokens' gradient ``N·H``);
the layer unit last, when the layer's input gradient exists; the embedding in the root's final
callback, after its backward (its unsharded table and dense gradient, ``2·V·H/tp·b``, beside layer
1's held input). On a one-rank mesh the unshard casts each fp32 shard to a ``b``-byte copy before
filling the unsharded parameter (``FSDPParamGroup.wait_for_unshard``): filling the down
projections, the gate|up copy is still referenced, one ``n·H·2I·b`` more than the unsharded
experts (Qwen3-30B-A3B W = 1 S = 4096 forward[1]: within 5 MiB of the H200).
"""

from __future__ import annotations

import numpy as np

from planner.budget import fsdp2_gathered as fg
from planner.context.ctx import Ctx
from planner.units import ceil_div

_R_TEXT = "max(Θ·(b+4), 4Θ + 4⌈Θ/F⌉ + [F=1]·4Θ) (bytes)"


def reduce_bytes(theta, F, b: int):
    """``R(Θ, F)``: bytes a unit's reduction holds, its gradients included (module legend)."""
    theta, F = np.asarray(theta, dtype=np.int64), np.asarray(F, dtype=np.int64)
    copy_in = theta * (b + 4)
    out = 4 * theta + 4 * ceil_div(theta, np.maximum(F, 1)) + 4 * theta * (F == 1)
    return np.maximum(copy_in, out)


def _grad_shards(ctx: Ctx, kind: str, experts: bool = True, dense: bool = True):
    """fp32 gradient shards of one layer's units that a freed-gradient step has just created."""
    if ctx.grad_lifetime != "freed":
        return np.int64(0)   # kept across micro-steps: already in the persistent shards
    F, Fe = fg.fsdp_degree(ctx), fg.expert_degree(ctx)
    out = np.int64(0)
    if dense:
        out = out + 4 * ceil_div(fg.layer_dense_params(ctx, kind), F)
    if experts and kind == "moe":
        out = out + 4 * ceil_div(fg.layer_expert_params(ctx, kind), np.maximum(Fe, 1))
    return out


def _released(ctx: Ctx, r: int, kind: str, item):
    """The phase-wide terms not live at a reduction of layer ``r``: its resharded parameters and
    the previous unit's held reduce-scatter input (released before this one is allocated)."""
    return [item("gathered", "layer params resharded by then (not live)", -fg.layer_params(ctx, kind), ctx.act_bytes,
                 "−Θ_r"),
            item("gathered", "previous unit's held reduce-scatter input, released (not live)",
                 -fg.held_rs_input(ctx, r), 4, "−held(r)")]


def experts_reduce(ctx: Ctx, r: int, kind: str, live: list, item) -> list:
    """Sub-step of backward[r] (MoE layer): the routed experts' reduction; ``live`` the layer's
    tensors the rest of its backward still needs (the ``ffn`` sub-step's, without ``D``)."""
    th_e = fg.layer_expert_params(ctx, kind)
    N, H, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    out = list(live) + [
        item("dispatch", "routed tokens' gradient", N * H, b, "N·H"),
        item("gathered", "experts' gradient reduction R(Θ^e, F_e)", reduce_bytes(th_e, fg.expert_degree(ctx), b), 1,
             _R_TEXT),
    ]
    rel = _released(ctx, r, kind, item)
    # the layer's dense part is still unsharded: only the experts are resharded
    rel[0] = item("gathered", "experts resharded before their reduction (not live)", -th_e, b, "−Θ^e")
    return out + rel


def layer_reduce(ctx: Ctx, r: int, kind: str, item) -> list:
    """Sub-step of backward[r]: the layer unit's reduction, after the experts' (their gradient shard
    exists under freed gradients), beside the layer-input gradient."""
    th_d = fg.layer_dense_params(ctx, kind)
    b, N_sp = ctx.act_bytes, ceil_div(ctx.tokens_per_rank, ctx.tp)
    return [item("gathered", "layer unit's gradient reduction R(Θ^d, F)", reduce_bytes(th_d, fg.fsdp_degree(ctx), b),
                 1, _R_TEXT),
            item("persistent", "experts' fp32 gradient shard, reduced earlier (freed gradients)",
                 _grad_shards(ctx, kind, dense=False), 1, "4⌈Θ^e/F_e⌉ (bytes; freed)"),
            item("boundaries", "layer-input gradient", N_sp * ctx.hidden_size, b, "N_sp·H"),
            *_released(ctx, r, kind, item)]


def embedding_steps(ctx: Ctx, kind1: str, item) -> dict:
    """Sub-steps of backward[1] after layer 1's reduction: the embedding's backward and its
    reduction (the table, ``V·H/tp·b``, is the phase's prefetch term on a mesh of several ranks)."""
    b, N_sp = ctx.act_bytes, ceil_div(ctx.tokens_per_rank, ctx.tp)
    VH = ceil_div(ctx.vocab_size * ctx.hidden_size, ctx.tp)
    shards = item("persistent", "layer 1's fp32 gradient shards (freed gradients)", _grad_shards(ctx, kind1), 1,
                  "4⌈Θ_1/F⌉ (bytes; freed)")
    rel = _released(ctx, 1, kind1, item)
    held1 = item("gathered", "layer 1's held reduce-scatter input", fg.layer_dense_params(ctx, kind1), 4, "Θ^d_1")
    one = np.asarray(fg.fsdp_degree(ctx)) == 1   # no prefetch buffer: the table is filled at its pre-backward
    return {
        "embedding backward (r = 1)": [
            item("gathered", "embedding table, unsharded (one-rank mesh: not prefetched)", VH * one, b,
                 "V·H/tp·[F=1]"),
            item("gathered", "embedding dense gradient", VH, b, "V·H/tp"),
            item("boundaries", "embedding-output gradient", N_sp * ctx.hidden_size, b, "N_sp·H"),
            held1, shards, *rel],
        "embedding gradient reduction (r = 1)": [
            item("gathered", "embedding table's prefetch, resharded (not live)", -VH * ~one, b, "−V·H/tp·[F>1]"),
            item("gathered", "embedding gradient reduction R(V·H/tp, F)", reduce_bytes(VH, fg.fsdp_degree(ctx), b), 1,
                 _R_TEXT),
            shards, *rel],
    }


def embedding_unshard(ctx: Ctx, kind1: str, item) -> list:
    """Sub-step of forward[1]: the embedding unit's unshard and forward before layer 1's unshard, its
    unsharded table ``V·H/tp`` beside its source (DeepSeek-V2-Lite W = 1 S = 4096: the step's peak
    sits in ``h = embed(tokens)``, two 400 MiB blocks above the step start, forward[1] 0.974 without
    it). On a mesh of several ranks the source is the all-gather output, which FSDP2 holds
    (``AllGatherState``) until layer 1's unshard, so the embedding's output, layer 1's input
    ``N_sp·H``, is made beside both tables (CPU whole-step trace, dense first layer in fp32: the
    peak at ``aten.embedding``, 2 × V·H·4 + N·H·4); on a one-rank mesh the source is the ``b``-byte
    cast of the fp32 shard, a local of ``FSDPParamGroup.wait_for_unshard`` freed when it returns,
    before the embedding's forward: ``max(2·V·H, V·H + N_sp·H)``. Layer 1 is not yet unsharded."""
    b, N_sp = ctx.act_bytes, ceil_div(ctx.tokens_per_rank, ctx.tp)
    VH = ceil_div(ctx.vocab_size * ctx.hidden_size, ctx.tp)
    one = np.asarray(fg.fsdp_degree(ctx)) == 1
    return [item("gathered", "embedding table, unsharded", VH, b, "V·H/tp"),
            item("gathered", "embedding table's source: the fp32 shard's cast [F=1] or the all-gather output",
                 VH, b, "V·H/tp"),
            item("gathered", "layer 1's params, not yet unsharded (not live)", -fg.layer_params(ctx, kind1), b,
                 "−Θ_1"),
            item("boundaries", "layer 1's input: beside both tables [F>1]; on a one-rank mesh made after the "
                 "cast copy is freed (not live beside it)", -np.minimum(N_sp * ctx.hidden_size, VH) * one, b,
                 "−min(N_sp·H, V·H/tp)·[F=1]")]


def previous_unshard(ctx: Ctx, r: int, kind: str, item) -> list:
    """Sub-step of backward[r ≥ 2] on a one-rank mesh: layer ``r−1``'s pre-backward fills its
    unsharded dense part (no all-gather buffer to prefetch into), after layer ``r``'s reductions:
    their held input and gradient shards beside it."""
    kinds, b = ctx.regions, ctx.act_bytes
    prev = fg.layer_dense_params(ctx, kinds[r - 2]) * (np.asarray(fg.fsdp_degree(ctx)) == 1)
    return [item("gathered", "layer r−1's unsharded dense part (one-rank mesh)", prev, b, "Θ^d_{r−1}·[F=1]"),
            item("gathered", "layer r's held reduce-scatter input", fg.layer_dense_params(ctx, kind), 4, "Θ^d_r"),
            item("persistent", "layer r's fp32 gradient shards (freed gradients)", _grad_shards(ctx, kind), 1,
                 "4⌈Θ_r/F⌉ (bytes; freed)"),
            item("boundaries", "layer-input gradient", ceil_div(ctx.tokens_per_rank, ctx.tp) * ctx.hidden_size, b,
                 "N_sp·H"),
            *_released(ctx, r, kind, item)]


def experts_unshard_extra(ctx: Ctx, kind: str):
    """Bytes beyond the unsharded experts while a one-rank expert mesh unshards them (``b < 4``: the
    fp32 shards are cast): the gate|up stack's ``b``-byte copy, ``n·H·2I·b``."""
    if kind != "moe":
        return np.int64(0)
    m, b = ctx.model, ctx.act_bytes
    n = m.num_experts // np.asarray(ctx.ep)
    one = (np.asarray(fg.expert_degree(ctx)) == 1) & (b < 4)
    return n * 2 * m.hidden_size * m.expert_ffn * b * one
