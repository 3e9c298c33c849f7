"""Whole-step trace (DESIGN §8) of the composed step: formula against trace, phase by phase.

One rank of the composed step of gpt-oss-20b, Qwen3-30B-A3B and DeepSeek-V2-Lite at full width,
2 layers, W ∈ {8, 64} (the shipped default plan: Ulysses, PipelinedLLEP, Ring-DTP, SCO,
OffloadStreamAdamW), traced under FakeTensorMode + the fake process group + MemTracker
(``planner.runtime.step_trace``), the ``workspace`` live set (invisible to fake tensors; ``planner
validate`` measures it) left out:

- the persistent bytes at the step's start (weights; gradients freed), ``forward[1]`` (the larger of
  the embedding's sub-step and region 1's forward) and the head phase agree within
  ``FORMULA_VS_TRACE``;
- every other phase's peak agrees too, except the rows of ``KNOWN_GAPS`` (each with its reason): a
  new miss fails, and so does a known gap that comes within tolerance. The fake conversions of the
  real weights (the stacked experts, the head shard, the optimizer's views of them) count as the
  real storages (``planner.runtime.real_inputs_tracker``), as the GPU allocates nothing for them;
- LLEP's and standard EP's whole step (Qwen3-30B-A3B, W = 8, ``UNCHUNKED``) agrees in every phase;
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
SUBSTEP_WS = ("backward[1] of gpt-oss at W = 8, N = 4096: the embedding's reduce-scatter sub-step binds, and the "
              "formula books it as the excess over region 1's bytes including the sliding-window kernel's 134.7 MB "
              "accumulator, a workspace term that this comparison leaves out with the workspace live set; the "
              "trace plus the 69.2 MB of cuBLAS workspaces is the H200 measurement to 0.1 MB (3787.9 MB; "
              "validate_expandable.json: 1.0001)")
QKV_WS = ("global-attention backward of gpt-oss (N = 4096): the formula books the q, k, v projection gradients after "
          "FlashAttention's backward, whose sub-step binds with the kernel's workspace (dq_accum, the GQA expansion, the "
          "sinks' copies), a live set this comparison leaves out; the trace then peaks at attention_norm's backward, "
          "with those gradients. Against the H200, workspace included: 0.999-1.000 at W = 8 and 64 "
          "(validate_expandable.json, bench/results/memory_snapshot/gptoss-W64-S32768.json)")
SLIDE = ("sliding-window backward at W = 64, N = 4096: formula 0.98 of the trace (1.02 of the H200 measurement "
         "at W = 8, N = 16384)")
EMBED_FEATURE = ("backward[1] of DeepSeek-V2-Lite at W = 64, N = 2048: the embedding's backward binds; on the GPU "
                 "embedding_dense_backward_cuda takes its feature kernel at <= 3072 indices (no per-segment fp32 sums) and "
                 "the H200 peaks at the table's copy-out, 2·V·H + Θ_region(1) + N·H (validate_expandable.json W = 64 "
                 "S = 32768: 1.0000; bench/results/memory_snapshot/dsv2-W64-S32768.json), while the CPU fake-tensor trace "
                 "holds 25.6 MB more there (formula 0.975 of the trace)")
T = "phase total"
KNOWN_GAPS = {
    ("gpt-oss-20b", 8): {("backward[1]", T): SUBSTEP_WS, ("backward[3]", T): QKV_WS},
    ("gpt-oss-20b", 64): {("backward[1]", T): SLIDE, ("backward[3]", T): QKV_WS},
    ("qwen3-30b-a3b", 8): {},
    ("qwen3-30b-a3b", 64): {},
    ("deepseek-v2-lite", 8): {},
    ("deepseek-v2-lite", 64): {("backward[1]", T): EMBED_FEATURE},
}
"""Per traced case, the rows (phase, what) known to miss ``FORMULA_VS_TRACE``, with the reason. A row
outside the list that misses fails the test; a listed row that comes within tolerance fails it too
(remove it from the list)."""
CONFIRMED_GATHERED = {
    "region weights: unsharded + all-gather output (forward), + prefetched region (backward)",
    "unreduced grads: region r's, and the held reduce-scatter input of region r+1 (bf16)",
    "embedding table, re-gathered by FSDP2's backward prefetch",
}
"""The composed stack's ZeRO-3 terms the six traces confirm: each is resident in a phase that agrees, which
would miss without it."""
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
    the weights (freed lifetime: no gradient yet)."""
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
@pytest.mark.parametrize("W", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_step_phases_formula_vs_trace(model, W):
    """Every judged row agrees within ``FORMULA_VS_TRACE`` except the known gaps (``KNOWN_GAPS``),
    which still miss."""
    res = _trace(model, W)
    gaps = KNOWN_GAPS[model, W]
    rows = {(r.phase, r.what): r for r in res.rows if r.judged}
    assert set(gaps) <= set(rows), set(gaps) - set(rows)
    new = [k for k, r in rows.items() if not r.ok and k not in gaps]
    fixed = [k for k in gaps if rows[k].ok]
    assert not new, "new misses:\n" + _table(res)
    assert not fixed, f"known gaps now within tolerance (remove them from KNOWN_GAPS): {fixed}\n" + _table(res)


@pytest.mark.skipif(not STEP_TRACES, reason="PLANNER_FAST_TRACES=1")
def test_terms_the_traces_confirm_are_not_provisional():
    """A term is confirmed where a traced phase agrees within ``FORMULA_VS_TRACE`` (not a known gap)
    and would not without it (``validate_compare.confirmed_terms``). Every confirmed term has lost
    its ``provisional`` mark, and the traces confirm each of the composed ZeRO-3 terms named here."""
    from planner.runtime.step_trace import TRACE_EXCLUDES
    from planner.runtime.validate_compare import confirmed_terms

    confirmed, marked = set(), set()
    for model in MODELS:
        for W in WORLDS:
            res = _trace(model, W)
            gaps = {ph for ph, _ in KNOWN_GAPS[model, W]}
            only = {r.phase for r in res.rows if r.what == T} - gaps
            confirmed |= confirmed_terms(res.prediction, res.rows, under=FORMULA_VS_TRACE,
                                         exclude=TRACE_EXCLUDES, only=only)
            marked |= {(t.live_set, t.name) for t in res.prediction.evaluation.terms if t.provisional}
    assert sorted(confirmed & marked) == []
    assert {n for ls, n in confirmed if ls == "gathered"} >= CONFIRMED_GATHERED, sorted(confirmed)


UNCHUNKED = [("llep", 6), ("ep", 0)]
"""Qwen3-30B-A3B W = 8 (N = 8192) under LLEP at rank 6 (the binding rank of routing 80/16, the one
the H200 measured: validate_heldout_r4.json) and standard EP at rank 0 (the hot experts' owner).
``run_unchunked`` makes the region output and the dispatcher's input gradient at its end and, with
freed gradients, the region's own expert gradients in the grouped MLP's backward
(``planner.budget.dispatch_edges``): before that was booked, these traces were 1.02 (LLEP forward),
1.07 (LLEP backward) and 1.02 (standard EP backward) of the formula's. About 12-17 s each."""


@pytest.mark.skipif(not STEP_TRACES, reason="PLANNER_FAST_TRACES=1")
@pytest.mark.parametrize("dispatch,rank", UNCHUNKED)
def test_step_unchunked_dispatch_formula_vs_trace(dispatch, rank):
    """LLEP's and standard EP's whole step: every judged row within ``FORMULA_VS_TRACE``."""
    pytest.importorskip("planner.runtime.mop", reason="the composed step (planner/runtime/mop.py)")
    pf = trace_planfile("qwen3-30b-a3b", world_size=8, seq_len=SEQ_LEN, dispatch=dispatch)
    res = trace_step(pf, rank=rank, grad_lifetime="freed", tolerance=FORMULA_VS_TRACE)
    assert [(r.phase, r.what) for r in res.rows if r.judged and not r.ok] == [], _table(res)


@pytest.mark.skipif(not STEP_TRACES, reason="PLANNER_FAST_TRACES=1")
def test_step_with_the_gpu_optimizer_formula_vs_trace():
    """``optimizer: gpu`` (``MasterAdamW``): its fp32 masters and moments live outside the optimizer's
    own ``state`` and are counted (they were not: every phase 934 MB under the formula for Qwen3 at
    W = 8, while the H200 run r4-qwen3-W16-S16384-gpu-adamw agrees with the formula)."""
    pytest.importorskip("planner.runtime.mop", reason="the composed step (planner/runtime/mop.py)")
    pf = trace_planfile("qwen3-30b-a3b", world_size=8, seq_len=SEQ_LEN, optimizer="gpu", vocab="dense",
                        checkpoint="none")
    res = trace_step(pf, grad_lifetime="freed", tolerance=FORMULA_VS_TRACE)
    assert [(r.phase, r.what) for r in res.rows if r.judged and not r.ok] == [], _table(res)


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
