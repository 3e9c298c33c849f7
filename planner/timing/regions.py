"""Region pieces both stacks' step models book (``composed.py``, ``baseline.py``): the attention
block's forward/backward parts, GEMM lists to seconds, the backward phase's recompute + backward,
and the MoE layer's routing profile and LLEP knobs as scalars."""

from __future__ import annotations

import numpy as np

from planner.context.ctx import Ctx
from planner.plans.llep import LlepKnobs
from planner.plans.routing import profile_name
from planner.timing import flops as F
from planner.timing.comm import collective_s
from planner.timing.compute import Lookups, attention_s, elementwise_s, gemm_s

ELEM_BWD_FACTOR = 2.0
"""Elementwise backward traffic relative to forward (reads the saved input and the output
gradient, writes the input gradient)."""


def gemms_s(lk: Lookups, gemms) -> tuple:
    """(forward, backward) seconds of a list of forward GEMMs."""
    fwd = sum(gemm_s(lk, g.m, g.n, g.k) * g.count for g in gemms)
    bwd = sum(gemm_s(lk, d.m, d.n, d.k) * d.count for g in gemms for d in F.backward(g))
    return fwd, bwd


def attention_region(ctx: Ctx, lk: Lookups, N, D, *, tp=1, cp=1) -> dict:
    """Forward/backward pieces of one attention block (composed: Ulysses over ``D``; also used by
    the FSDP2 baseline with ``D = 1`` and heads over ``tp``). Averaged over local and global layers."""
    m, b, S = ctx.model, ctx.act_bytes, np.asarray(ctx.seq_len)
    n_h, n_kv, d_qk, d_v = F.head_dims(m)
    heads = n_h / (np.asarray(D) * tp)
    seqs = np.asarray(ctx.seqs_per_microbatch, dtype=float)
    p_f, p_b = gemms_s(lk, F.attention_gemms(m, N, tp))
    n_local = len(m.local_layers) if m.sliding_window else 0
    frac_local = n_local / m.num_layers

    def core(bwd):
        sinks = bool(getattr(m, "attention_sinks", False))
        t = cp * attention_s(lk, S / cp, heads, d_qk, d_v, backward=bwd, sinks=sinks)
        if n_local:
            t_loc = cp * attention_s(lk, S / cp, heads, d_qk, d_v, window=m.sliding_window, backward=bwd,
                                     sinks=sinks)
            t = (1 - frac_local) * t + frac_local * t_loc
        return seqs * t

    qkv = F.qkv_elems_per_token(m)
    elem = np.asarray(N, dtype=float) * (5 * m.hidden_size + 2 * (n_h + n_kv) * d_qk + 2 * qkv + 2 * n_h * d_v) * b / tp
    a2a_f = collective_s(lk, "all_to_all", D, np.asarray(N, dtype=float) * qkv * b) + \
        collective_s(lk, "all_to_all", D, np.asarray(N, dtype=float) * n_h * d_v * b)
    return {"gemm_f": p_f, "gemm_b": p_b, "core_f": core(False), "core_b": core(True),
            "elem_f": elementwise_s(lk, elem), "elem_b": elementwise_s(lk, ELEM_BWD_FACTOR * elem),
            "a2a_f": a2a_f, "a2a_b": a2a_f}


def moe_profile(ctx: Ctx) -> str:
    return profile_name(ctx.routing, ctx.routing_hot_share, ctx.routing_hot_experts)


def _scalar(x, name: str):
    v = np.unique(np.asarray(x))
    assert v.size == 1, f"{name} must be one value per evaluation"
    return v.item()


def knobs(ctx: Ctx) -> LlepKnobs:
    """LLEP knobs ``(α, m, λ, n_import_max)`` as scalars."""
    return LlepKnobs(float(ctx.llep_alpha), int(ctx.llep_min_tokens), float(ctx.llep_lambda),
                     int(_scalar(ctx.max_imports, "max_imports")))


def merge_passes(fwd: dict, bwd: dict, ckpt: bool) -> dict:
    """The backward phase's pieces: the recompute (the forward again, when checkpointed) + backward."""
    out = dict(bwd)
    if ckpt:
        for k, v in fwd.items():
            out[k] = out.get(k, 0.0) + v
    return out
