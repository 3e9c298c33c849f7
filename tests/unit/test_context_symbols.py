"""Derived symbols are computed once, in the resolution layer (issue 14): ``K`` and ``c_eff`` in
``planner.context.derive`` (the operators' chunking rule), read by the dispatch terms from the
``Ctx``; a frontier scan resolves its plan once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.budget import dispatch as bd
from planner.budget.build import make_context
from planner.plans import chunking
from planner.schema import PlanFile
from tests.conftest import tiny_moe

SEQ_LEN = 16384
"""With ``W = 4`` and ``D = 4``: ``N = 4096`` tokens per rank."""
TOKEN_BUDGET = 1000
"""``c`` small enough that ``K = min(ceil(N/c), K_max) = 5`` chunks."""


def _planfile(h200, **composed) -> PlanFile:
    doc = {"model": tiny_moe(num_layers=2).model_dump(), "cluster": h200.model_dump(),
           "workload": {"seq_len": SEQ_LEN}, "plan": {"world_size": 4, "composed": composed}}
    return PlanFile.model_validate(doc)


def _ctx(pf, **kw):
    return make_context(pf.model, pf.cluster, pf.workload, pf.plan, **kw)


def _dispatch_max(ctx) -> np.ndarray:
    return sum(np.asarray(t.bytes, dtype=np.int64) for t in bd.terms(ctx))


def test_chunk_symbols_follow_the_operators_rule(h200):
    pf = _planfile(h200, dispatch="pipelined_llep", token_budget=TOKEN_BUDGET)
    ctx = _ctx(pf)
    N = int(ctx.tokens_per_rank)
    assert N == SEQ_LEN // 4
    assert int(ctx.num_chunks) == chunking.num_chunks(N, TOKEN_BUDGET, int(ctx.max_chunks)) == 5
    assert int(ctx.chunk_tokens) == chunking.chunk_tokens(N, 5) == -(-N // 5)
    c = np.array([500, 1000, 4096, 8192])
    vec = _ctx(pf, overrides={"token_budget": c})
    want = chunking.num_chunks(N, c, int(ctx.max_chunks))
    assert vec.num_chunks.tolist() == want.tolist() and vec.chunk_tokens.tolist() == (-(-N // want)).tolist()


@pytest.mark.parametrize("bound", ["guarantee", "expected"])
@pytest.mark.parametrize("residue", ["source", "destination"])
def test_dispatch_terms_read_k_from_the_context(h200, bound, residue):
    """The dispatch live set changes with ``Ctx.num_chunks`` alone: the terms read it rather than
    recompute it from ``N``, ``c`` and ``K_max``."""
    pf = _planfile(h200, dispatch="pipelined_llep", token_budget=TOKEN_BUDGET, dispatch_residue=residue)
    ctx = dataclasses.replace(_ctx(pf), dispatch_bound=bound)
    one = dataclasses.replace(ctx, num_chunks=1, chunk_tokens=ctx.tokens_per_rank)
    assert int(_dispatch_max(one)) > int(_dispatch_max(ctx)) > 0   # one chunk holds more rows


def test_guarantee_without_a_context_uses_the_same_rule(h200):
    """A caller with no ``Ctx`` (one operator shape) gets the same ``K``/``c_eff`` from
    ``chunk_symbols`` as ``derive_context`` puts in the context."""
    pf = _planfile(h200, dispatch="pipelined_llep", token_budget=TOKEN_BUDGET)
    ctx = _ctx(pf)
    g = dict(N=int(ctx.tokens_per_rank), k=ctx.top_k, E=ctx.num_experts, E_p=int(ctx.expert_parallel),
             c=TOKEN_BUDGET, K_max=int(ctx.max_chunks), alpha=ctx.llep_alpha, lam=ctx.llep_lambda,
             m=ctx.llep_min_tokens, n_imp=int(ctx.max_imports))
    with_k = {**g, "K": int(ctx.num_chunks), "c_eff": int(ctx.chunk_tokens)}
    assert bd.guarantee_sizes(g) == bd.guarantee_sizes(with_k)
    other = bd.guarantee_sizes({**g, "K": 1, "c_eff": g["N"]})
    assert other["C"] != bd.guarantee_sizes(g)["C"]


@pytest.mark.parametrize("name", ["max_context", "max_batch"])
def test_a_frontier_scan_resolves_its_plan_once(h200, monkeypatch, name):
    import planner.api.frontier as af
    import planner.budget.frontier as bf
    import planner.context.derive as dv
    from planner import api

    calls = []
    real = af.resolve_plan

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    for mod in (af, bf, dv):
        monkeypatch.setattr(mod, "resolve_plan", counting)
    extra = {"max_seq_len": 1 << 17} if name == "max_context" else {"max_tokens": 1 << 17}
    rep = getattr(api, name)(model="olmoe-1b-7b", gpus=8, seq_len=8192, **extra)
    doc = rep.to_json()                  # the report reads the scan's resolved plan
    assert rep.scan.values.size > 1 and len(calls) == 1
    if name == "max_batch" and doc["max_seqs_per_microbatch"]:
        D = rep.scan.plan.composed.seq_parallel
        assert doc["max_global_batch_tokens"] == 8 // D * doc["max_seqs_per_microbatch"] * 8192
