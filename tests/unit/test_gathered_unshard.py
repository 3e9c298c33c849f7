"""The composed stack's unshard sub-step (``planner.budget.gathered``): region ``r−1``'s all-gather
output beside region ``r``'s unshard, booked as the excess over region ``r``'s activations."""

from __future__ import annotations

import numpy as np
import pytest

from planner.api import build_planfile
from planner.budget import attention, dispatch, ffn, gathered, gathered_units, regions
from planner.budget.build import make_context
from planner.budget.terms import Phase
from planner.runtime.validate_plan import truncate

NAME = "unshard sub-step"


def _ctx(model, W, S, layers=None):
    pf = build_planfile(model=model, gpus=W, seq_len=S)
    if layers:
        pf = truncate(pf, layers).planfile
    return make_context(pf.model, pf.cluster, pf.workload, pf.plan)


def _term(ctx):
    return next(t for t in gathered.terms(ctx) if t.name.startswith(NAME))


@pytest.mark.parametrize("model,W,S", [("deepseek-v2-lite", 64, 32768), ("gpt-oss-20b", 8, 32768),
                                       ("qwen3-30b-a3b", 64, 131072)])
def test_cached_counts_equal_every_region_computed(model, W, S):
    """Every region's count equals the excess computed for that region alone (the cache by
    neighbouring kinds and window loses nothing)."""
    ctx = _ctx(model, W, S)
    t = _term(ctx)
    acts = [*attention.terms(ctx), *ffn.terms(ctx), *dispatch.terms(ctx)]
    units = gathered_units.unit_params(ctx, np.asarray(ctx.vocab_parallel))[:-1]
    for r in range(2, len(ctx.regions) + 1):
        ph = Phase("forward", r, ctx.regions[r - 1])
        a = sum(int(x.bytes_in(ph)) for x in acts)
        assert t.count_in(ph) == max(0, int(units[r - 2]) * ctx.act_bytes - a) // ctx.act_bytes, r


def test_binds_after_deepseek_dense_ffn_only_beyond_one_rank():
    """DeepSeek-V2-Lite at N = 2048: layer 1's attention follows the 10944-wide dense FFN unit; the
    sub-step holds that unit's all-gather output less the attention's activations. At W = 1 there
    is no all-gather output."""
    ctx = _ctx("deepseek-v2-lite", 64, 32768, layers=2)
    t = _term(ctx)
    ph = Phase("forward", 3, "attention")
    dense, H = regions.dense_region_params(ctx.model), ctx.hidden_size
    assert dense == 3 * H * ctx.dense_ffn + H   # w_gate, w_up, w_down and ffn_norm
    a = sum(int(x.bytes_in(ph)) for x in attention.terms(ctx))
    assert t.count_in(ph) * ctx.act_bytes == dense * ctx.act_bytes - a > 0
    assert t.count_in(Phase("forward", 2, "dense_mlp")) == 0
    one = _ctx("deepseek-v2-lite", 1, 4096, layers=2)
    assert all(_term(one).count_in(Phase("forward", r, k)) == 0 for r, k in enumerate(one.regions, 1))


def _backward_term(ctx):
    return next(t for t in gathered.terms(ctx) if t.name.startswith("backward unshard sub-step"))


def test_backward_unshard_binds_a_dense_ffn_without_checkpointing():
    """Without checkpointing a dense FFN region's backward starts at its unshard (2·Θ_region beside
    region 3's held reduce-scatter input, no recompute): its excess over the phase's booking
    (the prefetch Θ_region(1), the region's gradients at mul's moment, all but w_gate's and
    w_up's, and the gated MLP's backward moment beyond its saved products, which boundaries books
    and which exists only after the unshard) is 2·H·I_d − Θ_region(1) − that moment; checkpointed,
    the recompute outweighs it everywhere."""
    from planner.budget import ffn, saved_composed

    pf = truncate(build_planfile(model="deepseek-v2-lite", gpus=8, seq_len=8192,
                                 overrides={"checkpoint": "none"}), 2).planfile
    ctx = make_context(pf.model, pf.cluster, pf.workload, pf.plan)
    m = ctx.model
    t = _backward_term(ctx)
    ph = Phase("backward", 2, "dense_mlp")
    moment = int(saved_composed.compute_only_backward_bytes(ctx, ph))
    assert moment == (int(ffn.dense_backward_moment(ctx)[0]) - 4 * ctx.tokens_per_rank * ctx.dense_ffn) * ctx.act_bytes > 0
    assert saved_composed.compute_only_backward_bytes(ctx, Phase("backward", 1, "attention")) == 0
    before = 2 * ctx.hidden_size * ctx.dense_ffn - regions.attention_region_params(m)
    assert 59 * 2**20 < before * ctx.act_bytes < 60 * 2**20
    assert t.at(ph) == before - moment // ctx.act_bytes
    for checkpoint in ("sco", "per_layer"):
        c = _ctx_with(pf, checkpoint)
        assert saved_composed.compute_only_backward_bytes(c, ph) == 0
        assert all(_backward_term(c).at(Phase("backward", r, k)) == 0 for r, k in enumerate(c.regions, 1))


def _ctx_with(pf, checkpoint):
    plan = pf.plan.model_copy(update={"composed": pf.plan.composed.model_copy(update={"checkpoint": checkpoint})})
    return make_context(pf.model, pf.cluster, pf.workload, plan)
