"""Live set ``boundaries`` of the composed stack without checkpointing (``checkpoint = none``):
what autograd keeps of each region until its backward.

Legend (DESIGN §1): ``N`` tokens per rank, ``H`` hidden, ``b`` bytes per scalar, ``D`` the Ulysses
degree, ``I_d`` / ``I_s`` dense FFN / shared-expert width, ``r`` the region of the phase.

Per region, read off the decoder (``planner/runtime/model.py``, ``model_layers.py``,
``attention.py``, ``moe_block.py``) and the H200 allocator history of ``planner validate``'s step
(``bench/results/memory_snapshot/dsv2-W8-S8192-no-checkpoint.json``):

    attention   the shared attention inventory (``fsdp2_saved.attention_saved_counts`` at ``D``):
                the input norm's fp32 copy, cast and weighted output, q, k, v as the kernel saw
                them, its output and lse, the o-projection's input (``head_to_seq``'s copy when
                ``D > 1``), QK-norm's and MLA's latent norms' saves, RoPE's cos/sin tables
    dense FFN   the norm's, and gate, silu(gate), up and their product: ``4·N·I_d``
    MoE         the norm's, the shared experts' ``4·N·I_s`` (and the shared gate's ``N·(H + 1)``),
                and what the dispatcher keeps (``dispatch.components``' ``saved``: the router's
                softmax and weights, the route indices, the imported experts' weights; standard EP
                and LLEP also the grouped MLP's rows)

Phase residency: every region before ``r`` (all of them at the head), plus the current region's
own where no other live set counts it. An attention region's backward working set is
``attention``'s (it books the same tensors as the kernel's inputs and the norm's recompute). In its
forward, the interior ``attention`` books already holds the tensors the region saves at and after
the projections (the normed input, q, k, v, the kernel's output and lse, the o-projection's input),
so only what the region saved before them is counted here (``attention_norm_counts``: the norms'
casts and fp32 copies, QK-norm's, MLA's latent norms', the RoPE tables). Booking the region's whole
inventory beside the interior was 1.02-1.11 (held-out round 5); booking nothing, 0.892 on Qwen3
W = 8 (QK-norm's fp32 copies at the q-RoPE sub-step, ``bench/results/memory_snapshot/
qwen3-W8-S32768-none.json``). A MoE region's routed experts and router are
``dispatch``'s; a dense FFN region's saves, and a MoE region's norm, are counted here, and a dense
FFN backward's gated-MLP moment beyond its four saved products. A MoE region's shared experts run after the routed experts, so
in forward their saves are the excess of their sub-step over the dispatch's, and in backward (run
first) they are freed before the dispatch's backward, which holds the gradient they sent to the
normed input (``N·H``). The region input stays live through a region's forward (the residual
add), the final norm's saves through the head. A region's backward holds the incoming boundary
gradient, a MoE region's also the gradient into its normed input; a GQA/MHA attention or dense FFN
region makes its outgoing one only in its input norm's backward (``attention_backward``'s end
sub-step counts it), so it books one ``N·H`` (``grads_per_nh``: two were one ``N·H·b`` over in every
such backward, held-out rounds 5 and 6); so does an MLA region, whose backward peaks in the
efficient kernel's backward with the incoming gradient alone (``attention_mla``: without
checkpointing there is no recompute sub-step; its kernel sub-step books the output's and q, k, v's
gradients, wo's weight gradient and the kernel's workspace). The sub-steps that outgrow their
interior at large ``N`` (a MoE region's input-norm backward, a dense FFN's residual add) are
``saved_substeps``'.
"""

from __future__ import annotations

import functools

import numpy as np

from planner.budget import boundaries, fsdp2_saved, saved_substeps
from planner.budget.dispatch_edges import NONE_SOURCE, books_region_io
from planner.budget.terms import ALL_STEP, Phase, Term
from planner.context.ctx import Ctx

SOURCE = ("tensor inventory of planner/runtime/{model,model_layers,attention,moe_block}.py without "
          "checkpointing; H200 allocator history (bench/results/memory_snapshot/"
          "dsv2-W8-S8192-no-checkpoint.json): per RMSNorm model_layers.py:72 N·H fp32 and :74 2·N·H b, "
          "per dense FFN model_layers.py:109 4·N·I_d, per MoE region :109 4·N·I_s (shared experts) and "
          "the dispatcher's imported weights (exchange.py:179/180) through the head")
GRAD_SOURCE = ("; H200 allocator history of the composed step without checkpointing (bench/results/"
               "memory_snapshot/qwen3-W8-S32768-none.json backward[1], QK-norm's backward over q at N = 8192): "
               "one N·H gradient, ToCopyBackward0 32 MiB (the incoming one; the other 8 MiB block is k's), "
               "beside a k/v gradient from head_to_seq 8 MiB, wo's weight gradient 16 MiB and the two 32 MiB "
               "cuBLAS workspaces (attention.py:136, strip_logits: each stream's first matmul); booking two "
               "was one N·H·b over in every attention and dense FFN backward that binds (held-out rounds 5 "
               "and 6: Qwen3 W = 64 N = 16384 backward[1] 1.023, W = 1 N = 16384 1.007, W = 8 N = 8192 "
               "1.012-1.015; "
               "DeepSeek-V2-Lite W = 1 N = 16384 backward[1]-[3] 1.008-1.011, all 64 MiB at N·H·b = 64). "
               "MLA at D > 1 (dsv2-W32-S32768-none.json backward[3], N = 2048, D = 16): one 8 MiB incoming "
               "gradient among the autograd blocks at the efficient kernel's backward (its 42.8 MiB workspace, "
               "dq, dk, dv, delta and wo's 8 MiB weight gradient, beside seq_to_head's 8 MiB output gradient, "
               "attention.py:47)")


def _int(v):
    return int(v) if np.ndim(v) == 0 else v


def grads_per_nh(ctx: Ctx, kind: str):
    """Boundary gradients (in ``N·H``) a region of ``kind`` books in its backward: the incoming one
    alone in an attention (GQA/MHA or MLA) or dense FFN region, whose outgoing one is made in the
    input norm's backward (``attention_backward``'s end sub-step; after MLA's efficient-kernel
    backward; the dense FFN's, after its gated MLP's larger moment), as in a checkpointed region
    (``boundaries.PAST_RECOMPUTE``); two in a MoE region (``boundaries.moe_grads``)."""
    if kind == "moe":
        return boundaries.moe_grads(ctx)
    return 1


def _norm(ctx: Ctx, N) -> tuple:
    """An RMSNorm over ``H``: cast and weighted output (b), fp32 copy and rsqrt."""
    H = ctx.hidden_size
    return 2 * H * N, (boundaries.NORM_FP32 * H + 1) * N


def region_counts(ctx: Ctx, r: int) -> tuple:
    """``(b elements, fp32 elements)`` region ``r`` (1-based) keeps, its dispatcher's saves left
    to ``dispatch_saved``."""
    kind, N = ctx.regions[r - 1], ctx.tokens_per_rank
    if kind == "attention":
        layer = (r + 1) // 2
        return fsdp2_saved.attention_saved_counts(ctx, False, layer in fsdp2_saved.local_layers(ctx),
                                                  seq_group=ctx.seq_parallel)
    nb, nf = _norm(ctx, N)
    if kind == "dense_mlp":
        return nb + 4 * ctx.dense_ffn * N, nf
    m = ctx.model
    I_s = m.shared_expert_ffn or 0
    gate = (ctx.hidden_size + 1) * N if I_s and m.shared_expert_gate else 0
    return nb + 4 * I_s * N + gate, nf


def attention_norm_counts(ctx: Ctx) -> tuple:
    """``(b elements, fp32 elements)`` an attention region saves that its forward interior does not
    hold: attention_norm's saves but its output (the interior's normed input), QK-norm's
    (``fsdp2_saved.qk_norm_counts``), MLA's latent norms' (``boundaries.latent_norms_per_token``,
    ``latent_norm_fp32``) and the RoPE tables."""
    N, H = ctx.tokens_per_rank, ctx.hidden_size
    nb, nf = _norm(ctx, N)
    qb, qf = fsdp2_saved.qk_norm_counts(ctx)
    lb, lf = boundaries.latent_norms_per_token(ctx)
    return (nb - N * H + qb + N * lb,
            nf + qf + N * (lf + boundaries.latent_norm_fp32(ctx) + fsdp2_saved.rot_dim(ctx)))


def _own(ctx: Ctx, ph: Phase) -> tuple:
    """The current region's saves counted here (module docstring)."""
    if ph.kind not in ("forward", "backward") or (ph.region_kind == "attention" and ph.kind == "backward"):
        return 0, 0
    if ph.region_kind == "attention":   # forward: the norms' saves beside the interior (QK-norm, RoPE)
        return attention_norm_counts(ctx)
    if ph.region_kind == "dense_mlp":
        return region_counts(ctx, ph.region)
    return _norm(ctx, ctx.tokens_per_rank)


def own_bytes(ctx: Ctx, ph: Phase):
    """Bytes of the current region's saves that these terms count in ``ph`` (made inside the
    region: the unshard sub-step before them, ``gathered_unshard.forward_substep``, excludes them)."""
    nb, nf = _own(ctx, ph)
    return np.asarray(nb, np.int64) * ctx.act_bytes + np.asarray(nf, np.int64) * 4


def _before(ph: Phase, L_b: int) -> int:
    return L_b if ph.kind == "head" else ph.region - 1


def terms(ctx: Ctx, disp_comps: dict | None, op_name: str) -> list[Term]:
    """Boundary terms of one rank, composed stack, ``checkpoint = none`` (``disp_comps``:
    ``dispatch.components``' per-phase components, ``None`` without MoE regions)."""
    N, H, b, L_b = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes, ctx.num_boundaries
    per = [region_counts(ctx, r) for r in range(1, L_b + 1)]
    cum_b, cum_f = [np.int64(0)], [np.int64(0)]   # regions 1..j (counts may be per-candidate arrays)
    for pb, pf in per:
        cum_b.append(cum_b[-1] + np.asarray(pb, np.int64))
        cum_f.append(cum_f[-1] + np.asarray(pf, np.int64))

    def saved(i):
        def at(ph: Phase):
            return cum_b[_before(ph, L_b)] + _own(ctx, ph)[0] if i == 0 else cum_f[_before(ph, L_b)] + _own(ctx, ph)[1]
        return at

    grads_nh = {k: grads_per_nh(ctx, k) for k in set(ctx.regions)}
    most = functools.reduce(np.maximum, grads_nh.values())
    formula = "Σ_{regions < r} saved·N (all at the head) + the current dense FFN region's, or MoE region's norm"
    out = [
        Term("saved activations", "boundaries", cum_b[-1], b, formula + " (b-byte tensors)", ALL_STEP,
             at=saved(0), source=SOURCE),
        Term("saved activations (fp32: norms' copies and rsqrt, lse, RoPE tables)", "boundaries", cum_f[-1], 4,
             formula + " (fp32 tensors)", ALL_STEP, at=saved(1), source=SOURCE),
        Term("region input (the residual)", "boundaries", N * H, b, "N·H", ("forward",), source=SOURCE),
        Term("region output", "boundaries", N * H, b, "N·H  [after the interior: not in an attention region's; "
             "MoE regions under LLEP and standard EP (and PipelinedLLEP's destination variant): dispatch's]",
             ("forward",), regions=("dense_mlp",) if books_region_io(ctx) else ("dense_mlp", "moe"),
             source=boundaries.SOURCE),
        Term("boundary grad in/out", "boundaries", _int(most * N * H), b,
             "N·H in attention and dense FFN regions (the incoming one: the outgoing one is made later, in the "
             "input norm's backward), and in MoE regions under LLEP, standard EP and PipelinedLLEP's destination "
             "variant (their dispatcher makes the gradient into the normed input, counted there); other MoE "
             "regions 2·N·H",
             ("backward",), at=lambda ph: grads_nh[ph.region_kind] * N * H,
             source=boundaries.SOURCE + GRAD_SOURCE + "; " + NONE_SOURCE),
    ] + boundaries.final_norm_terms(ctx, N, H)
    if "dense_mlp" in set(ctx.regions):
        extra = _dense_backward_extra(ctx)
        out.append(Term("dense FFN backward: the gated MLP's binding moment beyond its 4 saved products", "boundaries",
                        int(extra) if np.ndim(extra) == 0 else extra, b,
                        "max(0, dense backward moment − 4·N·I_d)  (ffn.dense_backward_moment; the down projection's "
                        "saved input is freed by then)", ("backward",), regions=("dense_mlp",),
                        source=SOURCE + "; held-out round 5, deepseek-v2-lite W = 1 backward[2] 0.942 without it"))
        out += saved_substeps.dense_residual_add(ctx)
    if disp_comps is not None:
        out += _dispatch_saved(ctx, disp_comps, op_name) + _shared(ctx, disp_comps)
        out += saved_substeps.moe_norm_backward(ctx, _bytes(disp_comps.get("backward", {})), grads_nh["moe"],
                                                bool(ctx.model.shared_expert_ffn))
    return out


def _dense_backward_extra(ctx: Ctx):
    """Elements (b) of the dense FFN backward's binding moment beyond its four saved products."""
    from planner.budget import ffn

    act = ffn.dense_backward_moment(ctx)[0]
    return np.maximum(np.asarray(act) - 4 * np.asarray(ctx.tokens_per_rank) * ctx.dense_ffn, 0)


def compute_only_backward_bytes(ctx: Ctx, ph: Phase):
    """Bytes these terms book in ``ph`` that exist only once the region's backward computes (the
    dense FFN's gated-MLP moment), not at the unshard that starts it
    (``gathered_unshard.backward_substep``); 0 for any other stack or checkpointing."""
    if ctx.stack != "composed" or ctx.checkpoint != "none" or ph.kind != "backward" or ph.region_kind != "dense_mlp":
        return np.int64(0)
    return _dense_backward_extra(ctx).astype(np.int64) * ctx.act_bytes


def _dispatch_saved(ctx: Ctx, comps: dict, op_name: str) -> list[Term]:
    """What each earlier MoE region's dispatcher keeps for its backward."""
    moe_before = np.cumsum([0] + [k == "moe" for k in ctx.regions])
    L_b = ctx.num_boundaries
    out = []
    for (buf, eb), count in sorted(comps.get("saved", {}).items()):
        if not np.any(np.asarray(count)):
            continue
        out.append(Term(f"{op_name}: {buf.name} (kept by each earlier MoE region)", "boundaries",
                        moe_before[-1] * np.asarray(count), eb, f"n_moe(< r)·{buf.formula}", ALL_STEP,
                        at=lambda ph, c=count: moe_before[_before(ph, L_b)] * np.asarray(c),
                        source="planner.budget.dispatch_inventory saved_end; " + SOURCE))
    return out


def _bytes(moment: dict):
    return sum((np.asarray(c, np.int64) * eb for (_, eb), c in moment.items()), np.int64(0))


def _shared(ctx: Ctx, comps: dict) -> list[Term]:
    """A MoE region's shared experts: their forward sub-step (the routed output, the dispatcher's
    saves, gate, silu, up, product and the down output, then the sum of the two outputs) as the
    excess over the dispatch's; in backward the gradient they sent to the normed input, held
    through the dispatch's backward. At the sum three ``N·H`` are live (the routed output, the
    shared experts' and their sum): the region output term counts the routed output, so the
    sub-step books 2, or all 3 where ``dispatch`` books the routed output (``books_region_io``)."""
    I_s, N, H, b = ctx.model.shared_expert_ffn, ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    if not I_s:
        return []
    outs = 3 if books_region_io(ctx) else 2
    sub = _bytes(comps.get("saved", {})) + (4 * N * I_s + outs * N * H) * b
    v = np.maximum(sub - _bytes(comps.get("forward", {})), 0)
    v = -(-v // b)
    return [
        Term("shared experts forward: 4 saved products and the down output beside the dispatcher's saves "
             "(excess over the dispatch sub-step)", "boundaries", int(v) if np.ndim(v) == 0 else v, b,
             "max(0, dispatcher's saves + (4·N·I_s + 2·N·H)·b − dispatch forward)/b; 3·N·H (the routed output, "
             "the shared one and their sum) where dispatch books the routed output", ("forward",),
             regions=("moe",), source=SOURCE),
        Term("shared experts' input gradient, held through the dispatch backward", "boundaries", N * H, b, "N·H",
             ("backward",), regions=("moe",), source=SOURCE),
    ]
