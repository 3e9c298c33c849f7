"""Live set ``vocab`` of the FSDP2 baseline's heads (phase ``head``), from the tensor inventories
of ``planner/runtime/fsdp2.py`` and ``planner/runtime/chunked_ce.py``.

Legend: ``N`` tokens per rank, ``H`` hidden, ``V`` vocabulary, ``b`` bytes per input scalar,
``C = min(head_chunk_tokens, N)`` tokens per chunk, ``c`` logit columns (``V``, or ``ceil(V/tp)``
under loss parallel, whose tensors are the dense head's on the vocabulary shard).

Dense: ``planner.budget.vocab.dense_substeps`` over ``V`` columns. Loss parallel (``tp > 1``,
torch's ``loss_parallel``): the same over ``c = ceil(V/tp)`` columns, but its fused
nll-loss/log-softmax backward holds four ``N×c`` fp32 tensors, not three: the saved log-softmax,
the zero-filled target gradient, ``exp`` of the log-softmax and their sum (torch's
``tensor/parallel/loss.py``).

Chunked (``chunked_linear_cross_entropy``; the full ``N×V`` logits never exist): every sub-step
holds the head input ``N·H·b``, the targets ``N·8``, the input gradient ``gx`` ``N·H·b`` and the
fp32 weight-gradient accumulator ``V·H·4``; then

    logits upcast     the chunk's GEMM output C·V·b [b<4] and its fp32 copy C·V·4
    grad downcast     the chunk's fp32 logit gradient C·V·4 and its b-byte copy C·V·b [b<4]
    weight-grad GEMM  the b-byte logit gradient C·V·b and the chunk's gw product V·H·b
    gw cast           the accumulator's b-byte copy V·H·b [b<4] (saved for the backward)

Both heads end with the sub-step ``head grad reduce-scatter``: the head's unsharded gradient
``V·H·b/tp``, FSDP2's fp32 reduce-scatter input ``V·H·4/tp`` and the input gradient ``N·H·b``.
"""

from __future__ import annotations

import numpy as np

from planner.context.ctx import Ctx
from planner.budget.terms import Term
from planner.budget.head_substeps import Item, binding_terms, dense_substeps
from planner.plans.ring import max_shard_rows
from planner.units import ceil_div

SRC_CHUNKED = "tensor inventory of planner/runtime/chunked_ce.py (chunked linear cross-entropy)"
SRC_DENSE = "tensor inventory of the FSDP2 dense head (cross_entropy of fp32 logits; loss_parallel under tp)"


def chunked_substeps(N, H, V, C, b: int) -> dict[str, list[Item]]:
    low = int(b < 4)
    own = [Item("head input x_NH", N * H, b, "N·H"), Item("targets t_N", N, 8, "N"),
           Item("input gradient gx_NH (saved)", N * H, b, "N·H"),
           Item("weight-gradient accumulator (fp32)", V * H, 4, "V·H")]
    return {
        "logits upcast": own + [Item("chunk GEMM output", low * C * V, b, "[b<4]·C·V"),
                                Item("chunk logits / logit grad (fp32)", C * V, 4, "C·V")],
        "grad downcast": own + [Item("chunk logits / logit grad (fp32)", C * V, 4, "C·V"),
                                Item("chunk logit grad in input dtype", low * C * V, b, "[b<4]·C·V")],
        "weight-grad GEMM": own + [Item("chunk logit grad in input dtype", C * V, b, "C·V"),
                                   Item("chunk gw product", V * H, b, "V·H")],
        "gw cast": own + [Item("weight gradient in input dtype (saved)", low * V * H, b, "[b<4]·V·H")],
    }


def reduce_substep(N, H, VH_tp, b: int) -> list[Item]:
    """The head's backward end: its unsharded gradient, FSDP2's fp32 copy of it for the
    reduce-scatter and the input gradient (the logits and their gradients are gone by then)."""
    return [Item("head unsharded grad (param dtype)", VH_tp, b, "V·H/tp"),
            Item("head grad, fp32 reduce-scatter input", VH_tp, 4, "V·H/tp"),
            Item("head input gradient", N * H, b, "N·H")]


def terms(ctx: Ctx) -> list[Term]:
    N, H, V, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.vocab_size, ctx.act_bytes
    tp = np.asarray(ctx.tp)
    red = reduce_substep(N, H, ceil_div(V * H, tp), b)
    if ctx.head == "chunked":
        C = np.minimum(ctx.head_chunk_tokens, N)
        return binding_terms({**chunked_substeps(N, H, V, C, b), "head grad reduce-scatter": red},
                             SRC_CHUNKED)
    if np.all(tp == 1):
        return binding_terms({**dense_substeps(N, H, V, V, b), "head grad reduce-scatter": red}, SRC_DENSE)
    cols = max_shard_rows(V, tp)
    sub = dense_substeps(N, H, cols, cols, b)
    sub["head grad reduce-scatter"] = red
    sub["log-softmax bwd"] = sub["log-softmax bwd"][:2] + [
        Item("log-softmax, target grad, exp, their sum (fp32)", 4 * N * cols, 4, "4·N·c")]
    return binding_terms(sub, SRC_DENSE)
