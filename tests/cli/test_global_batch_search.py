"""A global batch that some candidates of a search divide into micro-steps and others do not: the
search keeps the ones that divide it (and says why it dropped the rest), as ``check`` accepts the
plan it picks; a batch that no candidate divides is refused in one line."""

from __future__ import annotations

import pytest

from planner import api
from planner.errors import InvalidPlan
from planner.search.evaluate import BATCH_REJECTION

MODEL, W, S = "olmoe-1b-7b", 4, 32768
GLOBAL_BATCH = 32768
"""At W = 4 and S = 32k only D = 4 (N = 8192, W·N = 32768) makes this one micro-step; D < 4 needs
more tokens per micro-step than the batch holds."""


@pytest.fixture(scope="module")
def report():
    return api.search(model=MODEL, gpus=W, seq_len=S, global_batch_tokens=GLOBAL_BATCH, top=5)


def test_search_keeps_the_candidates_that_divide_the_batch(report):
    r = report.result
    assert r.top, "D = 4 candidates divide the batch and fit"
    for c in r.top:
        assert GLOBAL_BATCH % (W * S // c.plan.composed.seq_parallel) == 0
    if r.baseline is not None:
        assert GLOBAL_BATCH % (W * S // r.baseline.plan.baseline.cp) == 0
    assert r.tally.reasons[BATCH_REJECTION] > 0
    assert r.tally.fit + sum(r.tally.reasons.values()) == r.tally.evaluated


def test_a_batch_no_candidate_divides_is_refused():
    with pytest.raises(InvalidPlan) as e:
        api.search(model=MODEL, gpus=W, seq_len=S, global_batch_tokens=GLOBAL_BATCH // 2, top=1)
    assert e.value.field == "workload.global_batch_tokens"
