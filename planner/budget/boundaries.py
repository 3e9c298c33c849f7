"""Live set ``boundaries``: checkpoint boundaries and, without checkpointing, saved activations.

Legend (DESIGN §1): ``L_b`` boundaries (``2L`` composed: attention and MLP/MoE regions; ``L`` for the
FSDP2 per-layer baseline), ``N`` tokens per rank, ``H`` hidden width, ``b`` bytes per scalar,
``n_off`` boundaries SCO offloads (``planner.plans.sco``: ``1..n_off``), ``r`` the region index of
the phase. Boundary ``h_ℓ`` is region ``ℓ``'s input.

Composed stack, ``checkpoint ∈ {per_layer, sco}`` (``n_off = 0`` for per_layer), counted off the
tensor inventory of ``planner/runtime/sco.py`` and confirmed by ``tests/trace/test_offload_trace.py``:

    retained boundaries      forward[r], backward[r]: max(0, r−1−n_off)·N·H     head: (L_b−n_off)·N·H
    region input             forward[r], backward[r]: N·H   (h_r; retained, or restored under SCO)
    region output            forward[r]: N·H                (moe regions: the dispatcher's output, which
                                                            becomes h_{r+1}; attention and dense FFN
                                                            regions make it after their interior;
                                                            LLEP and standard EP make it at their end:
                                                            ``dispatch`` counts it, ``dispatch_edges``)
    prefetched boundary      backward[r]: N·H if 2 ≤ r ≤ n_off+1 (h_{r−1} restoring while r recomputes)
    boundary grad in/out     backward[r]: 2·N·H; attention and dense FFN regions N·H (the incoming
                             one: the outgoing one is made in the input norm's backward, counted by
                             ``attention_backward``'s end sub-step and ``ffn``'s norm backward), and
                             so are MoE regions under LLEP and standard EP, whose dispatcher makes
                             the gradient into the normed input at its end (``dispatch`` counts it)

An attention or dense FFN region's backward peaks after its recompute (the kernel's, QK-norm's or
the gated FFN's backward), when SCO's restored input of an offloaded region (``r ≤ n_off``) is
freed: the recompute was its only user (``PAST_RECOMPUTE``). So backward[r] holds at most 2
restored boundaries (the region input and the prefetch), those regions' past the recompute one (the
prefetch). The final
norm, outside the checkpoints, keeps its saved tensors through the head: ``N·H + N`` fp32 and
``N·H`` (b). SCO frees an
offloaded input's device copy when its region's forward ends (after the D2H event), so in-flight
copies add nothing beyond the region input.

Composed stack, ``checkpoint = none``: ``planner.budget.saved_composed``. The per-token inventory
``saved_per_token`` (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", §4.1, adapted: no dropout masks, FlashAttention keeps no ``S²`` scores but q, k, v, the
output and its log-sum-exp, RMSNorm keeps its fp32 input copy, its cast and weighted output and an
fp32 ``rstd``, gated MLPs keep ``h1, h3, silu(h1), silu(h1)·h3``), per token:

    attention region   2H + n_h·d_qk + n_kv·(d_qk+d_v) + n_h·d_v   (b)   H + 1 + n_h  (fp32)
                       MLA adds its latents: 2·q_lora + 2·kv_lora and keys of n_h heads
    dense MLP region   2H + 4·I_d                                 (b)   H + 1        (fp32)
    MoE region         2H + k·(2H + 4I) + 4·I_shared              (b)   H + 1 + E + k (fp32)
                       (balanced routing: k routes per token arrive; router softmax E fp32)

FSDP2 baseline (one region per layer): ``planner.budget.fsdp2_boundaries`` (the layers other than
the current one) and ``planner.budget.fsdp2_layer`` (the current layer's saved tensors), from the
same per-token inventory (``saved_per_token``).
"""

from __future__ import annotations

import numpy as np

from planner.context.ctx import Ctx
from planner.budget.dispatch_edges import books_region_io
from planner.budget.terms import ALL_STEP, FWD_BWD, Phase, Term

SOURCE = "DESIGN §3.1 table, §3.2 Boundaries; planner/runtime/sco.py inventory"
SAVED_SOURCE = "Korthikanti et al. 2022 §4 per-layer activations, adapted (module docstring)"


def _retained(r, n_off):
    return np.maximum(0, r - 1 - np.asarray(n_off))


OUTPUT_SOURCE = ("; H200 allocator history of planner validate: at the interior peak of an attention "
                 "or dense FFN region's forward (qwen3-W1 forward[1]: RoPE's fp32 temporaries) only the "
                 "region's input is live; a MoE region's forward holds the dispatcher's N·H output "
                 "(pipelined_llep.py:117, gpt-oss-W8 forward[2])")


MOE_GRAD_SOURCE = ("; LLEP (qwen3-30b-a3b W = 8, S = 32768) backward[4]/[2]: one N·H incoming gradient "
                   "beside the combine's backward, the gradient into the normed input not yet made "
                   "(bench/results/memory_snapshot/qwen3-W8-S32768-llep.json)")


PAST_RECOMPUTE = ("attention", "dense_mlp")
"""Region kinds whose backward peaks past their recompute (FlashAttention's, QK-norm's or the gated
FFN's backward), with the restored input of an offloaded region freed and the outgoing boundary
gradient not yet made (it is counted by the sub-step that makes it: ``attention_backward``'s end,
``ffn``'s norm backward). An MLA attention region whose recompute sub-step binds keeps its input
(``recompute_holds_input``). MoE regions keep both counted: their backward's peak sub-step is not yet
attributed in an allocator history of the current runtime (at W = 1 the MoE backward is N·H over)."""


def recompute_holds_input(ctx: Ctx, ph: Phase):
    """An MLA attention region's backward whose recompute sub-step binds
    (``attention_mla.recompute_binds``): the recompute reads the restored region input, so it is
    still live at the phase's peak (whole-step trace of deepseek-v2-lite W = 8, backward[3]: two
    sco.py restore blocks, the region's input and the prefetch, at head_to_seq's copy)."""
    if ph.region_kind != "attention" or ctx.model.attention != "mla" or ctx.model.mla is None:
        return False
    from planner.budget import attention_mla

    return attention_mla.recompute_binds(ctx)


ATTENTION_SOURCE = ("; H200 allocator history, attention backward (gpt-oss-W8, qwen3-W64 backward[3]): one "
                    "sco.py:245 restore block (the prefetch; the region's own restored input is gone once the "
                    "recompute has run, sco.py _restore hands it to the recompute only) and one incoming "
                    "gradient (ToCopyBackward0 of the region above) at the kernel's and QK-norm's backward; "
                    "dense FFN backward (deepseek-v2-lite-W1 backward[2]): one sco.py:245 block 256 MiB, one "
                    "ToCopyBackward0 256 MiB beside the gated FFN's 6·N·I_d")


def _output_regions(ctx: Ctx) -> tuple[str, ...] | None:
    """Region kinds whose forward peak holds an ``N·H`` output: the MoE regions (the dispatcher
    accumulates into it); an attention or dense FFN region makes its output after its interior is
    freed. A stack without MoE regions keeps the output in every region (the stand-in regions of
    the SCO trace hold input and output together), and so does the FSDP2 baseline's per-layer
    region."""
    if ctx.stack == "fsdp2":   # one region per layer: the baseline's inventory (planner.budget.fsdp2*)
        return None
    if "moe" in set(ctx.regions):
        return () if books_region_io(ctx) else ("moe",)   # (): none (LLEP, standard EP: in dispatch)
    return None


def moe_grads(ctx: Ctx) -> int:
    """Boundary gradients (in ``N·H``) a MoE region's backward books: the incoming one and the
    gradient into the normed input (standing for the outgoing one), or the incoming one alone under
    LLEP and standard EP, whose dispatcher makes the latter at its end (``dispatch`` counts it there:
    H200 allocator history of qwen3-30b-a3b W = 8 LLEP, backward[4]/[2], one N·H autograd gradient
    at the combine's backward), and without checkpointing under PipelinedLLEP's destination variant,
    which makes it from its first chunk's backward on (``dispatch_edges.books_region_io``)."""
    return 1 if books_region_io(ctx) else 2


def _checkpointed(ctx: Ctx, NH, L_b: int, n_off, sco: bool, provisional: bool) -> list[Term]:
    def retained(ph: Phase):
        return (L_b - np.asarray(n_off)) * NH if ph.kind == "head" else _retained(ph.region, n_off) * NH

    past = PAST_RECOMPUTE

    def region_input(ph: Phase):
        freed = ((ph.kind == "backward") & (ph.region_kind in past) & (ph.region <= np.asarray(n_off))
                 & ~np.asarray(recompute_holds_input(ctx, ph)))
        return np.where(freed, 0, NH)

    n_moe = moe_grads(ctx)

    def grads(ph: Phase):
        return NH if ph.region_kind in past else n_moe * NH

    def prefetched(ph: Phase):
        r = ph.region
        return np.where((r >= 2) & (r - 1 <= np.asarray(n_off)), NH, 0)

    out = [
        Term("retained boundaries", "boundaries", (L_b - np.asarray(n_off)) * NH, ctx.act_bytes,
             "forward[r]/backward[r]: max(0, r−1−n_off)·N·H; head: (L_b−n_off)·N·H", ALL_STEP, at=retained,
             provisional=provisional, source=SOURCE),
        Term("region input (retained or restored)", "boundaries", NH, ctx.act_bytes,
             "N·H; backward of an attention or dense FFN region r ≤ n_off: 0 (freed after the recompute; an MLA "
             "region whose recompute sub-step binds holds it)",
             FWD_BWD, at=region_input, provisional=provisional, source=SOURCE + ATTENTION_SOURCE),
        Term("boundary grad in/out", "boundaries", 2 * NH, ctx.act_bytes,
             "2·N·H; attention and dense FFN regions, and MoE regions under LLEP and standard EP: N·H (the "
             "incoming one; the outgoing one is made in the region's input-norm backward, or at the "
             "dispatcher's end, counted there)", ("backward",), at=grads, provisional=provisional,
             source=SOURCE + ATTENTION_SOURCE + MOE_GRAD_SOURCE),
    ]
    if _output_regions(ctx) != ():   # LLEP, standard EP: dispatch counts it
        out.insert(2, Term("region output (MoE: the dispatcher's output accumulator, which becomes it)",
                           "boundaries", NH, ctx.act_bytes, "N·H  [forward of moe regions]", ("forward",),
                           regions=_output_regions(ctx), provisional=provisional, source=SOURCE + OUTPUT_SOURCE))
    if sco:
        out.insert(2, Term("prefetched boundary (SCO)", "boundaries", np.where(np.asarray(n_off) >= 1, NH, 0),
                           ctx.act_bytes, "N·H if 2 ≤ r ≤ n_off+1", ("backward",), at=prefetched,
                           provisional=provisional, source=SOURCE))
    return out


def final_norm_terms(ctx: Ctx, N, H) -> list[Term]:
    """The final RMSNorm runs outside the region checkpoints, so autograd keeps what it saves through
    the head: its fp32 input (``x.float()``, saved by the square and the scaling), the fp32
    ``rsqrt`` per token and the normed input in the activation dtype (saved by the weight product;
    planner/runtime/model_layers.py RMSNorm). Whole-step trace, head phase."""
    src = "planner/runtime/model_layers.py RMSNorm outside the checkpoints; whole-step trace"
    return [
        Term("final norm: saved fp32 input and rsqrt", "boundaries", N * H + N, 4, "N·H + N (fp32)", ("head",),
             source=src),
        Term("final norm: saved normed input", "boundaries", N * H, ctx.act_bytes, "N·H", ("head",), source=src),
    ]


def saved_per_token(ctx: Ctx, kind: str, selective: bool = False) -> tuple[int, int]:
    """Saved activations of one region of ``kind`` per token: (elements of ``b`` bytes, fp32 elements).

    ``selective``: torch op-level SAC keeping matmul and SDPA outputs (FSDP2 baseline), else every
    tensor autograd saves (no checkpointing). FSDP2 baseline without checkpointing adds what its
    whole-step trace shows autograd saving beyond that inventory (``_fsdp2_extra``).
    """
    b, f = _saved_per_token(ctx, kind, selective)
    if ctx.stack == "fsdp2" and not selective:
        db, df = _fsdp2_extra(ctx, kind)
        return b + db, f + df
    return b, f


def _fsdp2_extra(ctx: Ctx, kind: str) -> tuple[int, int]:
    """FSDP2 ``ac = none``, per token, read off the saved tensors of the whole-step trace
    (``tests/trace/test_fsdp2_trace.py``): a MoE layer keeps, beside the grouped MLP's saved rows,
    both the combined rows and the weighted rows ``2·k·H`` (the inventory has one ``k·H`` beyond
    the slot-major rows), and its route indices as int64 (top-k ids and four route permutations,
    ``5k`` int64 = ``10k`` fp32 units)."""
    if kind == "moe":
        return ctx.top_k * ctx.hidden_size, 10 * ctx.top_k
    return 0, 0


def latent_norms_per_token(ctx: Ctx) -> tuple[int, int]:
    """MLA's latent norms (q's, when q is low-rank, and kv's) per token without SAC: ``(b elements,
    fp32 elements)`` of their casts and outputs and their rsqrt ((0, 0) for other attention; their
    fp32 copies, which the baseline's SAC-free inventory adds, are ``latent_norm_fp32``)."""
    m = ctx.model
    if m.attention != "mla" or m.mla is None:
        return 0, 0
    a = m.mla
    return 2 * (a.q_lora_rank or 0) + 2 * a.kv_lora_rank, (1 if a.q_lora_rank else 0) + 1


def latent_norm_fp32(ctx: Ctx) -> int:
    """Per token: the fp32 copies MLA's latent norms keep without SAC, ``kv_lora + q_lora`` (0 for
    other attention)."""
    m = ctx.model
    return m.mla.kv_lora_rank + (m.mla.q_lora_rank or 0) if m.attention == "mla" and m.mla is not None else 0


def _saved_per_token(ctx: Ctx, kind: str, selective: bool = False) -> tuple[int, int]:
    m, H = ctx.model, ctx.hidden_size
    nh, nkv, dqk, dv = m.num_heads, m.num_kv_heads, m.head_dim, m.v_dim
    if kind == "attention":
        if m.attention == "mla" and m.mla is not None:
            a, nkv = m.mla, nh
            lat_b, lat_f = latent_norms_per_token(ctx)
            qkv = nh * dqk + nh * (dqk + dv)
            if selective:
                return qkv + nh * dv + H + (a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim, nh
            return 2 * H + lat_b + qkv + nh * dv, NORM_FP32 * H + 1 + nh + lat_f
        qkv = nh * dqk + nkv * (dqk + dv)
        if selective:
            return qkv + nh * dv + H, nh
        return 2 * H + qkv + nh * dv, NORM_FP32 * H + 1 + nh
    if kind == "dense_mlp":
        I_d = ctx.dense_ffn
        return (2 * I_d + H, 0) if selective else (2 * H + 4 * I_d, NORM_FP32 * H + 1)
    k, I, I_s = ctx.top_k, ctx.expert_ffn, m.shared_expert_ffn
    if selective:
        return ctx.num_experts + k * (2 * I + H) + (2 * I_s + H if I_s else 0), 0
    return 2 * H + k * (2 * H + 4 * I) + 4 * I_s, NORM_FP32 * H + 1 + ctx.num_experts + k


NORM_FP32 = 1
"""Per token and ``H``: the fp32 copy ``x.float()`` every RMSNorm keeps beside its cast and its
weighted output (``planner/runtime/model_layers.py`` RMSNorm: saved by the square and the
scaling). Whole-step trace of the FSDP2 baseline; H200 allocator history of the composed step
without checkpointing (``bench/results/memory_snapshot/dsv2-W8-S8192-no-checkpoint.json``:
model_layers.py:72, ``N·H`` fp32 per norm, beside two ``N·H`` b blocks at :74)."""


def terms(ctx: Ctx) -> list[Term]:
    """Boundary (and saved-activation) terms of one rank on the composed stack (both stacks:
    ``boundary_terms``)."""
    if ctx.stack == "fsdp2":
        raise ValueError("boundaries.terms is the composed stack's live set; the FSDP2 baseline's is "
                         "fsdp2_boundaries.terms (both: boundary_terms.terms)")
    H, N = ctx.hidden_size, ctx.tokens_per_rank
    NH = N * H
    if ctx.checkpoint in ("per_layer", "sco"):
        n_off = ctx.num_offloaded if ctx.checkpoint == "sco" else 0
        return _checkpointed(ctx, NH, ctx.num_boundaries, n_off, sco=ctx.checkpoint == "sco",
                             provisional=False) + final_norm_terms(ctx, N, H)
    raise ValueError("checkpoint = none on the composed stack: saved_composed.terms (both stacks and every "
                     "checkpoint: boundary_terms.terms)")
