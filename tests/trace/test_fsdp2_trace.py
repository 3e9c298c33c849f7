"""Whole-step trace of the FSDP2 baseline against the planner's baseline budget (DESIGN §8).

One rank of ``planner.runtime.fsdp2`` under the fake process group on real CPU tensors at a small
width (``planner.runtime.fsdp2_trace``: ``fully_shard`` is not built under FakeTensorMode),
``MemTracker`` per phase. Asserted:

- the persistent bytes at the step's start (fp32 parameter shards, AdamW m and v, and the fp32
  gradient shards when they are kept) and the optimizer step's transient agree with the formula
  within ``FORMULA_VS_TRACE``, for every layout and both gradient lifetimes;
- every phase total of the formula is at least the traced one less ``FORMULA_VS_TRACE`` (never a
  false fit), in fp32 and in bf16 compute (which shows the fp32 reduce-scatter inputs);
- the phases of ``AGREES`` within ``FORMULA_VS_TRACE`` from above too. The other phase totals are
  not yet within 1% from above: in a layer's forward the formula adds the attention's transients
  to the MoE's, which run one after the other (README, FSDP2 baseline).

The experts route by the plan's profile (``planner.runtime.validate.plan_dispatch``), as
``planner validate`` runs them: under the fake process group a rank's own counts replicated over
the expert group would load one rank up to ``ep`` times.
"""

from __future__ import annotations

import pytest

from planner.runtime.fsdp2_trace import trace_fsdp2
from planner.schema import ModelSpec, Plan, PlanFile, Workload
from planner.schema.io import load_cluster

FORMULA_VS_TRACE = 0.01
"""DESIGN §8: formula vs trace, relative to the trace."""
W = 8
SEQ = 512

MOE = dict(name="trace-moe", num_layers=2, hidden_size=128, vocab_size=2048, num_heads=8, num_kv_heads=4,
           head_dim=16, num_experts=16, top_k=2, expert_ffn=64)
SHARED = {"dense_layers": (0,), "dense_ffn": 96, "shared_expert_ffn": 64}
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
}

AGREES: dict[str, tuple[str, ...]] = {
    "bf16_dp8_ep8_full_freed": ("backward[2]",),
    "bf16_chunked_head": ("head", "backward[2]"),
    "bf16_dense_layer_and_shared_expert": ("backward[1]",),
}
"""Phases whose total the formula matches within ``FORMULA_VS_TRACE`` from above as well: the last
layer's backward under full AC (the head's fp32 reduce-scatter input FSDP2 still holds there), a
dense layer's backward, the chunked head (its all-gather output held, its gradient's reduce-scatter a
sub-step after the chunks)."""


KNOWN_UNDER: dict[str, str] = {}
"""Cases whose phase totals the formula still under-counts (strict xfail: they fail loudly once fixed)."""


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("h200")


def _table(rows) -> str:
    return "\n".join(f"{r.phase:12s} {r.what:36s} formula {r.predicted:12.0f} trace {r.measured:12.0f} "
                     f"ratio {r.ratio if r.ratio is None else round(r.ratio, 4)}" for r in rows)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_UNDER[n], strict=True))
                                  if n in KNOWN_UNDER else n for n in CASES])
def test_fsdp2_trace(name, cluster):
    mover, knobs, lifetime, dtype = CASES[name]
    pf = PlanFile(model=ModelSpec(**{**MOE, **mover}), cluster=cluster, workload=Workload(seq_len=SEQ),
                  plan=Plan(stack="fsdp2", world_size=W, dtype=dtype, baseline=knobs))
    pred, samples, start, rows = trace_fsdp2(pf, grad_lifetime=lifetime, tolerance=FORMULA_VS_TRACE)
    assert all(s.peak_bytes > 0 for s in samples.values()), samples
    exact = [r for r in rows if r.what.startswith(("persistent", "optimizer_step"))]
    assert len(exact) == 2 and all(r.ok for r in exact), _table(rows)
    phases = [r for r in rows if r.what == "phase total"]
    assert len(phases) == len(pred.labels)
    assert all(r.predicted >= r.measured * (1 - FORMULA_VS_TRACE) for r in phases), _table(rows)
    agree = [r for r in phases if r.phase in AGREES.get(name, ())]
    assert len(agree) == len(AGREES.get(name, ()))
    assert all(r.predicted <= r.measured * (1 + FORMULA_VS_TRACE) for r in agree), _table(rows)
