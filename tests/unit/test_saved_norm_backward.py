"""The MoE input norm's fp32 backward without checkpointing (``planner.budget.saved_norm_backward``)
against the H200 allocator histories of planner validate's own step at W = 1, N = 32768
(``bench/results/memory_snapshot/{gptoss,qwen3}-W1-S32768-none.json``, two layers), where it binds,
and at N = 8192, where the dispatch backward binds instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.api import build_planfile
from planner.budget import dispatch, saved_norm_backward
from planner.runtime.validate import COMPARED_BOUND
from planner.runtime.validate_compare import memory_ok
from planner.runtime.validate_plan import predict, truncate

SNAPSHOTS = Path(__file__).resolve().parents[2] / "bench/results/memory_snapshot"
CASES = {"gptoss-W1-S32768-none": ("gpt-oss-20b", 32768, "freed"),
         "qwen3-W1-S32768-none": ("qwen3-30b-a3b", 32768, "accumulate"),
         "gptoss-W1-S8192-none": ("gpt-oss-20b", 8192, "freed"),
         "qwen3-W1-S8192-none": ("qwen3-30b-a3b", 8192, "freed")}
TERM = "MoE ffn_norm backward sub-step"


def _prediction(case):
    model, S, life = CASES[case]   # as bench/memory_snapshot.py ran them
    pf = truncate(build_planfile(model=model, gpus=1, seq_len=S, overrides={"checkpoint": "none"}), 2).planfile
    return predict(pf, life, timing=False, dispatch_bound=COMPARED_BOUND)


def _term_bytes(p, label):
    ev, i = p.evaluation, p.labels.index(label)
    return sum(int(ev.term_bytes[j, i]) for j, t in enumerate(ev.terms) if t.name.startswith(TERM))


def _measured(case, label):
    doc = json.loads((SNAPSHOTS / f"{case}.json").read_text())
    return next(r["measured"] for r in doc["validate"]["rows"] if r["phase"] == label), doc["phases"][label]


@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_backward_phases_within_bounds(case):
    p = _prediction(case)
    for label in ("backward[2]", "backward[4]"):
        measured, _ = _measured(case, label)
        assert memory_ok(p.phase_bytes(label), measured), (case, label, p.phase_bytes(label) / measured)


@pytest.mark.parametrize("case", ["gptoss-W1-S32768-none", "qwen3-W1-S32768-none"])
def test_norm_backward_binds_at_32k_with_the_measured_blocks(case):
    p = _prediction(case)
    ctx = p.ctx
    NH, b = int(ctx.tokens_per_rank) * ctx.hidden_size, ctx.act_bytes
    _, window = _measured(case, "backward[2]")
    by_site = {}
    for g in window["groups"]:
        by_site.setdefault(g["site"].split("(")[0], []).extend(g["largest_blocks"][:g["blocks"]])
    temporaries = [s for k, v in by_site.items() for s in v
                   if any(n in k for n in ("PowBackward0", "MulBackward0", "MeanBackward1"))]
    assert sorted(temporaries) == [4 * NH] * saved_norm_backward.TEMPORARIES_FP32
    assert [s for k, v in by_site.items() if "ToCopyBackward0" in k for s in v] == [NH * b]
    comps = dispatch.components(ctx)[2]
    disp = sum(c * eb for (_, eb), c in comps["backward"].items())
    expected = NH * (4 * saved_norm_backward.TEMPORARIES_FP32 + b) - NH * b * 4 - disp   # 2 saves + 2 gradients
    assert expected > 0
    assert _term_bytes(p, "backward[2]") == _term_bytes(p, "backward[4]") == expected


@pytest.mark.parametrize("case", ["gptoss-W1-S8192-none", "qwen3-W1-S8192-none"])
def test_dispatch_backward_binds_at_8k(case):
    p = _prediction(case)
    assert _term_bytes(p, "backward[2]") == 0
    assert _term_bytes(p, "forward[2]") == 0 and _term_bytes(p, "backward[1]") == 0
