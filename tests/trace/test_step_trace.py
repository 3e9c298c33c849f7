"""Whole-step trace (DESIGN §8) of the composed step: formula against trace, phase by phase.

One rank of the composed step of gpt-oss-20b, Qwen3-30B-A3B and DeepSeek-V2-Lite at full width,
2 layers, W ∈ {8, 64} (the shipped default plan: Ulysses, PipelinedLLEP, Ring-DTP, SCO,
OffloadStreamAdamW), traced under FakeTensorMode + the fake process group + MemTracker
(``planner.runtime.step_trace``), the ``workspace`` live set (invisible to fake tensors; ``planner
validate`` measures it) left out:

- the persistent bytes at the step's start (weights; gradients freed), ``forward[1]`` (the larger of
  the embedding's sub-step and region 1's forward) and the head phase agree within
  ``FORMULA_VS_TRACE``;
- every phase's peak is meant to agree too; it does not yet (``KNOWN_MISSES``), so that test is a
  strict xfail: it fails the day the formula and the trace agree, and must then become a plain test;
- one checkpointed region's forward (``trace_region``: GQA attention with QK-norm, a global
  attention layer with sinks, a sliding-window layer with sinks, DeepSeek-V2-Lite's dense FFN) agrees with the ``attention`` and
  ``ffn`` live sets within ``FORMULA_VS_TRACE``.
"""

from __future__ import annotations

import os

import pytest

from planner.runtime.step_trace import trace_planfile, trace_step

FORMULA_VS_TRACE = 0.01
"""DESIGN §8: formula vs trace, relative to the trace, both ways."""
MODELS = ("gpt-oss-20b", "qwen3-30b-a3b", "deepseek-v2-lite")
WORLDS = (8, 64)
SEQ_LEN = 32768
"""N = S/D tokens per rank: 4096 (gpt-oss, D = 8), 8192 (Qwen3, D = 4), 4096 / 2048 (DeepSeek,
D = 8 / 16)."""


STEP_TRACES = os.environ.get("PLANNER_FAST_TRACES", "") != "1"
"""The six whole-step traces take 15-45 s each on a CPU (the weights are real: FSDP2 cannot build
under fake tensors); PLANNER_FAST_TRACES=1 skips them locally. The region traces below are fast."""
KNOWN_MISSES = (
    "formula vs trace per phase is not yet within 1%: the persistent bytes, forward[1] (embedding "
    "sub-step or region 1 with gpt-oss's sliding-window copies) and the head phase are (test above), "
    "and one region's forward (region tests below); still missing: the MoE region's forward and "
    "backward (formula 0.80-0.98 of the trace; gc at the expert block shows a fake tensor whose storage "
    "is the whole local expert stack: the real weights converted under fake mode, which the H200 run "
    "does not show: forward[2] 0.97 there), MLA regions (DeepSeek forward[3] 1.15 / 1.30), attention "
    "backward (sliding-window layer 0 region trace 635 vs 385 MiB at N = 4096; QK-norm / global "
    "0.86-1.06), the optimizer phase at W = 64 (a head-shard-sized buffer, 0.84-0.90, that the H200 "
    "run does not show either: optimizer_step 1.000 there)")
_CACHE: dict = {}


def _trace(model, W):
    pytest.importorskip("planner.runtime.mop", reason="the composed step (planner/runtime/mop.py)")
    if (model, W) not in _CACHE:
        _CACHE[model, W] = trace_step(trace_planfile(model, world_size=W, seq_len=SEQ_LEN),
                                      grad_lifetime="freed", tolerance=FORMULA_VS_TRACE)
    return _CACHE[model, W]


def _table(res) -> str:
    return "\n".join(f"{r.phase:12s} {r.what:34s} formula {r.predicted:14.0f} trace {r.measured:14.0f} "
                     f"ratio {r.ratio if r.ratio is None else round(r.ratio, 4)}" for r in res.rows)


@pytest.mark.skipif(not STEP_TRACES, reason="PLANNER_FAST_TRACES=1")
@pytest.mark.parametrize("W", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_step_persistent_formula_vs_trace(model, W):
    """Every phase is recorded; the bytes when the step begins (weights; gradients freed) agree."""
    res = _trace(model, W)
    assert set(res.samples) == set(res.prediction.labels)
    assert all(s.peak_bytes > 0 for s in res.samples.values())
    row = next(r for r in res.rows if r.what == "persistent")
    assert abs(row.predicted - row.measured) <= FORMULA_VS_TRACE * row.measured, _table(res)


@pytest.mark.skipif(not STEP_TRACES, reason="PLANNER_FAST_TRACES=1")
@pytest.mark.parametrize("W", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_step_head_formula_vs_trace(model, W):
    """The head phase: every retained boundary, the final norm's saved tensors, the Ring-DTP head,
    the weights and the gradients that exist by then (freed lifetime)."""
    res = _trace(model, W)
    row = next(r for r in res.rows if r.phase == "head")
    assert abs(row.predicted - row.measured) <= FORMULA_VS_TRACE * row.measured, _table(res)


@pytest.mark.skipif(not STEP_TRACES, reason="PLANNER_FAST_TRACES=1")
@pytest.mark.parametrize("W", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_step_first_forward_formula_vs_trace(model, W):
    """forward[1]: the larger of the embedding's sub-step (FSDP2's all-gather output and the
    unsharded table it copies into, and the embedding output) and region 1's forward (a
    sliding-window layer's block copies in gpt-oss)."""
    res = _trace(model, W)
    row = next(r for r in res.rows if r.phase == "forward[1]")
    assert abs(row.predicted - row.measured) <= FORMULA_VS_TRACE * row.measured, _table(res)


@pytest.mark.skipif(not STEP_TRACES, reason="PLANNER_FAST_TRACES=1")
@pytest.mark.xfail(strict=True, reason=KNOWN_MISSES)
@pytest.mark.parametrize("W", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_step_phases_formula_vs_trace(model, W):
    res = _trace(model, W)
    assert res.ok, _table(res)


REGIONS = [("qwen3-30b-a3b", 1), ("gpt-oss-20b", 3), ("gpt-oss-20b", 1), ("deepseek-v2-lite", 2)]
"""(model, region): Qwen3's attention (QK-norm, global), gpt-oss's global attention layer (sinks),
gpt-oss's sliding-window layer 0 (sinks, block copies), DeepSeek-V2-Lite's dense FFN region
(layer 0)."""


@pytest.mark.parametrize("W", WORLDS)
@pytest.mark.parametrize("model,r", REGIONS)
def test_region_forward_formula_vs_trace(model, r, W):
    """One checkpointed region's non-saving forward above its input: the ``attention`` and ``ffn``
    live sets of ``forward[r]``."""
    from planner.runtime.step_trace import trace_region
    from planner.runtime.validate_plan import predict

    pf = trace_planfile(model, world_size=W, seq_len=SEQ_LEN)
    got = trace_region(pf, r)
    pred = predict(pf, "freed", timing=False, dispatch_bound="expected")
    want = sum(pred.live_set_bytes(f"forward[{r}]", ls) for ls in ("attention", "ffn"))
    assert got.forward_bytes > 0
    assert abs(want - got.forward_bytes) <= FORMULA_VS_TRACE * got.forward_bytes, (want, got.forward_bytes)
