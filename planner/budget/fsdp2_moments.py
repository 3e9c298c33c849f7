"""Two single moments of the FSDP2 baseline's layer phases (``planner.budget.fsdp2_layer``, whose
legend this shares) and the ``Item`` its sub-steps are made of: the attention's RoPE working set in
the forward and the ``[norm, head]`` unit's all-gather at the end of ``forward[L]``. Each returns the
items live at its moment; ``fsdp2_layer`` books a sub-step's excess over its reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.budget import fsdp2_gathered as fg
from planner.budget.fsdp2_saved import rot_dim
from planner.context.ctx import Ctx
from planner.units import ceil_div


@dataclass(frozen=True)
class Item:
    live_set: str
    name: str
    count: Any
    elem_bytes: int
    formula: str
    source: str = ""
    """The evidence, where it is narrower than the module's ``SOURCE``."""

    @property
    def nbytes(self):
        return np.asarray(self.count, dtype=np.int64) * self.elem_bytes


def rope_tables(ctx: Ctx, N) -> Item:
    """The attention's RoPE cos/sin tables, ``N·d_rot`` fp32, held through its forward."""
    return Item("attention", "RoPE cos/sin tables (fp32)", N * rot_dim(ctx), 4, "N·d_rot")


def rope(ctx: Ctx, N, hq, hkv, d_qk, b: int) -> list[Item]:
    """The forward's RoPE moment (``model_layers.py`` apply_rope, in fp32): its cos/sin tables and the
    working set of one rotation beyond its input. Rotating ``x`` of ``n`` elements holds its fp32
    copy ``4n`` [b<4] (``x.float()`` returns ``x`` itself in fp32) and, at ``x2·c + x1·s``, four
    half-width fp32 products (``x1·c − x2·s`` and the three of the sum), ``8n``; ``cat`` and the
    cast back hold no more. The queries' rotation, or the keys' beside the rotated queries ``N·h_q·d_qk·b``
    (MLA rotates one shared ``d_rope`` key head)."""
    m = ctx.model
    d_rot = rot_dim(ctx)
    h_kr = 1 if m.attention == "mla" else hkv
    per = 8 + 4 * (np.asarray(b) < 4)
    ws = np.maximum(N * hq * d_rot * per, N * hq * d_qk * b + N * h_kr * d_rot * per)
    return [rope_tables(ctx, N),
            Item("attention", "RoPE working set: fp32 copy, half-width products (fp32)", ws, 1,
                 "max(N·h_q·d_rot·ρ, N·h_q·d_qk·b + N·h_kv·d_rot·ρ), ρ = 8 + 4·[b<4] (bytes; MLA: one key "
                 "head)", ROPE_SOURCE)]


ROPE_SOURCE = ("tensor inventory of planner/runtime/model_layers.py apply_rope; CPU whole-step trace "
               "(tests/trace/test_fsdp2_trace.py, dense first layer, bf16: the forward[1] peak at the queries' "
               "x2·c + x1·s, their fp32 copy 262144 B and four 131072 B products, 0.837 without it)")


def head_gather(ctx: Ctx, rkind: str, local: bool) -> list[Item]:
    """forward[L] ends with the ``[norm, head]`` unit's all-gather (FSDP2's pre-forward hook of the
    final norm runs before the head phase starts): the last layer's output, the head's unsharded
    weight and its all-gather output, which FSDP2 holds [F>1] (Qwen3 W8 ac = none forward[2]:
    ``fsdp2.py`` norm call, 2 × 593.5 MiB); without checkpointing the last layer's saved tensors too.

    The last layer's last all-gather output is still live: the head's ``wait_for_unshard``
    (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``) drops ``comm_ctx.all_gather_state``
    before its copy-out, but its local ``prev_all_gather_state`` (the walrus in ``if
    prev_all_gather_state := self.comm_ctx.all_gather_state``) keeps the ``AllGatherResult`` until it
    returns, after the head's unsharded weight is filled. That output is the routed experts' ``Θ^e``
    when their mesh has several ranks (they unshard last in a MoE layer), else nothing (a one-rank
    unshard clears the state and keeps none); in a dense last layer the layer unit's ``Θ^d`` [F>1],
    unless QK-norm units unshard after it (tp > 1). CPU whole-step trace, W8 ep2 ac = none: the
    experts' 393216 B (bf16) buffer freed at the return of the head's ``wait_for_unshard`` (forward[2]
    0.990 without it); Qwen3 W8 (ep = 8: a one-rank expert mesh) holds none."""
    b, N_sp = ctx.act_bytes, ceil_div(ctx.tokens_per_rank, ctx.tp)
    VH_tp = ceil_div(ctx.vocab_size * ctx.hidden_size, ctx.tp)
    F = fg.fsdp_degree(ctx)
    if rkind == "moe":
        last = fg.layer_expert_params(ctx, rkind) * (fg.expert_degree(ctx) > 1)
        last_f = "Θ^e_L·[F·tp/ep>1]"
    else:
        last = fg.layer_dense_params(ctx, rkind) * (F > 1) * ~fg.prefetch_in_attention(ctx)
        last_f = "Θ^d_L·[F>1] (no QK-norm unit after it)"
    out = [Item("boundaries", "last layer output", N_sp * ctx.hidden_size, b, "N_sp·H"),
           Item("gathered", "head unit, unsharded", VH_tp, b, "V·H/tp"),
           Item("gathered", "head unit all-gather output held", VH_tp * (F > 1), b, "V·H/tp·[F>1]"),
           Item("gathered", "last layer's last all-gather output (held by the head's wait_for_unshard)", last, b,
                last_f)]
    # by then the last layer is resharded, and without checkpointing its input is gone: the phase's
    # common terms that are not live at this moment (Qwen3 W8 ac = none forward[2]: no layer block)
    out += [Item("gathered", "last layer's params, resharded by then (not live)", -fg.layer_params(ctx, rkind), b,
                 "−Θ_L"),
            Item("boundaries", "last layer's input, not saved (not live)",
                 -N_sp * ctx.hidden_size * (ctx.ac == "none"), b, "−N_sp·H [ac = none]")]
    if ctx.ac != "full":
        from planner.budget.fsdp2_boundaries import saved_layer

        cb, cf = saved_layer(ctx, rkind, ctx.ac == "selective", local)
        out += [Item("boundaries", "last layer's saved tensors", cb, b, "s(L)"),
                Item("boundaries", "last layer's saved tensors (fp32)", cf, 4, "s(L)")]
    return out
