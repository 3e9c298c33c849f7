"""CLI of issue 13: ``--dispatch-residue``, the routing sensitivity, ``--min-headroom`` and the
search ranking of bounded plans."""

from __future__ import annotations

import json

import pytest

from planner import api

ARGS = dict(model="gpt-oss-20b", gpus=8, seq_len=128 * 1024)
"""The README's example configuration."""


def _dispatch_max(rep) -> int:
    return rep.to_json()["live_sets"]["dispatch"]["max_bytes"]


def test_residue_choice_reaches_the_plan_and_the_bound():
    src = api.check(**ARGS)
    dst = api.check(**ARGS, overrides={"dispatch_residue": "destination"})
    assert src.planfile.plan.composed.dispatch_residue == "source"
    assert dst.planfile.plan.composed.dispatch_residue == "destination"
    # no residue across chunks: the source variant's guarantee is the smaller one
    assert _dispatch_max(src) < _dispatch_max(dst)
    assert not any("residue" in t["name"] for t in src.to_json()["live_sets"]["dispatch"]["terms"])


def test_routing_sensitivity_shows_which_plans_move_with_the_router():
    bounded = api.check(**ARGS).to_json()["routing_sensitivity"]
    ep = api.check(**ARGS, overrides={"dispatch": "ep"}).to_json()["routing_sensitivity"]
    assert list(bounded) == ["balanced", "80/16", "worst"] == list(ep)
    assert len({v["peak_bytes"] for v in bounded.values()}) == 1          # guarantee: any routing
    assert ep["balanced"]["peak_bytes"] < ep["80/16"]["peak_bytes"] < ep["worst"]["peak_bytes"]


def test_bad_min_headroom_is_one_line_exit_2():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "planner.cli", "max-context", "gpt-oss-20b", "--gpus", "8",
                          "--min-headroom", "1.5"], capture_output=True, text=True)
    assert res.returncode == 2 and "--min-headroom" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_search_ranks_bounded_plans_first_with_headroom():
    from planner.search.rank import bounded_dispatch

    rep = api.search(**ARGS, top=3)
    doc = json.loads(json.dumps(rep.to_json()))
    assert rep.result.top and all(bounded_dispatch(c.plan) for c in rep.result.top)
    cap = api.check(plan_file=None, **ARGS).capacity_bytes
    assert all(c.peak_bytes <= 0.97 * cap for c in rep.result.top)
    assert set(doc["routing_sensitivity"]) >= {"composed"}
