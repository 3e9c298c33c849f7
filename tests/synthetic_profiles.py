"""Synthetic cluster profiles and small models for the time-model tests (no torch).

- ``flat_cluster``: the shipped H200 memory constants with curves that are exactly proportional
  (one GEMM rate, one attention rate, pure-bandwidth copies and collectives at every group size),
  so that the time model's FLOP and byte counts can be read back from its times in closed form.
- ``tiny_model``, ``ctx_of``: a small evenly-dividing MoE and a resolved ``Ctx`` of it.
- ``speed_candidates``, ``timed_step``: the step-time speed check's ``SPEED_CANDIDATES`` candidates
  and one timed evaluation (``SPEED_BUDGET_S``), on any profile.

Fixtures built on these live in the ``conftest.py`` files (``flat``: ``tests/unit/conftest.py``).
"""

from __future__ import annotations

import time

import numpy as np

from planner.budget.build import make_context
from planner.schema import ClusterSpec, ModelSpec, Plan, Workload
from planner.schema.io import load_cluster, load_model
from planner.search.evaluate import group_plan
from planner.search.space import composed_groups
from planner.timing import curves as C

GEMM_RATE = 400e12
"""FLOP/s of every GEMM in the flat profile."""
ATTN_RATE = 300e12
"""FLOP/s of causal attention (forward and backward conventions) in the flat profile."""
ADAMW_RATE = 1e11
"""Parameters/s of the fused GPU AdamW (so elementwise passes stream at 28 × 1e11 B/s)."""
H2D_BW, D2H_BW, BIDIR_BW = 50e9, 50e9, 40e9
"""Pinned copy bandwidths, bytes/s (bidirectional: each way)."""
COLL_BW = {"all_to_all": 100e9, "all_gather": 150e9, "reduce_scatter": 150e9, "p2p_ring": 200e9}
"""Collective bandwidths, bytes/s of ``size`` (the ``CollectiveCurves`` conventions)."""
CPU_S_PER_PARAM_1T = 4e-9
"""Fused CPU AdamW seconds per parameter at one thread (the flat profile measures it as
1/threads at 1, 2, 4, …, 256 threads)."""
EXACT = 1e-9
"""Relative tolerance of closed-form checks on the flat profile (floating-point rounding only)."""

PROV = {"device": "SYN GPU", "torch": "x", "cuda": "x", "nccl": "x", "date": "2026-11-29",
        "command": "synthetic", "gpus_on_machine": 8}
SIZES = [1, 1 << 50]


def _table(names, rate):
    axes = [[1, 1 << 40]] * len(names)
    grid = rate
    for _ in names:
        grid = [grid, grid]
    return {"axis_names": list(names), "axes": axes, "flops_per_s": grid, "status": "assumed"}


def _bw(bw, g=1):
    return C.bandwidth_curve(SIZES, [s / bw for s in SIZES], provenance=PROV, group_size=g).model_dump()


def flat_curves(*, h2d=H2D_BW, d2h=D2H_BW, bidir=BIDIR_BW, chunk=None, coll_groups=(2, 4, 8, 16, 32, 64),
                a2a_min_bytes=None) -> dict:
    """The flat profile's ``curves`` mapping (see the module docstring); ``a2a_min_bytes`` makes the
    all-to-all curves start there (smaller messages are gaps)."""
    coll = {}
    for name, bw in COLL_BW.items():
        sizes = SIZES if a2a_min_bytes is None or name != "all_to_all" else [a2a_min_bytes, 1 << 50]
        coll[name] = {g: C.bandwidth_curve(sizes, [s / bw for s in sizes], provenance=PROV, group_size=g).model_dump()
                      for g in coll_groups}
    out = {
        "gemm": _table(("m", "n", "k"), GEMM_RATE),
        "gemm_fp32": {**_table(("m", "n", "k"), GEMM_RATE / 8), "dtype": "fp32"},
        "attention_fwd": _table(("seq_len", "heads", "head_dim"), ATTN_RATE),
        "attention_bwd": _table(("seq_len", "heads", "head_dim"), ATTN_RATE),
        "h2d": _bw(h2d), "d2h": _bw(d2h), "bidir": _bw(bidir),
        "gpu_adamw": C.param_rate_curve(SIZES, [s / ADAMW_RATE for s in SIZES], provenance=PROV).model_dump(),
        "cpu_adamw": {"threads": [1 << i for i in range(9)],
                      "s_per_param": [CPU_S_PER_PARAM_1T / (1 << i) for i in range(9)],
                      "num_params": 1, "status": "assumed"},
        "collectives": coll,
    }
    if chunk is not None:
        out["chunk_count"] = {"num_chunks": list(chunk[0]), "time_s": list(chunk[1]), "status": "assumed"}
    return out


def flat_cluster(*, host_cores=128, host_bw=1e15, gpus_per_node=8, **curve_kw) -> ClusterSpec:
    """The shipped H200 profile's memory constants with the flat curves and a synthetic topology
    (host DRAM effectively unlimited unless ``host_bw`` says otherwise)."""
    base = load_cluster("h200").model_dump(mode="json")
    base["topology"].update(gpu_name="SYN GPU", host_cores=host_cores, host_mem_bw_bytes_per_s=host_bw,
                            gpus_per_node=gpus_per_node)
    base["curves"] = flat_curves(**curve_kw)
    return C.parse_cluster(base)


def tiny_model(**kw) -> ModelSpec:
    """A small MoE whose sizes divide evenly; every layer MoE, GQA, no windows."""
    base = dict(name="tiny-moe", num_layers=4, hidden_size=256, vocab_size=4096, num_heads=8, num_kv_heads=4,
                head_dim=32, num_experts=16, top_k=2, expert_ffn=128)
    base.update(kw)
    return ModelSpec(**base)


def ctx_of(model, cluster, *, W=8, S=8192, overrides=None, **plan):
    """A resolved ``Ctx``; ``plan`` keys go to ``ComposedKnobs`` (``stack='fsdp2'`` and baseline
    keys to ``BaselineKnobs``)."""
    stack = plan.pop("stack", "composed")
    routing = plan.pop("routing", "balanced")
    knobs = {"composed": plan} if stack == "composed" else {"baseline": plan}
    p = Plan(world_size=W, stack=stack, routing=routing, **knobs)
    return make_context(model, cluster, Workload(seq_len=S), p, overrides=overrides)


SPEED_BUDGET_S = 0.5
"""step_time on ``SPEED_CANDIDATES`` candidates must take well under the search's 2 s budget."""
SPEED_CANDIDATES = 10_000


def speed_candidates(cluster, n: int):
    """``n`` candidates of moe-667b's largest composed group at S = 1M on 64 GPUs, as one ``Ctx``."""
    m = load_model("moe-667b")
    wl = Workload(seq_len=1 << 20)
    g = max(composed_groups(m, wl, 64), key=lambda g: g.size)
    idx = np.arange(n) % g.size
    plan = group_plan(g, 64, "balanced", "guarantee", "bf16")
    return make_context(m, cluster, wl, plan, resolved=True, overrides={k: v[idx] for k, v in g.numeric.items()})


def timed_step(ctx, n: int) -> float:
    """Seconds of one ``step_time(ctx)`` over ``n`` candidates."""
    from planner.timing.step import step_time

    t0 = time.perf_counter()
    out = step_time(ctx)
    assert out.total_s.shape == (n,)
    return time.perf_counter() - t0
