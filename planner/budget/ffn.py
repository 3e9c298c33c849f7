"""Live set ``ffn``: the working set of a dense FFN region and of a MoE region's shared experts
(composed stack, checkpointed regions).

Legend: ``N`` tokens per rank, ``H`` hidden, ``I_d`` dense FFN width, ``I_s`` shared-expert width
(all shared experts together), ``b`` bytes per scalar. Counted off the tensor inventory of the
decoder's gated FFN (``planner/runtime/model_layers.GatedMLP``: ``down(silu(gate(x)) ⊙ up(x))``)
inside a non-reentrant region checkpoint:

    forward[r]   normed input x N·H, gate(x), silu(gate(x)), up(x): 3·N·I        (b)
    backward[r]  recomputed x N·H; gate, up, silu·up saved for down, the gradient of silu·up:
                 4·N·I                                                             (b)

(the region's input, output and boundary gradients are ``boundaries``; its weights and their
unreduced gradients ``gathered``). Dense regions: ``I = I_d``; the forward is confirmed by the
region trace (``tests/trace/test_step_trace.py``), the backward read off the inventory (provisional). Shared experts (``I = I_s``) run after the routed experts,
beside the routed output ``N·H``; counted on top of ``dispatch`` (conservative) and provisional
until a MoE region with shared experts is traced.

Without checkpointing these tensors are saved activations (``boundaries``); the FSDP2 baseline's
FFN sub-steps are in ``planner.budget.fsdp2_layer``.
"""

from __future__ import annotations

from planner.budget.context import Ctx
from planner.budget.terms import Term

SOURCE = "tensor inventory of planner/runtime/model_layers.py GatedMLP in a region checkpoint"


def terms(ctx: Ctx) -> list[Term]:
    """FFN working-set terms of one rank (composed stack, checkpointed regions)."""
    if ctx.stack == "fsdp2":   # the baseline's FFN sub-steps: planner.budget.fsdp2_layer
        return []
    if ctx.checkpoint == "none":
        return []
    N, H, b, m = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes, ctx.model
    out: list[Term] = []
    if "dense_mlp" in set(ctx.regions):
        I_d = ctx.dense_ffn
        out += [
            Term("dense FFN forward: normed input, gate, silu, up", "ffn", N * (H + 3 * I_d), b,
                 "N·(H + 3·I_d)", ("forward",), regions=("dense_mlp",), source=SOURCE),
            Term("dense FFN backward: recomputed input, gate, up, silu·up, its gradient", "ffn",
                 N * (H + 4 * I_d), b, "N·(H + 4·I_d)", ("backward",), regions=("dense_mlp",), provisional=True,
                 source=SOURCE),
        ]
    I_s = m.shared_expert_ffn
    if I_s and "moe" in set(ctx.regions):
        out += [
            Term("shared experts forward: gate, silu, up, routed output", "ffn", N * (H + 3 * I_s), b,
                 "N·(H + 3·I_s)", ("forward",), regions=("moe",), provisional=True, source=SOURCE),
            Term("shared experts backward: gate, up, silu·up, its gradient", "ffn", N * (H + 4 * I_s), b,
                 "N·(H + 4·I_s)", ("backward",), regions=("moe",), provisional=True, source=SOURCE),
        ]
    return out
