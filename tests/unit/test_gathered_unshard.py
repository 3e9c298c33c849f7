"""The composed stack's unshard sub-step (``planner.budget.gathered``): region ``r−1``'s all-gather
output beside region ``r``'s unshard, booked as the excess over region ``r``'s activations."""

from __future__ import annotations

import numpy as np
import pytest

from planner.api import build_planfile
from planner.budget import attention, dispatch, ffn, gathered, regions
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
    units = gathered._unit_params(ctx, np.asarray(ctx.vocab_parallel))[:-1]
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
