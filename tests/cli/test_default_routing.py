"""The default routing of a verdict (issue 13, DESIGN §3.2 "no launch-time bound, no balanced
default"): a plan whose dispatch has no launch-time bound (standard EP, LLEP, PipelinedLLEP's
expected size, the FSDP2 baseline's EP all-to-all) is judged under the named skew unless the user
names a routing; PipelinedLLEP under its guarantee keeps ``balanced``, which cannot move it."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.plans.routing import NAMED_SKEW, launch_time_bound, named_skew
from planner.schema import Plan

BASE = ["gpt-oss-20b", "--gpus", "8", "--seq-len", "128k"]
EP = ["gpt-oss-20b", "--gpus", "8", "--seq-len", "96k", "--dispatch", "ep", "--optimizer", "gpu", "--checkpoint", "none"]
"""A standard-EP plan without checkpointing: FITS at 112.5 GiB under balanced routing, 286.1 GiB at 80/16
(every earlier MoE region keeps its received rows, which follow the routing)."""


def _check(*args) -> tuple[int, dict]:
    res = CliRunner().invoke(app, ["check", *args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.output)


def test_standard_ep_default_verdict_is_the_named_skew_not_balanced():
    rc, d = _check(*EP)
    rc_skew, skew = _check(*EP, "--routing", NAMED_SKEW)
    rc_bal, bal = _check(*EP, "--routing", "balanced")
    assert d["routing"]["routing"] == NAMED_SKEW and d["routing"]["default"] is True
    assert "no launch-time bound" in d["routing"]["why"]
    assert (rc, d["peak_bytes"], d["fits"]) == (rc_skew, skew["peak_bytes"], skew["fits"])
    assert skew["routing"]["default"] is False
    # sized under balanced it fits; under the default it does not
    assert rc_bal == 0 and bal["fits"] and bal["peak_bytes"] < bal["capacity_bytes"]
    assert rc == 1 and not d["fits"] and d["peak_bytes"] > d["capacity_bytes"]
    assert d["plan"]["plan"]["routing"] == NAMED_SKEW


def test_check_text_says_which_routing_and_why():
    res = CliRunner().invoke(app, ["check", *EP])
    assert res.exit_code == 1, res.output
    assert f"routing of the verdict: {NAMED_SKEW} · default: standard EP has no launch-time bound" in res.output
    assert "DOES NOT FIT" in res.output and "FITS\n" not in res.output.replace("DOES NOT FIT", "")


@pytest.mark.parametrize("extra, op", [(["--dispatch", "llep"], "LLEP"), (["--baseline"], "FSDP2"),
                                       (["--dispatch-bound", "expected"], "expected size")])
def test_other_unbounded_operators_default_to_the_named_skew(extra, op):
    _, d = _check(*BASE, *extra)
    _, skew = _check(*BASE, *extra, "--routing", NAMED_SKEW)
    assert d["routing"]["routing"] == NAMED_SKEW and d["routing"]["default"] and op in d["routing"]["why"]
    assert d["peak_bytes"] == skew["peak_bytes"]


def test_pipelined_llep_guarantee_keeps_balanced_and_its_verdict():
    rc, d = _check(*BASE)
    rc_bal, bal = _check(*BASE, "--routing", "balanced")
    _, skew = _check(*BASE, "--routing", NAMED_SKEW)
    assert d["routing"] == {"routing": "balanced", "default": True, "why": d["routing"]["why"]}
    assert "guarantee holds for every routing" in d["routing"]["why"]
    assert (rc, d["peak_bytes"]) == (rc_bal, bal["peak_bytes"])
    # its guarantee is the verdict: the named skew moves nothing (source-side residue)
    assert d["peak_bytes"] == skew["peak_bytes"]


def test_search_then_check_judges_unbounded_plans_at_the_named_skew(tmp_path):
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["search", *BASE, "--out", str(out), "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    for c in [*s["top"], s["baseline"]]:
        plan = Plan.model_validate(c["plan"])
        assert plan.routing == ("balanced" if launch_time_bound(plan) else NAMED_SKEW)
        assert c["routing"]["default"] and c["routing"]["routing"] == plan.routing
    # the baseline (EP all-to-all, no launch-time bound) is ranked by its peak at the named skew
    assert s["baseline"]["peak_bytes"] == s["routing_sensitivity"]["baseline"][NAMED_SKEW]["peak_bytes"]
    written = yaml.safe_load(out.read_text())["plan"]
    rc, d = _check("--plan", str(out))
    _, skew = _check("--plan", str(out), "--routing", NAMED_SKEW)
    plan = Plan.model_validate(written)
    # the file names no routing (none was given): every later check derives it from its own operator
    assert written["routing"] is None and d["routing"]["default"]
    if not launch_time_bound(plan):
        assert d["peak_bytes"] == skew["peak_bytes"]
    assert d["fits"] == (d["peak_bytes"] <= d["capacity_bytes"])
    # switching the written plan to an unbounded operator is judged at the named skew, not "balanced"
    _, ep = _check("--plan", str(out), "--dispatch", "ep")
    _, ep_skew = _check("--plan", str(out), "--dispatch", "ep", "--routing", NAMED_SKEW)
    assert ep["routing"]["routing"] == NAMED_SKEW and ep["routing"]["default"]
    assert ep["peak_bytes"] == ep_skew["peak_bytes"]


def test_search_routing_flag_still_wins():
    rep = api.search(model="gpt-oss-20b", gpus=8, seq_len=131072, routing="balanced", top=1)
    for c in (rep.result.top[0], rep.result.baseline):
        assert c.plan.routing == "balanced"
        assert rep.routing_basis(c.plan) == {"routing": "balanced", "default": False,
                                             "why": "given (--routing or the plan file)"}


def test_named_skew_fits_models_with_few_experts():
    assert named_skew(32, 4) == NAMED_SKEW            # gpt-oss-20b: E = 32, k = 4
    assert named_skew(8, 2) == "80/6"                 # mixtral: 16 > E; H = 6 leaves 2 = k cold experts
    assert named_skew(16, 1) == "80/15"               # llama-4-scout: 80/16 would leave no cold expert
    assert named_skew(384, 8) == NAMED_SKEW
    assert named_skew(3, 2) == "80/3" and named_skew(1, 2) == "worst"
    # mixtral's check ran the sensitivity at 80/16 and failed; it now uses 80/6
    rc, d = _check("mixtral-8x7b", "--gpus", "8", "--seq-len", "32k", "--dispatch", "ep")
    assert d["routing"]["routing"] == "80/6" and list(d["routing_sensitivity"]) == ["balanced", "80/6", "worst"]
