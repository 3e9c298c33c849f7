"""The current layer's working set in the FSDP2 baseline (one region per layer): its sub-steps run
one after the other, so a layer phase holds the **largest** of them, not their sum.

Legend: ``N`` tokens per rank (``S/cp``), ``N_sp = ceil(N/tp)``, ``H`` hidden, ``b`` bytes per
activation scalar, ``h_q = n_h/tp``, ``h_kv = n_kv/tp`` heads, ``qkv = N·(h_q·d_qk + h_kv·(d_qk+d_v))``,
``o = N·h_q·d_v``, ``I_d`` dense FFN width, ``I_s`` shared-expert width, ``D`` the routed experts'
dispatch working set of the phase (``planner.budget.dispatch``, standard EP; it includes the MoE
rows autograd saves), ``A`` the attention's saved tensors (``planner.budget.boundaries``
``saved_per_token``: normed input and its weighted copy, q, k, v, output, the norm's fp32 copy and
rsqrt, lse, and the RoPE cos/sin tables ``N·d_rot`` fp32), ``Θ^d`` / ``Θ^e`` the layer's dense /
expert parameters (``planner.budget.fsdp2_gathered``), ``[c]`` 1 when ``c`` holds.

Sub-steps (GPU allocator history of ``planner validate``'s step, ``bench/memory_snapshot.py``, H200;
the site named is the allocating line of ``planner/runtime``):

forward[r]
    attention      at the kernel: normed input N·H, qkv, o, lse N·h_q (fp32), the context-parallel
                   K/V buffers, the ring's and MLA's own tensors (``planner.budget.fsdp2_ring``), the
                   layer's all-gather output Θ^d held by FSDP2 [F>1]
    attention o-proj  after it: normed input, qkv, o, lse, o-proj output N·H, Θ^d held [F>1]
    ffn (moe)      the attention-region output N_sp·H (``model.py`` attention_region), the normed
                   FFN input N·H (``model_layers.py`` RMSNorm; without checkpointing its saved fp32
                   copy N_sp·H·4 and both outputs 2·N·H instead), D; the experts' all-gather output
                   Θ^e held [F·tp/ep > 1] (the layer's own is freed by the experts' all-gather); under
                   ac = none / selective the attention's saved A (A_SAC) as well
    ffn (dense)    the same two N·H, gate, silu and up 3·N·I_d/tp (``model_layers.py`` GatedMLP:
                   DeepSeek W64 forward[1], three 684 MiB blocks), the layer's all-gather output
                   Θ^d held [F>1] (the 309 MiB of its 11 blocks = 2·Θ^d)
    shared experts the two N·H, the routed output N·H, the shared experts' 3·N·I_s/tp (they run
                   after the routed experts, whose rows are freed by then)
    attention RoPE the normed input N·H, q, k, v before the rotation, the cos/sin tables N·d_rot
                   (fp32), the rotation's fp32 copy [b<4] and four half-width fp32 products
                   (``model_layers.py`` apply_rope: N·h_q·d_rot·(8+4[b<4]) bytes at the queries'),
                   Θ^d held [F>1] (binds where the FFN is narrow: CPU trace, dense first layer)
    head gather    (r = L) the last layer's output, the head unit's unsharded weight and its held
                   all-gather output V·H/tp·[F>1] (FSDP2's pre-forward of the final norm runs
                   before the head phase starts), the last layer's last all-gather output (the
                   experts' Θ^e [F·tp/ep>1]), which the head's ``wait_for_unshard`` keeps in a local
                   until it returns, less the resharded layer's Θ_L; without checkpointing the last
                   layer's saved tensors too
    ac = selective keeps, instead of A, torchtitan's SAC outputs (``fsdp2_saved.sac_saved_parts``:
                   every addmm, every second mm, the router's top-k, the SDPA output and lse)

backward[r] (ac = full recomputes the whole layer first, so A and the FFN's saved tensors exist
again; ac = none keeps them from the forward)
    ffn (moe)      A, the FFN norm's fp32 copy and normed input N·H·4 + 2·N·H·b, D; with shared
                   experts (they ran last, so their backward ran first) their weight gradients
                   3·H·I_s/tp and input gradient N·H (DeepSeek W64 backward[2]: MmBackward0 3 × 11
                   + 128 MiB; none of their activations)
    shared experts A, the FFN norm's, the routed experts' saved rows (≈ D_f), the shared experts'
                   saved gate, silu, up and in-flight gradients 6·N·I_s/tp, their weight gradients
    ffn (dense)    A, the FFN norm's, GatedMLP's saved gate, silu, up 3·N·I_d/tp, the in-flight
                   gradients of the product, gate and up 3·N·I_d/tp and the down projection's weight
                   gradient H·I_d/tp (DeepSeek W64 backward[1]: MulBackward0 2 × 684, MmBackward0 684
                   + 42.8 MiB)
    FFN norm bwd   (dense) A, the FFN norm's fp32 copy, RMSNorm's fp32 backward temporaries
                   5·N_sp·H·4 (``NORM_BWD_SOURCE``), the FFN's and the norm's weight gradients
                   3·H·I_d/tp + H (binds where the FFN is narrow: CPU trace, dense first layer)
    attention      A, the gradients of q, k, v and o, the context-parallel K/V buffers, the
                   attention-region gradient N_sp·H, the
                   attention's weight gradients Θ_attn/tp, FlashAttention's dq_accum/softmax_d
                   ``w_fa·N·h_q·d_qk`` bytes and (GQA) its dk/dv expansion ``N·h_q·(d_qk+d_v)·b``,
                   the ring backward's buffers and (dense) the FFN's weight gradients
    dK/dV exchange (cp > 1) after the ring's first kernel: its fp32 dK/dV send and receive instead
                   of the workspace, wo's weight gradient only (``planner.budget.fsdp2_ring``)
    reductions     (``planner.budget.fsdp2_reduce``) the routed experts' (MoE: while the rest of
                   the layer's backward is still to run), the layer unit's, on a one-rank mesh the
                   previous layer's unshard (r ≥ 2), and at r = 1 the embedding's backward and
                   reduction; each lists the phase-wide terms released by then with negative counts
forward[r], one-rank expert mesh: the experts' unshard, the gate|up stack's cast copy beside them

The reference sub-step (ffn) is counted term by term (D stays in ``dispatch``); every other
sub-step adds its excess over the reference, ``max(0, T_s − T_ffn)``, so a phase holds
``max_s T_s`` (a sub-step may list a phase-wide term that is not live at its moment with a
negative count: only its total is used). Not read off an allocator history yet: ``tp > 1`` (the
MoE block's tokens and expert sharding under TP); the attention RoPE and FFN norm backward sub-steps
are read off the CPU whole-step trace (``tests/trace/test_fsdp2_trace.py``), the same eager ops the
GPU runs, which bind only where the FFN is narrow beside the attention.
"""

from __future__ import annotations

import numpy as np

from planner.budget import dispatch, fsdp2_gathered as fg, fsdp2_moments as moments, fsdp2_reduce, fsdp2_ring as ring, regions
from planner.budget.fsdp2_moments import Item
from planner.context.ctx import Ctx
from planner.budget.fsdp2_saved import SAC_SOURCE, attention_saved_counts, dims, local_layers, sac_saved_parts
from planner.budget.terms import Phase, Term
from planner.units import ceil_div

SOURCE = ("tensor inventory of planner/runtime/{fsdp2,model,model_layers,attention,moe_block}.py; GPU "
          "allocator history of planner validate's step (bench/memory_snapshot.py, H200)")


def attention_saved(ctx: Ctx, selective: bool = False, local: bool = False) -> list[Item]:
    """``A``: what autograd keeps of one layer's attention (``attention_saved_counts``)."""
    cb, cf = attention_saved_counts(ctx, selective, local)
    tag = "SAC subset" if selective else "every saved tensor"
    return [Item("attention", f"attention saved tensors ({tag})", cb, ctx.act_bytes,
                 "s_attn·N_sp (+ QK-norm, sinks, sliding blocks; b-byte)"),
            Item("attention", f"attention saved tensors ({tag}, fp32)", cf, 4,
                 "s_attn·N_sp + N·d_rot (+ QK-norm; fp32: norm copies, rsqrt, lse; RoPE cos/sin)")]


def _cp_kv(ctx: Ctx, N, hkv, d_qk, d_v) -> Item:
    cp = np.asarray(ctx.cp)
    shards = cp if ctx.cp_rotate == "allgather" else 2
    return Item("attention", f"context-parallel K/V buffers ({ctx.cp_rotate})",
                shards * N * hkv * (d_qk + d_v) * (cp > 1), ctx.act_bytes,
                ("cp" if ctx.cp_rotate == "allgather" else "2") + "·N·h_kv·(d_qk+d_v) if cp > 1")


def _substeps(ctx: Ctx, kind: str, rkind: str, local: bool) -> tuple[dict[str, list[Item]], str]:
    """``({sub-step: items}, reference)`` of a ``kind`` phase of a ``rkind`` layer."""
    N, H, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    N_sp = ceil_div(N, ctx.tp)
    hq, hkv, d_qk, d_v = dims(ctx)
    qkv, o = N * (hq * d_qk + hkv * (d_qk + d_v)), N * hq * d_v
    F, Fe = fg.fsdp_degree(ctx), fg.expert_degree(ctx)
    th_d, th_e = fg.layer_dense_params(ctx, rkind), fg.layer_expert_params(ctx, rkind)
    saved_regime = ctx.ac != "full"
    mid = [Item("boundaries", "attention-region output", N_sp * H, b, "N_sp·H"),
           Item("ffn", "normed FFN input", N * H, b, "N·H")]
    if ctx.ac == "none" and kind == "forward":   # autograd keeps the FFN norm's fp32 copy and both outputs
        mid = mid[:1] + [Item("ffn", "FFN norm: saved fp32 copy", N_sp * H, 4, "N_sp·H"),
                         Item("ffn", "FFN norm: saved normed input and its weighted copy", 2 * N * H, b, "2·N·H")]
    moe = rkind == "moe"
    I_d = ceil_div(ctx.dense_ffn, ctx.tp) if not moe else 0
    I_s = ceil_div(ctx.model.shared_expert_ffn or 0, ctx.tp)
    if kind == "forward":
        base = [Item("attention", "normed attention input (all-gathered)", N * H, b, "N·H"),
                Item("attention", "q, k, v", qkv, b, "qkv"), Item("attention", "attention output", o, b, "o"),
                Item("attention", "log-sum-exp (fp32)", N * hq, 4, "N·h_q")]
        held = Item("gathered", "layer all-gather output held (dense part)", th_d * (F > 1), b, "Θ^d·[F>1]")
        att = base + ring.forward_kernel(ctx, N, hq, hkv, d_qk, d_v, b) + [_cp_kv(ctx, N, hkv, d_qk, d_v), held]
        oproj = base + ring.sac_projection(ctx, N, hq, hkv, d_qk, b) + [
            Item("attention", "o-proj output (before reduce-scatter)", N * H, b, "N·H"), held]
        if ctx.ac == "selective":
            def sac(current: bool, stage: str) -> list[Item]:   # current: beside D, which counts the top-k values
                return [Item("attention", f"this layer's {n}", c, b if eb is None else eb, f, SAC_SOURCE)
                        for n, c, eb, f in sac_saved_parts(ctx, rkind, local, current, stage)]

            keep, keep_beside_d, keep_routed = sac(False, "mlp"), sac(True, "dispatch"), sac(False, "dispatch")
        else:
            keep = keep_beside_d = keep_routed = attention_saved(ctx, False, local) if saved_regime else []
        rope = base[:2] + moments.rope(ctx, N, hq, hkv, d_qk, b) + [held]
        attention = {"attention": att, "attention o-projection": oproj, "attention RoPE": rope}
        if moe:
            ffn = mid + keep_beside_d + [Item("gathered", "experts' all-gather output held", th_e * (Fe > 1),
                                              b, "Θ^e·[F·tp/ep>1]")]
            out = {"ffn": ffn, **attention}
            extra = fsdp2_reduce.experts_unshard_extra(ctx, rkind)
            if np.any(extra):
                out["experts' unshard (one-rank mesh)"] = mid + keep_routed + [
                    Item("gathered", "gate|up stack's b-byte copy (fp32 shard cast)", extra, 1,
                         "n·H·2I·b [F_e = 1] (bytes)")]
            if I_s:
                out["shared experts"] = mid + keep + [
                    Item("ffn", "routed output", N * H, b, "N·H"),
                    Item("ffn", "shared experts: gate, silu, up", 3 * N * I_s, b, "3·N·I_s/tp")]
            return out, "ffn"
        if ctx.ac == "none":   # autograd keeps all four products; the down output and the layer's sum follow
            dense = [Item("ffn", "dense FFN: gate, silu, up and silu·up (saved)", 4 * N * I_d, b, "4·N·I_d/tp",
                          DENSE_NONE_SOURCE),
                     Item("ffn", "dense FFN: down output (before reduce-scatter) and the layer output", N * H + N_sp * H,
                          b, "N·H + N_sp·H", DENSE_NONE_SOURCE)]
        else:
            dense = [Item("ffn", "dense FFN: gate, silu, up", 3 * N * I_d, b, "3·N·I_d/tp")]
        ffn = mid + keep + dense + [Item("gathered", "layer all-gather output held", th_d * (F > 1), b, "Θ^d·[F>1]")]
        return {"ffn": ffn, **attention}, "ffn"
    A = attention_saved(ctx, local=local)
    norm = [Item("ffn", "FFN norm: saved fp32 copy", N_sp * H, 4, "N_sp·H"),
            Item("ffn", "FFN norm: saved normed input and its weighted copy", 2 * N * H, b, "2·N·H")]
    mem = ctx.cluster.memory
    fa = N * hq * d_qk * int(mem.flash_workspace_bytes_per_elem.value)
    exp = N * hq * (d_qk + d_v) * b if hkv < hq else 0
    att_params = ceil_div(regions.attention_region_params(ctx.model), ctx.tp)
    # at the SDPA backward wo's has run: its weight gradient exists, its saved input is freed
    common = A + ring.backward_kernel(ctx, N, hq, hkv, d_qk, d_v, b) + [
        Item("attention", "grads of q, k, v, o", qkv + o, b, "qkv + o"), _cp_kv(ctx, N, hkv, d_qk, d_v)]
    if not moe:   # the layer unit is reduce-scattered after its whole backward: the FFN's gradients wait
        common.append(Item("ffn", "dense FFN: weight gradients, held until the layer's reduce-scatter",
                           3 * ctx.hidden_size * I_d, b, "3·H·I_d/tp", ring.SOURCE))
    att = common + [
        Item("attention", "attention-region gradient", N_sp * H, b, "N_sp·H"),
        Item("attention", "attention weight gradients", att_params, b, "Θ_attn/tp"),
        Item("workspace", "FlashAttention backward dq_accum/softmax_d", fa, 1, "w_fa·N·h_q·d_qk (bytes)"),
        Item("workspace", "FlashAttention GQA dk/dv expansion", exp, 1, "N·h_q·(d_qk+d_v)·b if h_kv < h_q")]
    exchange = common + ring.backward_exchange(ctx, N, hkv, d_qk, d_v) + [
        Item("attention", "wo's weight gradient", ctx.hidden_size * hq * d_v, b, "H·h_q·d_v", ring.SOURCE)]
    out = {}
    if moe:
        ffn = A + norm
        if I_s:   # their backward ran first (they ran last): their weight and input gradients remain
            H = ctx.hidden_size
            sh_w = Item("ffn", "shared experts: weight gradients", 3 * H * I_s, b, "3·H·I_s/tp")
            ffn = ffn + [sh_w, Item("ffn", "shared experts: input gradient", N * H, b, "N·H")]
            out["shared experts"] = A + norm + [
                Item("dispatch", "routed experts' saved rows (their forward working set D_f)",
                     _dispatch_bytes(ctx, "forward"), 1, "D_f (bytes)"),
                Item("ffn", "shared experts: saved gate, silu, up and their in-flight gradients", 6 * N * I_s,
                     b, "6·N·I_s/tp"), sh_w]
    else:
        ffn = A + norm + [Item("ffn", "dense FFN: saved gate, silu, up", 3 * N * I_d, b, "3·N·I_d/tp"),
                          Item("ffn", "dense FFN: gradients of the product, gate and up", 3 * N * I_d, b,
                               "3·N·I_d/tp"),
                          Item("ffn", "dense FFN: down-projection weight gradient", ctx.hidden_size * I_d, b,
                               "H·I_d/tp")]
        out["FFN norm backward"] = A + norm[:1] + [
            Item("ffn", "FFN norm backward: fp32 gradients", 5 * N_sp * H, 4, "5·N_sp·H", NORM_BWD_SOURCE),
            Item("ffn", "dense FFN: weight gradients, and the norm's", 3 * H * I_d + H, b, "3·H·I_d/tp + H")]
    out.update({"ffn": ffn, "attention": att, "attention, dK/dV exchange": exchange})
    return out, "ffn"


NORM_BWD_SOURCE = (
    "autograd's formulas for model_layers.py RMSNorm (x32 · rsqrt(mean(x32²) + eps), fp32): at PowBackward0 "
    "(pow_backward: grad · (2 · x32.pow(1))) the mul branch's input gradient grad·rsqrt, MeanBackward0's "
    "expanded quotient, x32.pow(1), 2·x32.pow(1) and their product are live, 5·N_sp·H fp32, beside the saved "
    "x32 and the finished FFN's weight gradients (the attention's recomputed tensors not yet used); CPU "
    "whole-step trace, dense first layer in bf16: backward[1] 0.960 without it")


DENSE_NONE_SOURCE = (
    "without checkpointing the gated MLP's gate, silu, up and silu·up are all saved (silu's input, mul's two "
    "inputs, down's input); the layer's peak is at its residual sum, beside the down output: H200 planner validate, "
    "DeepSeek-V2-Lite W = 16 (HSDP 2 × 8) S = 16384 ac = none forward[1], 4515.1 MiB measured against 4045.0 booked "
    "with gate, silu, up alone (validate_heldout_r4.json): N·I_d + 2·N·H = 470 MiB")


def _dispatch_bytes(ctx: Ctx, kind: str):
    ph = Phase(kind, 1, "moe")
    return sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in dispatch.terms(ctx)), np.int64(0))


def _total(items: list[Item]):
    return sum((i.nbytes for i in items), np.int64(0))


def _scalar(v):
    return int(v) if np.ndim(v) == 0 else v


def _pick(g, l, local):
    """``at`` for a count that differs on the sliding-window layers ``local``."""
    g, l = _scalar(g), _scalar(l)
    return np.maximum(g, l), (lambda ph: l if ph.region in local else g)


def _excess(sub: dict, ref: str, t_ref, extra: dict | None = None):
    d = {s: v for s, v in sub.items() if s != ref}
    d.update(extra or {})
    return np.maximum.reduce(np.broadcast_arrays(np.int64(0), *[_total(v) - t_ref for v in d.values()]))


def terms(ctx: Ctx) -> list[Term]:
    kinds = ctx.regions
    L = len(kinds)
    local = local_layers(ctx)
    out: list[Term] = []
    for kind in ("forward", "backward"):
        for rkind in sorted(set(kinds)):
            (sub, ref), (sub_l, _) = _substeps(ctx, kind, rkind, False), _substeps(ctx, kind, rkind, True)
            D = _dispatch_bytes(ctx, kind) if rkind == "moe" else np.int64(0)
            t_ref, t_ref_l = _total(sub[ref]) + D, _total(sub_l[ref]) + D
            reg = (rkind,)
            for i, il in zip(sub[ref], sub_l[ref]):
                count, at = _pick(i.count, il.count, local)
                out.append(Term(i.name, i.live_set, count, i.elem_bytes,
                                f"{i.formula}  [{kind}, {ref} sub-step" + (" beside D]" if rkind == "moe" else "]"),
                                (kind,), regions=reg, at=at, source=i.source or SOURCE))

            def ends(r: int) -> dict:
                if kind == "backward":
                    s_r = sub_l if r in local else sub
                    live = s_r[ref]
                    late = [Item("gathered", "previous unit's prefetch, issued in the attention's backward",
                                 fg.prefetch_params(ctx, r) * fg.prefetch_in_attention(ctx), ctx.act_bytes,
                                 "Θ^d_{r−1} (V·H/tp at r = 1)·[F>1]·[tp>1, QK-norm units]")]
                    out = {"attention": s_r["attention"] + late,
                           "attention, dK/dV exchange": s_r["attention, dK/dV exchange"] + late,
                           "layer gradient reduction": fsdp2_reduce.layer_reduce(ctx, r, rkind, Item) + late}
                    if rkind == "moe":
                        out["experts' gradient reduction"] = fsdp2_reduce.experts_reduce(ctx, r, rkind, live, Item)
                    if r == 1:
                        out.update({k: v + late for k, v in fsdp2_reduce.embedding_steps(ctx, rkind, Item).items()})
                    else:
                        out["previous layer's unshard (one-rank mesh)"] = fsdp2_reduce.previous_unshard(
                            ctx, r, rkind, Item)
                    return out
                out = {}
                if r == 1:
                    out["embedding unshard (r = 1)"] = fsdp2_reduce.embedding_unshard(ctx, rkind, Item)
                if r == L:
                    out["head all-gather (r = L)"] = moments.head_gather(ctx, rkind, r in local)
                return out

            ex = {}
            for r in [r for r in range(1, L + 1) if kinds[r - 1] == rkind]:
                loc = r in local
                ex[r] = _scalar(_excess(sub_l if loc else sub, ref, t_ref_l if loc else t_ref, ends(r)))
            rs = [r for r in range(1, L + 1) if kinds[r - 1] == rkind]
            named = {**{n: v for n, v in sub.items() if n != ref}, **ends(rs[0]), **ends(rs[-1])}
            what = "; ".join(f"T_{{{n}}} = " + " + ".join(f"{i.name} {i.formula}" for i in v)
                             for n, v in named.items())
            out.append(Term(f"{kind} sub-steps after the {ref}: excess over it", "attention",
                            np.maximum.reduce(np.broadcast_arrays(*ex.values())), 1,
                            f"max(0, max_s T_s − T_{ref}) over the other sub-steps ({what})", (kind,),
                            regions=reg, at=lambda ph, ex=ex: ex[ph.region], source=SOURCE))
    return out
