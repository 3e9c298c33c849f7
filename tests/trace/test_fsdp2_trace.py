"""Whole-step trace of the FSDP2 baseline against the planner's baseline budget (DESIGN §8).

One rank of ``planner.runtime.fsdp2`` under the fake process group on real CPU tensors at a small
width (``planner.runtime.fsdp2_trace``: ``fully_shard`` is not built under FakeTensorMode),
``MemTracker`` per phase. Asserted:

- the persistent bytes at the step's start (fp32 parameter shards, AdamW m and v, and the fp32
  gradient shards when they are kept) and the optimizer step's transient agree with the formula
  within ``FORMULA_VS_TRACE``, for every layout and both gradient lifetimes;
- every phase total of the formula is at least the traced one less ``FORMULA_VS_TRACE`` (never a
  false fit), in fp32 and in bf16 compute (which shows the fp32 reduce-scatter inputs), except the
  phases of ``KNOWN_UNDER``, which must still be under (they fail loudly once fixed);
- the phases of ``AGREES`` within ``FORMULA_VS_TRACE`` from above too. The layer phases hold the
  largest of their sub-steps (``planner.budget.fsdp2_layer``), read off the GPU allocator history
  of ``planner validate``'s step; the backward phases of the small CPU model stay 2–6% above (the
  CPU kernels' saved tensors differ from CUDA's), which the H200 history does not show.

The experts route by the plan's profile (``planner.runtime.validate.plan_dispatch``), as
``planner validate`` runs them: under the fake process group a rank's own counts replicated over
the expert group would load one rank up to ``ep`` times.
"""

from __future__ import annotations

import pytest

from planner.runtime.fsdp2_trace import TRACE_EXCLUDES, trace_fsdp2
from planner.runtime.validate_compare import confirmed_terms
from planner.schema import ModelSpec, Plan, PlanFile, Workload
from planner.schema.io import load_cluster

FORMULA_VS_TRACE = 0.01
"""DESIGN §8: formula vs trace, relative to the trace."""
W = 8
SEQ = 512

MOE = dict(name="trace-moe", num_layers=2, hidden_size=128, vocab_size=2048, num_heads=8, num_kv_heads=4,
           head_dim=16, num_experts=16, top_k=2, expert_ffn=64)
SHARED = {"dense_layers": (0,), "dense_ffn": 96, "shared_expert_ffn": 64, "num_shared_experts": 1}
GPTOSS = dict(model_type="gpt_oss", attention_bias=True, attention_sinks=True, sliding_window=64, local_layers=(0,),
              expert_bias=True, router_bias=True)
"""gpt-oss's layer: biased projections (``addmm``, which SAC always saves) and router, sinks, a sliding-window
first layer (8 blocks of 64 at ``SEQ``)."""
# name: model overrides, baseline knobs, gradient lifetime, plan dtype (bf16: bf16 compute over fp32
# parameters, as on the GPU; fp32: everything fp32)
CASES = {
    "dp8_ep8_full_freed": ({}, {"ac": "full"}, "freed", "fp32"),
    "dp8_ep8_full_accumulate": ({}, {"ac": "full"}, "accumulate", "fp32"),
    "dp8_ep4_selective": ({}, {"ac": "selective", "ep": 4}, "freed", "fp32"),
    "dp8_ep2_none_accumulate": ({}, {"ac": "none", "ep": 2}, "accumulate", "fp32"),
    "hsdp2x4_ep4": ({}, {"dp_replicate": 2, "ep": 4}, "freed", "fp32"),
    "tp2_loss_parallel": ({}, {"tp": 2, "ep": 4}, "accumulate", "fp32"),
    "chunked_head": ({}, {"head": "chunked", "head_chunk_tokens": 128}, "freed", "fp32"),
    "dense_layer_and_shared_expert": (SHARED, {"ac": "full"}, "freed", "fp32"),
    "bf16_dp8_ep8_full_freed": ({}, {"ac": "full"}, "freed", "bf16"),
    "bf16_tp2_loss_parallel": ({}, {"tp": 2, "ep": 4}, "accumulate", "bf16"),
    "bf16_chunked_head": ({}, {"head": "chunked", "head_chunk_tokens": 128}, "freed", "bf16"),
    "bf16_dense_layer_and_shared_expert": (SHARED, {"ac": "full"}, "freed", "bf16"),
    "bf16_dp8_ep2_none_accumulate": ({}, {"ac": "none", "ep": 2}, "accumulate", "bf16"),
    "bf16_dp8_ep8_none_freed": ({}, {"ac": "none"}, "freed", "bf16"),
    "bf16_w1_full_freed": ({}, {"ac": "full"}, "freed", "bf16"),
    "bf16_tp4_ep1_w4": ({}, {"ac": "full", "tp": 4, "ep": 1}, "freed", "bf16"),
    "gptoss_selective": (GPTOSS, {"ac": "selective", "ep": 4}, "freed", "fp32"),
    "bf16_gptoss_selective": (GPTOSS, {"ac": "selective", "ep": 4}, "freed", "bf16"),
}
WORLD = {"bf16_w1_full_freed": 1, "bf16_tp4_ep1_w4": 4}
"""World sizes other than ``W``: every FSDP mesh of one rank (``dp_shard·cp = 1``)."""

_FWD_HEAD_OPT = ("forward[1]", "forward[2]", "head", "optimizer")
AGREES: dict[str, tuple[str, ...]] = {
    "dp8_ep8_full_freed": _FWD_HEAD_OPT,
    "dp8_ep8_full_accumulate": _FWD_HEAD_OPT,
    "dp8_ep4_selective": _FWD_HEAD_OPT,
    "dp8_ep2_none_accumulate": ("forward[2]", "head", "backward[2]", "optimizer"),
    "hsdp2x4_ep4": _FWD_HEAD_OPT,
    "tp2_loss_parallel": ("head", "optimizer"),
    "chunked_head": _FWD_HEAD_OPT,
    "dense_layer_and_shared_expert": _FWD_HEAD_OPT,
    "bf16_dp8_ep8_full_freed": _FWD_HEAD_OPT + ("backward[2]", "backward[1]"),
    "bf16_tp2_loss_parallel": ("head", "optimizer"),
    "bf16_chunked_head": _FWD_HEAD_OPT + ("backward[2]", "backward[1]"),
    "bf16_dense_layer_and_shared_expert": _FWD_HEAD_OPT + ("backward[2]", "backward[1]"),
    "bf16_dp8_ep2_none_accumulate": ("forward[2]", "head", "backward[2]", "optimizer"),
    "bf16_dp8_ep8_none_freed": _FWD_HEAD_OPT + ("backward[2]", "backward[1]"),
    "bf16_w1_full_freed": _FWD_HEAD_OPT + ("backward[2]", "backward[1]"),
    "bf16_tp4_ep1_w4": ("head", "optimizer"),
    "gptoss_selective": _FWD_HEAD_OPT,
    "bf16_gptoss_selective": _FWD_HEAD_OPT + ("backward[2]", "backward[1]"),
}
"""Phases whose total the formula matches within ``FORMULA_VS_TRACE`` from above as well: under full
AC every forward phase (the larger of the attention and FFN sub-steps), the head, the optimizer; in
bf16 the backward of full-AC MoE layers and the chunked head; under selective AC the forward
phases (every ``addmm`` output saved: gpt-oss's q, k, v, o and router logits, its top-k, its
sink-padded SDPA output; ``planner.budget.fsdp2_saved.sac_saved_parts``), and in bf16 gpt-oss's
backward; without checkpointing at the default
skew over eight expert ranks every phase (the earlier layers' saved rows at the busiest rank's
received rows ``Q``: 0.71 at the head while they were counted at ``N·k``); at W = 1 every phase
(the one-rank reductions' quotient copy and the unshard's cast copy, ``planner.budget.fsdp2_reduce``);
without checkpointing over two expert ranks forward[2] (the last layer's experts' all-gather output,
which the head's ``wait_for_unshard`` keeps until it returns); a dense first layer's forward[1] (fp32:
the embedding's output beside its two tables; bf16: the queries' RoPE working set) and, in bf16, its
backward[1] (the FFN norm's fp32 backward temporaries), ``planner.budget.fsdp2_layer``."""

KNOWN_UNDER: dict[str, dict[str, str]] = {}
"""Phases the formula still under-counts against the CPU trace by more than ``FORMULA_VS_TRACE``
(asserted to stay under, so a fix shows)."""


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("h200")


def _table(rows) -> str:
    return "\n".join(f"{r.phase:12s} {r.what:36s} formula {r.predicted:12.0f} trace {r.measured:12.0f} "
                     f"ratio {r.ratio if r.ratio is None else round(r.ratio, 4)}" for r in rows)


@pytest.mark.parametrize("name", list(CASES))
def test_fsdp2_trace(name, cluster):
    mover, knobs, lifetime, dtype = CASES[name]
    pf = PlanFile(model=ModelSpec(**{**MOE, **mover}), cluster=cluster, workload=Workload(seq_len=SEQ),
                  plan=Plan(stack="fsdp2", world_size=WORLD.get(name, W), dtype=dtype, baseline=knobs))
    pred, samples, start, rows = trace_fsdp2(pf, grad_lifetime=lifetime, tolerance=FORMULA_VS_TRACE)
    assert all(s.peak_bytes > 0 for s in samples.values()), samples
    exact = [r for r in rows if r.what.startswith(("persistent", "optimizer_step"))]
    assert len(exact) == 2 and all(r.ok for r in exact), _table(rows)
    phases = [r for r in rows if r.what == "phase total"]
    assert len(phases) == len(pred.labels)
    known = KNOWN_UNDER.get(name, {})
    assert all(r.predicted >= r.measured * (1 - FORMULA_VS_TRACE) for r in phases if r.phase not in known), \
        _table(rows)
    assert all(r.predicted < r.measured * (1 - FORMULA_VS_TRACE) for r in phases if r.phase in known), \
        "a known under-count is fixed: drop it from KNOWN_UNDER\n" + _table(rows)
    agree = [r for r in phases if r.phase in AGREES.get(name, ())]
    assert len(agree) == len(AGREES.get(name, ()))
    assert all(r.predicted <= r.measured * (1 + FORMULA_VS_TRACE) for r in agree), _table(rows)
    confirmed = confirmed_terms(pred, rows, under=FORMULA_VS_TRACE, exclude=TRACE_EXCLUDES,
                                only=set(AGREES.get(name, ())))
    marked = {(t.live_set, t.name) for t in pred.evaluation.terms if t.provisional}
    assert sorted(confirmed & marked) == [], f"confirmed by this trace: drop their provisional mark: {sorted(confirmed & marked)}"
