"""Live set ``boundaries`` of the FSDP2 baseline (one checkpointed region per layer, ``L_b = L``):
what the layers other than the current one leave alive, the current layer's input and output
gradient, and the final norm's saved tensors.

Legend: ``N_sp = ceil(N/tp)`` tokens of a sequence-parallel boundary, ``H`` hidden, ``b`` bytes per
activation scalar, ``r`` the layer of the phase, ``s(ℓ)`` the saved activations of layer ``ℓ`` per
token (``planner.budget.boundaries.saved_per_token``: every tensor autograd saves for ``ac = none``,
the op-level SAC subset for ``ac = selective``).

    ac = full       retained layer inputs   forward[r], backward[r]: (r−1)·N_sp·H; head: L·N_sp·H
    ac = none /     saved activations of    forward[r], backward[r]: Σ_{ℓ<r} s(ℓ)·N_sp; head: Σ_ℓ
    selective       the layers before r     (SAC adds each layer's input, the checkpoint input;
                                            ac = none: a MoE layer's received rows at the routing's
                                            Q, + (Q − N·k)·(H + 4·I) b and 2·(Q − N·k) int64)
    every ac        layer input             forward[r]: N_sp·H; backward[r] as the checkpoint's
                                            input (full, selective): under ac = none autograd saves
                                            no layer input (RMSNorm keeps its fp32 copy instead)
                    layer-output gradient   backward[r]: N_sp·H (autograd's gradient of the layer
                                            output while the layer's backward runs)

The step's inputs are here too: the tokens and targets ``2·B·S`` int64 in every phase, the positions
``S`` and, under context parallelism, the buffers' clones and shards ``2·B·S + 3·N`` int64 during the
step (``planner/runtime/fsdp2.py`` forward_backward). The current layer's own saved and transient tensors are the sub-steps of
``planner.budget.fsdp2_layer``. The final norm runs outside the checkpoints: its saved fp32 input and
rsqrt and its normed input live through the head (``planner.budget.boundaries.final_norm_terms``).
"""

from __future__ import annotations

import numpy as np

from planner.budget import boundaries
from planner.context.ctx import Ctx
from planner.budget.terms import ALL_STEP, ALWAYS, FWD_BWD, Phase, Term
from planner.units import ceil_div

SOURCE = ("tensor inventory of planner/runtime/fsdp2.py + model.py; GPU allocator history of planner "
          "validate's step (bench/memory_snapshot.py, H200)")
INPUT_BATCH = "input batch: tokens and targets (int64)"
"""The term of the batch the caller allocates before the step starts (so in its step-start bytes)."""


def saved_layer(ctx: Ctx, kind: str, selective: bool, local: bool) -> tuple:
    """Saved activations of one baseline layer, ``(b-byte, fp32)`` elements: its attention's
    (``fsdp2_layer.attention_saved_counts``, with QK-norm, MLA, sinks, sliding blocks) and its FFN's
    (``boundaries.saved_per_token`` × ``N_sp``); under SAC ``fsdp2_saved.sac_saved_counts`` (no
    routed rows). A MoE layer's received rows follow the routing: the per-token inventory counts
    ``N·k`` of them; the busiest rank receives ``Q`` (``fsdp2_saved.routed_rows``), and each row
    beyond ``N·k`` adds the slot-major row ``H``, the grouped MLP's saved gate, up, silu and product
    ``4·I`` and two int64 permutation indices (``dispatch_inventory.unchunked``'s saved rows; GPU
    allocator history, FSDP2 Qwen3 W8 ac = none at 80/16: rank 0 receives 419392 rows, not 65536)."""
    from planner.budget.fsdp2_saved import attention_saved_counts, routed_rows_excess, sac_saved_counts

    if selective:
        return sac_saved_counts(ctx, kind, local)
    N_sp = ceil_div(ctx.tokens_per_rank, ctx.tp)
    cb, cf = attention_saved_counts(ctx, selective, local)
    eb, ef = boundaries.saved_per_token(ctx, kind, selective)
    cb, cf = cb + eb * N_sp, cf + ef * N_sp
    if kind == "moe":
        dQ = routed_rows_excess(ctx)
        cb, cf = cb + dQ * (ctx.hidden_size + 4 * ctx.expert_ffn), cf + 4 * dQ
    return cb, cf


def terms(ctx: Ctx) -> list[Term]:
    H = ctx.hidden_size
    N_sp = ceil_div(ctx.tokens_per_rank, ctx.tp)
    NH = N_sp * H
    kinds = ctx.regions
    L = len(kinds)
    b = ctx.act_bytes
    out = [
        Term("layer input", "boundaries", NH, b, "N_sp·H", FWD_BWD if ctx.ac != "none" else ("forward",),
             source=SOURCE),
        Term("layer-output gradient", "boundaries", NH, b, "N_sp·H", ("backward",), source=SOURCE),
    ]
    out += boundaries.final_norm_terms(ctx, N_sp, H)
    BS = np.asarray(ctx.tokens_per_rank) * np.asarray(ctx.cp)   # the rank's whole sequences, B·S tokens
    cp_on = np.asarray(ctx.cp) > 1
    out += [
        Term(INPUT_BATCH, "boundaries", 2 * BS, 8, "2·B·S", ALWAYS,
             source=SOURCE + " (validate.py synthetic_batch: 2 × 1 MiB at cp8 S = 131072)"),
        Term("positions; under cp the buffers' clones and shards (int64)", "boundaries",
             BS // np.asarray(ctx.seqs_per_microbatch) + cp_on * (2 * BS + 3 * np.asarray(ctx.tokens_per_rank)), 8,
             "S + [cp>1]·(2·B·S + 3·N)", ALL_STEP, source=SOURCE + " (fsdp2.py forward_backward, context_parallel buffers)"),
    ]

    def before(ph: Phase) -> int:
        return L if ph.kind == "head" else ph.region - 1

    if ctx.ac == "full":
        return [Term("retained layer inputs", "boundaries", L * NH, b,
                     "forward[r]/backward[r]: (r−1)·N_sp·H; head: L·N_sp·H", ALL_STEP,
                     at=lambda ph: before(ph) * NH, source=SOURCE)] + out
    selective = ctx.ac == "selective"
    from planner.budget.fsdp2_saved import local_layers

    loc = local_layers(ctx)
    per = [saved_layer(ctx, k, selective, r in loc) for r, k in enumerate(kinds, start=1)]
    cum_b = [np.int64(0)] + list(np.cumsum(np.broadcast_arrays(*[p[0] for p in per]), axis=0))
    cum_f = [np.int64(0)] + list(np.cumsum(np.broadcast_arrays(*[p[1] for p in per]), axis=0))
    how = "op-level SAC" if selective else "every saved tensor"
    out += [
        Term("saved activations of the layers before r", "boundaries", cum_b[-1], b,
             f"Σ_{{ℓ<r}} s(ℓ) ({how}; planner.budget.fsdp2_boundaries.saved_layer; b-byte; head: every layer)", ALL_STEP,
             at=lambda ph: cum_b[before(ph)], source=boundaries.SAVED_SOURCE),
        Term("saved activations of the layers before r (fp32)", "boundaries", cum_f[-1], 4,
             f"Σ_{{ℓ<r}} s(ℓ) ({how}; fp32 tensors)", ALL_STEP,
             at=lambda ph: cum_f[before(ph)], source=boundaries.SAVED_SOURCE),
    ]
    if selective:
        out.append(Term("inputs of the layers before r (SAC keeps the checkpoint input)", "boundaries",
                        L * NH, b, "(r−1)·N_sp·H (head: L·N_sp·H)", ALL_STEP, at=lambda ph: before(ph) * NH,
                        source=boundaries.SAVED_SOURCE))
    return out
