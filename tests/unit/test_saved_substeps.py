"""The sub-steps of the composed stack without checkpointing (``planner.budget.saved_substeps``)
against the H200 allocator histories of planner validate's own step (two layers): the MoE input
norm's fp32 backward at W = 1, N = 32768 (``bench/results/memory_snapshot/{gptoss,qwen3}-W1-S32768-
none.json``), where it binds, and at N = 8192, where the dispatch backward binds instead; the dense
FFN's residual add at N = 131072 (``dsv2-W1-S131072-none.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.api import build_planfile
from planner.budget import dispatch, saved_substeps
from planner.runtime.validate import COMPARED_BOUND
from planner.runtime.validate_compare import memory_ok
from planner.runtime.validate_plan import predict, truncate

SNAPSHOTS = Path(__file__).resolve().parents[2] / "bench/results/memory_snapshot"
CASES = {"gptoss-W1-S32768-none": ("gpt-oss-20b", 32768, "freed"),
         "qwen3-W1-S32768-none": ("qwen3-30b-a3b", 32768, "accumulate"),
         "gptoss-W1-S8192-none": ("gpt-oss-20b", 8192, "freed"),
         "qwen3-W1-S8192-none": ("qwen3-30b-a3b", 8192, "freed"),
         "dsv2-W1-S131072-none": ("deepseek-v2-lite", 131072, "freed")}
TERM = "MoE ffn_norm backward sub-step"


def _prediction(case):
    model, S, life = CASES[case]   # as bench/memory_snapshot.py ran them
    pf = truncate(build_planfile(model=model, gpus=1, seq_len=S, overrides={"checkpoint": "none"}), 2).planfile
    return predict(pf, life, timing=False, dispatch_bound=COMPARED_BOUND)


DENSE_TERM = "dense FFN residual add"


def _term_bytes(p, label, name=TERM):
    ev, i = p.evaluation, p.labels.index(label)
    return sum(int(ev.term_bytes[j, i]) for j, t in enumerate(ev.terms) if t.name.startswith(name))


def _measured(case, label):
    doc = json.loads((SNAPSHOTS / f"{case}.json").read_text())
    return next(r["measured"] for r in doc["validate"]["rows"] if r["phase"] == label), doc["phases"][label]


@pytest.mark.parametrize("case", sorted(CASES))
def test_phases_within_bounds(case):
    p = _prediction(case)
    for label in ("forward[2]", "backward[2]", "backward[4]"):
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
    assert sorted(temporaries) == [4 * NH] * saved_substeps.TEMPORARIES_FP32
    assert [s for k, v in by_site.items() if "ToCopyBackward0" in k for s in v] == [NH * b]
    comps = dispatch.components(ctx)[2]
    disp = sum(c * eb for (_, eb), c in comps["backward"].items())
    expected = NH * (4 * saved_substeps.TEMPORARIES_FP32 + b) - NH * b * 4 - disp   # 2 saves + 2 gradients
    assert expected > 0
    assert _term_bytes(p, "backward[2]") == _term_bytes(p, "backward[4]") == expected


@pytest.mark.parametrize("case", ["gptoss-W1-S8192-none", "qwen3-W1-S8192-none"])
def test_dispatch_backward_binds_at_8k(case):
    p = _prediction(case)
    assert _term_bytes(p, "backward[2]") == 0
    assert _term_bytes(p, "forward[2]") == 0 and _term_bytes(p, "backward[1]") == 0


def test_dense_residual_add_at_131k_with_the_measured_blocks():
    p = _prediction("dsv2-W1-S131072-none")
    ctx, m = p.ctx, p.ctx.model
    N, b = int(ctx.tokens_per_rank), ctx.act_bytes
    NH, NI = N * ctx.hidden_size * b, N * ctx.dense_ffn * b
    _, window = _measured("dsv2-W1-S131072-none", "forward[2]")
    groups = {" < ".join(g["site"].split(" < ")[:2]): (g["blocks"], g["bytes"]) for g in window["groups"]}
    assert groups["runtime/model_layers.py:109 forward < runtime/model.py:85 ffn_region"] == (5, NH + 4 * NI)
    assert groups["runtime/model.py:85 ffn_region < runtime/model.py:172 _run"] == (1, NH)          # the sum
    assert groups["runtime/model.py:82 attention_region < runtime/model.py:172 _run"] == (1, NH)    # its input
    theta = m.dense_ffn_params() + m.hidden_size
    assert _term_bytes(p, "forward[2]", DENSE_TERM) == NH - theta * b > 0
    assert _term_bytes(p, "backward[2]", DENSE_TERM) == _term_bytes(p, "forward[1]", DENSE_TERM) == 0


def test_dense_residual_add_below_theta_over_h_is_zero():
    pf = truncate(build_planfile(model="deepseek-v2-lite", gpus=1, seq_len=16384, overrides={"checkpoint": "none"}),
                  2).planfile
    assert _term_bytes(predict(pf, "freed", timing=False), "forward[2]", DENSE_TERM) == 0
