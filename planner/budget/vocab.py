"""Live set ``vocab``: what the head phase allocates besides the head's weight (DESIGN §3.2).

Legend (DESIGN §1): ``N`` tokens per rank, ``H`` hidden, ``V`` vocabulary, ``P`` vocabulary group,
``B_v`` strips per shard, ``b`` bytes per input scalar, ``V_max = ceil(V/P)``,
``V_b = ceil(V_max/B_v)``, ``k_op = min(2, P-1)`` moving-operand buffers, ``k_g = min(2, P)``
moving-gradient buffers, ``[c]`` is 1 when condition ``c`` holds else 0, ``act`` the
activations branch ``N <= V_max``.

Ownership: the head weight and its persistent gradient are ``persistent`` (vocabulary shard, P > 1)
or ``gathered`` (ZeRO-3 head); everything else the operator allocates is here. Counts are read off
the operators' tensor inventories (``planner/runtime/ring_dtp.py``, ``vocab_baselines.py``),
checked against the fake-tensor trace in ``tests/trace/test_vocab_trace.py``.

A head runs through sub-steps whose live tensors differ; the phase holds the largest. Every term
below is listed with the sub-steps where it lives; its count is the one at the **binding
sub-step** (the sub-step with the largest total, chosen per candidate with numpy), so the terms sum
to ``max over sub-steps``.

Ring-DTP (``N`` is the group's ``N_max``; rank 0 holds a ``V_max``-row shard):

    sub-step        tensors (beyond x_NH, t_N, the saved m_N and z_N, valid_N)
    bwd strip       act: k_op·(x N·H·b + t N·8 + state 3N·4) [+ own state 3N·4 if P=1],
                         k_g·N·H·4 gradients, own-shard gw V_max·H·4
                    weights: k_op·V_max·H·b shards, k_g·V_max·H·4 gradients, gx N·H·4, own state 3N·4
                    + fp32 strip N·V_b·4, its b-byte copy [b<4], target column + mask N·9 B (+ one-hot N·4 [b=4])
    bwd GEMM [b<4]  as bwd strip, but the strip copy N·V_b·b and one GEMM product max(N, V_b)·H·b
    end: gx cast    gx N·H·4 + gx N·H·b [b<4] + gw V_max·H·4
    end: gw cast    gx N·H·b [b<4] + gw V_max·H·4 + gw V_max·H·b [b<4]

The forward holds a subset of the backward's buffers (no gradients; three ``3N·4`` states instead
of ``2·N·H·4`` gradients), so it never binds.

Dense head (``V_c`` logit columns: ``V``; ``V/tp`` under FSDP2 loss parallel; not the token budget
``c``): log-softmax backward ``3·N·V_c·4`` (its output, its gradient, the logits' gradient) vs the
downcast ``N·V_c·(4+b)`` [b<4] vs the weight-gradient GEMM ``N·V_c·b + N·H·b + rows·H·b``.

Vocab-parallel (Megatron; the same ``n`` tokens on every rank, ``V_c = V_max`` columns): the saved
softmax ``n·V_c·4`` turned into the logits' gradient in place, its downcast ``n·V_c·b`` [b<4], ``dx``
(fp32 ``n·H·4`` plus its product / downcast ``n·H·b`` [b<4]), ``dw`` ``V_c·H·b``. In the composed
stack the group's tokens are all-gathered first, ``n = N·P``, and the local input ``N·H·b`` stays.
"""

from __future__ import annotations

import numpy as np

from planner.budget import fsdp2_vocab
from planner.context.ctx import Ctx
from planner.budget.head_substeps import Item, binding_terms, dense_substeps
from planner.budget.terms import Term
from planner.plans.ring import STATE_BYTES, TARGET_BYTES, max_shard_rows, moves_activations, strip_cols

SRC_RING = "tensor inventory of planner/runtime/ring_dtp.py (DESIGN §7 Ring-DTP)"
SRC_DENSE = "tensor inventory of cross_entropy(x @ w.T, t) (planner/runtime/vocab_baselines.py)"
SRC_VP = "tensor inventory of planner/runtime/vocab_baselines.py vocab-parallel CE"


def ring_substeps(N, H, V, P, B_v, b: int, move: str | None = None) -> dict[str, list[Item]]:
    """Ring-DTP's sub-steps at the group's ``N_max = N`` (see the module legend); ``move`` forces
    a branch as the operator's ``mode`` does (default: the auto branch ``N <= ceil(V/P)``)."""
    act = moves_activations(N, V, P) if move is None else np.asarray(move == "activations")
    act = np.asarray(act).astype(np.int64)
    wts = 1 - act
    Vm, Vb = max_shard_rows(V, P), strip_cols(V, P, B_v)
    k_op, k_g = np.minimum(2, np.asarray(P) - 1), np.minimum(2, P)
    low = int(b < 4)
    own = [Item("head input x_NH", N * H, b, "N·H"), Item("targets t_N", N, TARGET_BYTES, "N"),
           Item("saved row max m_N and sum z_N", 2 * N, 4, "2·N"), Item("valid mask", N, 1, "N")]
    ring = [
        Item("moving batches x (act)", act * k_op * N * H, b, "[act]·k_op·N·H"),
        Item("moving targets (act)", act * k_op * N, TARGET_BYTES, "[act]·k_op·N  (int64)"),
        Item("backward state (m, scale/z, scale)", (act * np.maximum(1, k_op) + wts) * N, STATE_BYTES,
             "([act]·max(1, k_op) + [weights])·N  (fp32 triple = 12 B; moves with the batch)"),
        Item("moving weight shards (weights)", wts * k_op * Vm * H, b, "[weights]·k_op·V_max·H"),
    ]
    grads_mid = [
        Item("batch gradients gx (fp32)", act * k_g * N * H + wts * N * H, 4, "[act]·k_g·N·H + [weights]·N·H"),
        Item("shard gradients gw (fp32)", act * Vm * H + wts * k_g * Vm * H, 4,
             "[act]·V_max·H + [weights]·k_g·V_max·H"),
    ]
    strip = Item("logits strip (fp32)", N * Vb, 4, "N·V_b")
    strip_low = Item("strip in input dtype", low * N * Vb, b, "[b<4]·N·V_b")
    scratch = Item("strip target column / mask (+ one-hot)", N, 13 - 4 * low,
                   "N (int64 column + bool mask; + fp32 one-hot for fp32, whose peak is the scatter)")
    gemm = Item("GEMM product in input dtype", low * np.maximum(N, Vb) * H, b, "[b<4]·max(N, V_b)·H")
    gx_end = Item("batch gradient gx (fp32), end", N * H, 4, "N·H")
    gw_end = Item("shard gradient gw (fp32), end", Vm * H, 4, "V_max·H")
    gx_low = Item("gx downcast", low * N * H, b, "[b<4]·N·H")
    gw_low = Item("gw downcast", low * Vm * H, b, "[b<4]·V_max·H")
    mid = own + ring + grads_mid
    return {
        "bwd strip": mid + [strip, strip_low, scratch],
        "bwd GEMM": mid + ([strip_low, gemm] if low else [strip]),
        "end: gx cast": own + [gx_end, gx_low, gw_end],
        "end: gw cast": own + [gx_low, gw_end, gw_low] + ([] if low else [gx_end]),
    }


def vp_substeps(n, H, cols, b: int, local_input=0) -> dict[str, list[Item]]:
    """Megatron vocab-parallel CE over ``n`` replicated tokens and ``cols`` columns."""
    low = int(b < 4)
    own = [Item("head input x (replicated over the group)", n * H, b, "n·H"),
           Item("targets t", n, 8, "n"),
           Item("per-token scale/index/masks", n, 14, "n (14 B: fp32 scale, int64 column, 2 masks)"),
           Item("softmax / logits grad (fp32, saved)", n * cols, 4, "n·V_c")]
    if np.any(np.asarray(local_input) > 0):
        own.append(Item("local head input before the all-gather", local_input, b, "N·H"))
    g_low = Item("logits grad in input dtype", low * n * cols, b, "[b<4]·n·V_c")
    gx32 = Item("dx (fp32, all-reduced)", n * H, 4, "n·H")
    gx_low = Item("dx product / downcast in input dtype", low * n * H, b, "[b<4]·n·H")
    gw = Item("dw", cols * H, b, "c·H")
    return {"dx GEMM": own + [g_low, gx32, gx_low], "dw GEMM": own + [g_low, gx32, gw],
            "dx downcast": own + [gx32, gx_low, gw]}


def terms(ctx: Ctx) -> list[Term]:
    """The ``vocab`` live set of one rank (phase ``head``)."""
    N, H, V, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.vocab_size, ctx.act_bytes
    if ctx.stack == "fsdp2":
        return fsdp2_vocab.terms(ctx)
    if ctx.vocab == "dense":
        return binding_terms(dense_substeps(N, H, V, V, b), SRC_DENSE)
    P = ctx.vocab_parallel
    if ctx.vocab == "vocab_parallel":
        n = N * np.asarray(P)
        return binding_terms(vp_substeps(n, H, max_shard_rows(V, P), b, local_input=N * H), SRC_VP)
    if ctx.vocab == "ring_dtp":
        return binding_terms(ring_substeps(N, H, V, P, ctx.vocab_blocks, b), SRC_RING)
    raise AssertionError(f"unknown vocab operator {ctx.vocab!r}")
