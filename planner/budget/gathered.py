"""Live set ``gathered``: ZeRO-3 / FSDP2 all-gathered weights and unreduced gradients (DESIGN §3.2).

Composed stack:

    region weights (bf16)      forward[r]: Θ_r·(2 if W>1)       unsharded + held all-gather output
                               backward[r]: Θ_r + Θ_{r−1}       current + prefetched (W > 1)
    unreduced region grads     Θ_region(r) + Θ_unit(r+1)        backward[r]: region r's, and the
                                                                reduce-scatter input of the unit
                                                                before it, which FSDP2 holds
    embedding sub-step         max(0, 2·V·H + N·H − A_f)        forward[1]: all-gather output +
                                                                unsharded table + its output
    embedding re-gathered      V·H if W > 1                     backward[1]: FSDP2 prefetches the
                                                                table during region 1's backward
                                                                (at W = 1 it copies it in later, at
                                                                the embedding's own pre-backward)
    embedding backward         max(0, max(2·V·H + V·H/W·[W>1],  backward[1], after region 1's: the
    sub-steps                  2·V·H + Θ_1 + N·H + 2·N·H) − A_b) reduce-scatter (dense grad, flat
                                                                input, new shard), or the kernel
                                                                (unsharded table, dense grad, fp32
                                                                segment sums, region 1's held
                                                                reduce-scatter input, N·H grad)
    unshard sub-step           max(0, Θ_{r−1} − A_r) if W > 1   forward[r ≥ 2]: region r's unshard
                                                                copies out of its all-gather output
                                                                while region r−1's is still held
    backward unshard sub-step  max(0, Θ_r − Θ_{r−1} − own grads  backward[r]: region r's unshard
                               − A_r) if W > 1                  before its gradients and the prefetch
                                                                (``gathered_unshard``)
    head (ZeRO-3, P = 1)       V·H                              head

The embedding runs before region 1's attention (forward) and after it (backward), so its tensors
and the region's are never live together: phase ``r = 1`` holds the larger of the two sub-steps.
``A_f``/``A_b`` are region 1's own bytes in that phase (its gathered weights and grads, boundaries,
attention and its attention kernels' buffers; not the library handles' workspaces, which every phase
holds); the embedding terms are the excess over them.
FSDP2's all-gather copies out of its flat output into the unsharded table (both live), and its
reduce-scatter copies the dense gradient into a flat input (both live): the whole-step trace's
forward[1] and backward[1] peaks (``tests/trace/test_step_trace.py``).

FSDP2 frees a unit's all-gather output in the forward only once the next unit's all-gather has run
(``wait_for_unshard`` keeps it in ``all_gather_state`` for overlap), so region ``r``'s unshard holds
region ``r−1``'s output, its own output and its unsharded parameters, before any of the region's
activations exist: ``A_r`` is region ``r``'s ``attention``, ``ffn`` and ``dispatch`` bytes in
``forward[r]``, and the term is the excess over them. It binds where a large unit is followed by a
region with small activations (DeepSeek-V2-Lite's dense FFN before layer 1's attention at N = 2048).

FSDP2 baseline: ``planner.budget.fsdp2_gathered`` (per FSDP unit; the layer's sub-steps in
``planner.budget.fsdp2_layer``).
"""

from __future__ import annotations

import numpy as np

from planner.budget import gathered_unshard
from planner.budget.gathered_units import SOURCE
from planner.budget.gathered_units import as_int as _int, by_region as _by_region, unit_params as _unit_params
from planner.budget.terms import FWD_BWD, Phase, Term
from planner.context.ctx import Ctx


def _region1_bytes(ctx: Ctx, kind: str, own: list[Term]):
    """Region 1's bytes in ``kind``[1] beyond the persistent state and the library handles'
    workspaces: its gathered, attention and boundary terms and its attention kernels' buffers."""
    from planner.budget import attention, boundary_terms, workspace

    ph = Phase(kind, 1, ctx.regions[0])
    # the attention kernels' buffers (MLA's efficient kernel, FlashAttention's and the sliding
    # window's backward accumulators) sit in the region's own bytes, and the embedding's sub-steps
    # come after them: the H200 holds none at those sub-steps (gpt-oss-20b W = 8 / 64 backward[1]
    # without the 134.7 MB sliding-window accumulator); the library handles' workspaces stay apart
    kernel_ws = [t for t in workspace.terms(ctx) if tuple(t.phases) != tuple(workspace.EVERY_PHASE)]
    ts = [*own, *attention.terms(ctx), *boundary_terms.terms(ctx), *kernel_ws]
    return sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in ts), np.int64(0))


EMBEDDING_FEATURE_KERNEL_MAX = 3072
"""``embedding_dense_backward_cuda`` takes its feature kernel (no sort, no per-segment fp32 sums)
for at most this many indices without ``scale_grad_by_freq``."""


def _embedding_substeps(ctx: Ctx, own: list[Term]) -> list[Term]:
    b, N, H = ctx.act_bytes, ctx.tokens_per_rank, ctx.hidden_size
    VH = ctx.vocab_size * H

    def excess(total_bytes, kind):
        v = np.maximum(np.asarray(total_bytes, dtype=np.int64) - _region1_bytes(ctx, kind, own), 0)
        v = -(-v // b)
        return int(v) if np.ndim(v) == 0 else v

    multi = np.where(np.asarray(ctx.world_size) > 1, 1, 0)
    prefetch = Term("embedding table, re-gathered by FSDP2's backward prefetch", "gathered", _int(VH * multi), b,
                    "V·H if W > 1", ("backward",), first_region_only=True,
                    source=SOURCE + "; H200 validate run: backward[1] − backward[3] ≈ V·H (Qwen3 614 vs "
                    "594 MiB), gpt-oss backward[1] 0.99-1.01 with it; gpt-oss-W8 backward[1]: the 1104.6 MiB "
                    "table (empty_cuda). At W = 1 FSDP2's unshard() allocates nothing (no all-gather) and "
                    "wait_for_unshard() copies the table in at the embedding's own pre-backward, after region "
                    "1's (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): qwen3-W1 and "
                    "deepseek-v2-lite-W1 backward[1] hold no table copy")
    own = [*own, prefetch]
    # no all-gather output at W = 1: the unshard copies the one-rank shard into the unsharded table
    fwd = excess(((1 + multi) * VH + N * H) * b, "forward")
    # after region 1's backward, the larger of two sub-steps binds (H200 allocator histories,
    # bench/results/memory_snapshot/, cluster allocator mode):
    # - the embedding's backward: the unsharded table, its dense gradient and the kernel's fp32
    #   per-segment sums (N·H·4 B), beside region 1's held reduce-scatter input and the embedding
    #   output's gradient (gpt-oss-20b W = 64, N = 4096);
    # - its post-backward (bf16 reduce): the dense gradient, the reduce-scatter input and, at W > 1,
    #   the reduce-scatter output (a new shard in either gradient lifetime; gpt-oss-20b W = 8, N = 4096)
    theta_1 = np.asarray(_unit_params(ctx, np.asarray(ctx.vocab_parallel))[0])
    rs_out = 0 if ctx.model.tie_embeddings else -(-VH // np.asarray(ctx.world_size))
    # the per-segment fp32 sums exist only on the sorting path: at most EMBEDDING_FEATURE_KERNEL_MAX
    # indices take embedding_backward_feature_kernel, which accumulates into the gradient directly
    seg_sums = np.where(np.asarray(N) > EMBEDDING_FEATURE_KERNEL_MAX, -(-(N * H * 4) // b), 0)
    bwd = excess(np.maximum(2 * VH + rs_out * multi, 2 * VH + theta_1 + N * H + seg_sums) * b, "backward")
    return [prefetch,
        Term("embedding sub-step: all-gather output + unsharded table + output (excess over region 1)",
             "gathered", fwd, b, "max(0, V·H·(1 + [W > 1]) + N·H − A_f)", ("forward",), first_region_only=True,
             source=SOURCE + "; whole-step trace forward[1]; H200 validate at W = 1 (no all-gather output): "
             "qwen3-30b-a3b and deepseek-v2-lite S16384 forward[1] measured one V·H below 2·V·H + N·H"),
        Term("embedding backward sub-steps: its backward beside the unsharded table, or its reduce-scatter "
             "(excess over region 1)", "gathered", bwd, b,
             "max(0, max(2·V·H + ceil(V·H/W)·[W > 1], 2·V·H + Θ_region(1) + N·H + N·H·4/b·[N > 3072]) − A_b)",
             ("backward",),
             first_region_only=True, source=SOURCE + "; H200 allocator histories in the cluster's allocator mode "
             "(bench/results/memory_snapshot/gptoss-W8-S32768.json, gptoss-W64-S32768.json: "
             "EmbeddingBackward0's table-sized gradient beside the resized unsharded table at W = 64, beside the "
             "reduce-scatter input and output at W = 8); planner validate of the same cases "
             "(bench/results/validate/validate_expandable.json); gpt-oss-20b W1 S16384 backward[1]: the phase "
             "peaks in region 1's attention backward (12.31 GiB), below both; deepseek-v2-lite W = 32 / 64, "
             "N = 2048 (dsv2-W32-S32768-none.json, dsv2-W64-S32768.json): no per-segment sums, the phase "
             "peaks at the prefetched table's copy-out, 2·V·H + Θ_region(1) + N·H"),
    ]


def _region_weights(ctx: Ctx, P) -> list[Term]:
    """Gathered region weights. ``forward[r]``: region ``r``'s unsharded parameters and, when
    ``W > 1``, the all-gather output they were copied out of, which FSDP2 keeps until the next
    unit's all-gather (no forward prefetch). ``backward[r]``: region ``r``'s parameters and the
    all-gather output of region ``r−1``'s backward prefetch (``W > 1``; before region 1 the
    embedding's, a term of its own)."""
    units = _unit_params(ctx, P)[:-1]
    two = np.where(np.asarray(ctx.world_size) > 1, 1, 0)
    fwd = [np.asarray(u) * (1 + two) for u in units]
    bwd = [np.asarray(units[r - 1]) + (np.asarray(units[r - 2]) * two if r >= 2 else 0)
           for r in range(1, len(units) + 1)]
    big = fwd[0]
    for c in fwd[1:] + bwd:
        big = np.maximum(big, c)

    def at(ph: Phase):
        v = (fwd if ph.kind == "forward" else bwd)[ph.region - 1]
        return int(v) if np.ndim(v) == 0 else v

    return [Term("region weights: unsharded + all-gather output (forward), + prefetched region (backward)",
                 "gathered", int(big) if np.ndim(big) == 0 else big, ctx.act_bytes,
                 "forward[r]: Θ_region(r)·(2 if W > 1 else 1); backward[r]: Θ_region(r) + Θ_region(r−1) if W > 1",
                 FWD_BWD, at=at,
                 source=SOURCE + "; H200 allocator history of planner validate: gpt-oss-W8 forward[3] holds "
                 "101.3 MiB at the attention region's call (the 50.6 MiB all-gather output and the 50.6 MiB "
                 "of unsharded parameters), its MoE forward[2] none of region 3's; qwen3-W1 forward[1] 36 MiB "
                 "(no all-gather output at W = 1); gpt-oss-W8 backward[4] holds region 3's 50.6 MiB "
                 "all-gather output")]


def _qkv_grads_not_yet_made(ctx: Ctx):
    """Elements of a global GQA/MHA layer's q, k, v projection gradients (weights and biases) that
    do not exist yet when its backward peaks in FlashAttention's backward or QK-norm's (they come
    from the projections' backward, after both, before attention_norm's): ``min(Θ_qkv, lead)``,
    ``lead`` the kernel's (with its workspace) or QK-norm's sub-step over attention_norm's, so the
    phase holds ``max(kernel + workspace − Θ_qkv, qk_norm − Θ_qkv, end) + Θ_region``
    (``planner.budget.attention_backward``; H200 allocator history of gpt-oss-20b W = 64 at 32k,
    bench/results/memory_snapshot/gptoss-W64-S32768.json: backward[3]'s peak is inside
    ScaledDotProductFlashAttentionBackward0 with wo's gradient and none of wq, wk, wv's)."""
    from planner.budget import attention_backward

    m, H, b = ctx.model, ctx.hidden_size, ctx.act_bytes
    width = m.num_heads * m.head_dim + m.num_kv_heads * (m.head_dim + m.v_dim)
    qkv = width * H + (width if m.attention_bias else 0)
    s = attention_backward.substeps(ctx)
    ws = sum(np.asarray(s[n]) for n in ("accum", "expansion", "copies"))
    lead = np.maximum(np.maximum(np.asarray(s["kernel"]) + ws, np.asarray(s["qk_norm"])) - np.asarray(s["end"]), 0)
    return np.minimum(qkv, lead // b)


def _unreduced_grads(ctx: Ctx, P) -> Term:
    """``backward[r]``: region ``r``'s unsharded gradients, and the reduce-scatter input of the unit
    whose backward ran before it (region ``r+1``; after the last region the ``[norm, head]`` unit),
    which FSDP2 keeps until the next reduce-scatter (``reduce_scatter_max_input_buffers``).

    A dense FFN region's own count is ``Θ_region(r)`` less the weight gradients its gated MLP's
    binding backward moment has not made yet (``ffn.dense_backward_moment``): at large ``N`` mul's
    backward binds with only w_down's gradient made (deepseek-v2-lite-W1 backward[2]: MmBackward0's
    42.75 MiB w_down gradient, no w_gate/w_up gradient at the peak; W = 16 at N = 1024,
    bench/results/validate/validate_heldout.json: none either), at small ``N`` gate's backward with
    all three (W = 16 at N = 512, validate_heldout_r2.json)."""
    units = _unit_params(ctx, P)
    own = list(units[:-1])
    if "dense_mlp" in set(ctx.regions):    # the gated FFN's backward peaks before w_gate's, w_up's grads
        from planner.budget.ffn import dense_backward_moment

        late = dense_backward_moment(ctx)[1]
        own = [np.asarray(u) - late if k == "dense_mlp" else u for u, k in zip(own, ctx.regions)]
    if ctx.model.attention == "mla" and ctx.model.mla is not None:   # wo's at the kernel, none at the recompute
        from planner.budget import attention_mla

        rec, wo = attention_mla.recompute_binds(ctx), attention_mla.kernel_grad_params(ctx)
        own = [np.where(rec, 0, wo) if k == "attention" else u for u, k in zip(own, ctx.regions)]
    elif "attention" in set(ctx.regions):   # a global layer's q, k, v grads come after its kernel
        from planner.budget.attention_sliding import local_regions

        local, early = set(local_regions(ctx)), _qkv_grads_not_yet_made(ctx)
        own = [np.asarray(u) - early if k == "attention" and r not in local else u
               for r, (u, k) in enumerate(zip(own, ctx.regions), 1)]
    cnt = [np.asarray(own[r - 1]) + np.asarray(units[r]) for r in range(1, len(units))]
    big, at = _by_region(cnt)
    return Term("unreduced grads: region r's, and the held reduce-scatter input of region r+1 (bf16)",
                "gathered", big, ctx.act_bytes,
                "Θ_region(r) + Θ_unit(r+1)  (unit L_b+1: final norm [+ V·H when the head is ZeRO-3]; dense FFN "
                "region r: − the weight gradients not yet made at its binding moment (ffn.dense_backward_moment); MLA attention region r: Θ_wo at its kernel sub-step, 0 where its recompute sub-step binds; "
                "global GQA attention region r: − min(Θ_qkv, the kernel's or QK-norm's sub-step's lead over attention_norm's))", ("backward",), at=at,
                source=SOURCE + "; H200 allocator history of planner validate: qwen3-W1 backward[4] holds "
                "2 × V·H·b (the [norm, head] unit's reduce-scatter input and output), gpt-oss-W8 backward[2] "
                "holds region 3's 50.6 MiB reduce-scatter input beside region 1's all-gather buffer; whole-step trace "
                "of deepseek-v2-lite W = 8 backward[3]: no gradient of the region at its recompute's peak; H200 "
                "allocator histories of deepseek-v2-lite W = 1 S = 8192 and W = 32 S = 32768 without "
                "checkpointing, backward[3]: wo's 8 MiB gradient (MmBackward0) alone at the kernel's backward")


def terms(ctx: Ctx) -> list[Term]:
    """Gathered terms of one rank."""
    if ctx.stack == "fsdp2":
        from planner.budget import fsdp2_gathered

        return fsdp2_gathered.terms(ctx)
    b = ctx.act_bytes
    VH = ctx.vocab_size * ctx.hidden_size
    P = np.asarray(ctx.vocab_parallel)
    out = [
        *_region_weights(ctx, P),
        _unreduced_grads(ctx, P),
        gathered_unshard.forward_substep(ctx, P),
    ]
    out.append(gathered_unshard.backward_substep(ctx, P, out))
    out += _embedding_substeps(ctx, out)
    if ctx.vocab == "dense" or bool(np.any(P == 1)):
        rows = VH if ctx.vocab == "dense" else np.where(P == 1, VH, 0)
        out.append(Term("head gather (ZeRO-3, P = 1)", "gathered", rows, b, "V·H if P = 1", ("head",),
                        source=SOURCE))
    return out
