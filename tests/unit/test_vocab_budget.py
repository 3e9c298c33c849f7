"""The ``vocab`` live set's terms (planner.budget.vocab): numpy candidates, invariants, monotonicity.

The counts themselves are checked against the operators' traces in tests/trace/test_vocab_trace.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.budget import vocab
from planner.context.ctx import Ctx
from tests.conftest import vocab_ctx


def make_ctx(*, N, H=512, V=20000, P=1, B_v=1, b=2, vocab_op="ring_dtp", stack="composed", tp=1) -> Ctx:
    return vocab_ctx(N=N, H=H, V=V, P=P, B_v=B_v, b=b, vocab_op=vocab_op, stack=stack, tp=tp)


def total(ctx: Ctx):
    return sum(np.asarray(t.bytes, dtype=np.int64) for t in vocab.terms(ctx))


@pytest.mark.parametrize("op", ["ring_dtp", "vocab_parallel", "dense"])
def test_array_knobs_equal_scalar_evaluation(op):
    Ps = np.array([1, 2, 4, 8, 8, 3]) if op != "dense" else np.ones(6, dtype=np.int64)
    Bs = np.array([1, 4, 2, 1, 8, 3])
    Ns = np.array([512, 4096, 9000, 2500, 60000, 7000])
    ctx = make_ctx(N=Ns, P=Ps, B_v=Bs, vocab_op=op)
    vec = total(ctx)
    one = [int(total(make_ctx(N=int(n), P=int(p), B_v=int(bv), vocab_op=op))) for n, p, bv in zip(Ns, Ps, Bs)]
    assert vec.tolist() == one


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 70000), st.sampled_from([1, 2, 3, 4, 8]), st.integers(1, 16), st.sampled_from([2, 4]))
def test_ring_terms_nonnegative_and_blocks_never_raise_the_peak(N, P, B_v, b):
    ctx = make_ctx(N=N, P=P, B_v=B_v, b=b)
    assert all(np.all(np.asarray(t.count) >= 0) for t in vocab.terms(ctx))
    assert total(dataclasses.replace(ctx, vocab_blocks=B_v + 1)) <= total(ctx)


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 70000), st.sampled_from([1, 2, 3, 4, 8]), st.integers(1, 8), st.sampled_from([2, 4]))
def test_ring_peak_grows_with_tokens_within_a_branch(N, P, B_v, b):
    ctx = make_ctx(N=N, P=P, B_v=B_v, b=b)
    edge = -(-20000 // P)
    if N != edge:  # the branch switches between edge and edge + 1
        assert total(dataclasses.replace(ctx, tokens_per_rank=N + 1)) >= total(ctx)


def test_ring_dtp_is_far_below_the_dense_head_at_the_reference_shape():
    kw = dict(N=16384, H=7168, V=200000, b=4)
    assert total(make_ctx(P=8, **kw)) * 5 < total(make_ctx(vocab_op="dense", **kw))


def test_every_term_names_its_formula_and_source():
    for op, stack, tp in [("ring_dtp", "composed", 1), ("dense", "composed", 1),
                          ("vocab_parallel", "composed", 1), ("dense", "fsdp2", 1),
                          ("vocab_parallel", "fsdp2", 4)]:
        for t in vocab.terms(make_ctx(N=4096, P=4 if op != "dense" else 1, vocab_op=op, stack=stack, tp=tp)):
            assert t.formula and t.source and t.phases == ("head",)
