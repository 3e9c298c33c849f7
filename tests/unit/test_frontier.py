"""``max-context`` and ``max-batch`` scan the whole grid and equal a scalar brute-force loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import api
from planner.budget.frontier import scan, seq_len_grid
from planner.schema import PlanFile
from planner.units import GiB
from tests.conftest import tiny_moe

EXAMPLES = 25


def _planfile(h200, hbm_gib: float, **plan) -> PlanFile:
    cluster = h200.model_copy(update={"topology": h200.topology.model_copy(
        update={"hbm_bytes": int(hbm_gib * GiB)})})
    doc = {"model": tiny_moe(num_layers=3, vocab_size=50_000).model_dump(), "cluster": cluster.model_dump(),
           "workload": {"seq_len": 4096}, "plan": {"world_size": 4, **plan}}
    return PlanFile.model_validate(doc)


@settings(max_examples=EXAMPLES, deadline=None)
@given(hbm=st.floats(3.0, 6.0), c=st.sampled_from([1000, 4096, 6000]),
       dispatch=st.sampled_from(["ep", "llep", "pipelined_llep"]), vocab=st.sampled_from(["dense", "ring_dtp"]))
def test_max_context_equals_brute_force(h200, hbm, c, dispatch, vocab):
    pf = _planfile(h200, hbm, composed={"token_budget": c, "dispatch": dispatch, "vocab": vocab,
                                        "optimizer": "gpu"})
    grid = seq_len_grid(pf, 1024, 160 * 1024)
    fast = scan(pf, "seq_len", grid, min_headroom=0.0)     # check's verdict has no headroom
    slow = []
    for S in grid:
        one = pf.model_copy(update={"workload": pf.workload.model_copy(update={"seq_len": int(S)})})
        slow.append(api.check_planfile(one).fits)
    assert fast.fits.tolist() == slow
    best = max((int(S) for S, ok in zip(grid, slow) if ok), default=None)
    assert fast.best == best


def test_max_batch_equals_brute_force(h200):
    pf = _planfile(h200, 4.0, composed={"optimizer": "gpu"})
    seqs = np.arange(1, 25)
    rep = api.FrontierReport(pf, "seqs_per_microbatch", scan(pf, "seqs_per_microbatch", seqs, min_headroom=0.0))
    slow = []
    for n in seqs:
        one = pf.model_copy(update={"workload": pf.workload.model_copy(update={"seqs_per_microbatch": int(n)})})
        slow.append(api.check_planfile(one).fits)
    assert rep.scan.fits.tolist() == slow
    j = rep.to_json()
    best = max((int(n) for n, ok in zip(seqs, slow) if ok), default=None)
    assert j["max_seqs_per_microbatch"] == best
    D = 4  # tiny_moe has 4 KV heads and W = 4: D defaults to 4
    assert j["max_global_batch_tokens"] == (None if best is None else 4 // D * best * 4096)


@pytest.mark.parametrize("headroom", [0.03, 0.2])
def test_min_headroom_is_a_capacity_fraction(h200, headroom):
    from planner.budget.frontier import MIN_HEADROOM

    pf = _planfile(h200, 4.0, composed={"optimizer": "gpu"})
    seqs = np.arange(1, 25)
    s = scan(pf, "seqs_per_microbatch", seqs, min_headroom=headroom)
    want = (s.peak_bytes <= s.capacity_bytes * (1 - headroom)) & (s.host_bytes <= s.host_capacity_bytes)
    assert s.fits.tolist() == want.tolist() and 0 < MIN_HEADROOM < 0.1
    assert scan(pf, "seqs_per_microbatch", seqs).fits.tolist() == \
        scan(pf, "seqs_per_microbatch", seqs, min_headroom=MIN_HEADROOM).fits.tolist()


@pytest.mark.parametrize("scan, kw", [("max_context", {}), ("max_batch", {"seq_len": 32768})])
def test_the_python_api_refuses_a_step_batch_for_a_scan(scan, kw):
    """The scans ignore ``global_batch_tokens``: refused in the API, not only on the command line."""
    from planner import api
    from planner.errors import InvalidPlan

    with pytest.raises(InvalidPlan, match=r"^workload.global_batch_tokens \(5\) does not apply to max-"):
        getattr(api, scan)(model="gpt-oss-20b", gpus=8, global_batch_tokens=5, **kw)
