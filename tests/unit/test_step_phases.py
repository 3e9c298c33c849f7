"""``bench/step_phases.py`` on the CPU (gloo, tiny widths): the loop clock sees every expert block of
the composed step, once per pass, and the synchronised phase windows cover the step (the H200 run's
per-phase and per-block numbers are read from them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import step_phases  # noqa: E402

FORWARD_PASSES = 2
"""Forward loops per step of a checkpointed PipelinedLLEP layer: the forward and the outer recompute."""


@pytest.fixture(scope="module")
def case():
    return step_phases.run_case("qwen3-30b-a3b", 512, dict(tiny=True, warmup=1, timed=1), torch)


def test_every_block_is_clocked_once_per_pass(case):
    moe = [lab for lab, d in case["loops"].items() if d.get("bwd_block_calls")]
    assert sorted(moe) == ["backward[2]", "backward[4]"]       # two MoE regions, their backward windows
    slots = case["num_chunks"] * case["num_experts"]             # at most one block per slot and chunk
    for lab in moe:
        d, f = case["loops"][lab], case["loops"][lab.replace("backward", "forward")]
        assert 0 < d["bwd_block_calls"] <= slots
        assert d["fwd_block_calls"] == d["bwd_block_calls"]      # the recompute's forward, in the backward window
        assert f["fwd_block_calls"] == d["bwd_block_calls"]      # the forward ran the same blocks
        assert d["loop_bwd_calls"] == case["num_chunks"] and f["loop_fwd_calls"] == case["num_chunks"]
    fwd = sum(d.get("fwd_block_calls", 0) for d in case["loops"].values())
    assert fwd == FORWARD_PASSES * sum(case["loops"][lab]["bwd_block_calls"] for lab in moe)


def test_phase_windows_cover_the_step(case):
    ph = case["phases_s"]
    assert {"forward[1]", "forward[4]", "head", "backward[1]", "backward[4]", "optimizer"} <= set(ph)
    assert all(v >= 0 for v in ph.values())
    assert case["synced_step_s"] == pytest.approx(sum(ph.values()))
    assert len(case["steps_s"]) == 1 and case["steps_s"][0] > 0
