"""The composed embedding's backward sub-steps (``planner.budget.gathered._embedding_substeps``): the
per-segment fp32 sums exist only where ``embedding_dense_backward_cuda`` sorts, above 3072 indices
(H200 allocator histories: DeepSeek-V2-Lite W = 32 / 64 at N = 2048 peak at the table's copy-out,
2·V·H + Θ_region(1) + N·H; gpt-oss-20b W = 64 at N = 4096 holds the sums)."""

from __future__ import annotations

import numpy as np

from planner.api import build_planfile
from planner.budget import gathered
from planner.budget.build import make_context
from planner.budget.gathered_units import unit_params
from planner.budget.terms import Phase


def _ctx(W, S):
    pf = build_planfile(model="deepseek-v2-lite", gpus=W, seq_len=S)
    return make_context(pf.model, pf.cluster, pf.workload, pf.plan)


def test_per_segment_sums_only_on_the_sorting_path():
    seen = set()
    for W, S in ((32, 32768), (16, 65536)):
        ctx = _ctx(W, S)
        N, H, b = int(ctx.tokens_per_rank), ctx.hidden_size, ctx.act_bytes
        VH = ctx.vocab_size * H
        ts = gathered.terms(ctx)
        own = [t for t in ts if not t.name.startswith(("embedding", "head gather"))]
        prefetch = [t for t in ts if t.name.startswith("embedding table")]
        ph = Phase("backward", 1, ctx.regions[0])
        theta_1 = int(np.asarray(unit_params(ctx, np.asarray(ctx.vocab_parallel))[0]))
        sums = N * H * 4 if N > gathered.EMBEDDING_FEATURE_KERNEL_MAX else 0
        moment = max(2 * VH + -(-VH // W), 2 * VH + theta_1 + N * H) * b + sums
        region1 = int(gathered._region1_bytes(ctx, "backward", own + prefetch))
        sub = [t for t in ts if t.name.startswith("embedding backward sub-steps")][0]
        assert int(sub.bytes_in(ph)) == -(-max(moment - region1, 0) // b) * b
        seen.add(N > gathered.EMBEDDING_FEATURE_KERNEL_MAX)
    assert seen == {False, True}   # N = 2048 and 4096: both paths
