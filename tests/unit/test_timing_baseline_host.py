"""The FSDP2 baseline's host floor and FSDP2 copy traffic (``planner.timing.baseline_host``,
``planner.timing.baseline._fsdp_comm``) on the shipped H200 profile with a synthetic
``baseline_host`` curve.

- without the curve: no ``host_exposed`` time, and the missing curve is listed;
- with it: each phase takes ``max(GPU, host)``: the exposed host time equals the floors computed
  by hand from the row and the dispatch curve's loop seconds, minus the phases' GPU seconds;
- a host time far below the GPU time adds nothing (a long step is GPU-bound);
- an unmeasured model takes the nearest measured structure, listed;
- the FSDP2 copies at W = 1: a unit's gather is exactly its cast/copy-in/copy-out bytes at the HBM rate.
"""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_profiles import ctx_of

from planner.schema.curves import BaselineHostCurve
from planner.schema.io import load_model
from planner.timing import baseline as BL
from planner.timing import baseline_host as BH
from planner.timing import kernel_rates as KR
from planner.timing.compute import Lookups, hbm_bytes_per_s
from planner.timing.step import step_time

REL = 1e-9
"""Hand-computed sums equal the model's up to rounding."""
HOST = dict(layer_fwd_s={"moe": 0.01, "dense": 0.004}, layer_bwd_s={"moe": 0.02, "dense": 0.008}, head_s=0.003,
            optimizer_s=0.004, embedding_s=0.002)


def _curve(model="qwen3-30b-a3b", ac="full", scale=1.0, **kw):
    h = {k: ({kk: vv * scale for kk, vv in v.items()} if isinstance(v, dict) else v * scale) for k, v in HOST.items()}
    row = dict(model=model, ac=ac, tokens=2048, attention="gqa", num_experts=128, top_k=8,
               loop_fwd_s_per_block=1e-4, loop_bwd_s_per_block=2e-4, **h)
    row.update(kw)
    return BaselineHostCurve(status="assumed", note="test", rows=[row])


def _with(cluster, curve):
    return cluster.model_copy(update={"curves": cluster.curves.model_copy(update={"baseline_host": curve})})


def _ctx(cluster, name="qwen3-30b-a3b", S=4096, ac="full"):
    m = load_model(name).model_copy(update={"num_layers": 2})
    return ctx_of(m, cluster, W=1, S=S, stack="fsdp2", ac=ac)


def test_no_curve_no_floor(h200):
    st = step_time(_ctx(h200), micro_steps_override=1)
    assert float(st.breakdown.get("host_exposed", 0.0)) == 0.0
    assert any("baseline host time not measured" in a for a in st.assumed)


@pytest.mark.parametrize("ac", ["full", "none"])
def test_floor_is_max_of_gpu_and_host(h200, ac):
    base = step_time(_ctx(h200, ac=ac), micro_steps_override=1)
    cl = _with(h200, _curve(ac=ac))
    st = step_time(_ctx(cl, ac=ac), micro_steps_override=1)
    lk = Lookups(cl)
    E = 128
    loop_f = float(KR.host_s(lk, 0.0, {"grouped_fwd": E}))
    loop_b = float(KR.host_s(lk, 0.0, {"grouped_fwd": E * BH.RECOMPUTES_LOOP[ac], "grouped_bwd": E}))
    host_f, host_b = HOST["layer_fwd_s"]["moe"] + loop_f, HOST["layer_bwd_s"]["moe"] + loop_b
    # the phases' GPU seconds, from the step without the floor (same booking otherwise)
    gpu = {k: float(v) for k, v in base.breakdown.items()}
    assert gpu.get("host_exposed", 0.0) == 0.0
    assert float(st.total_s) > float(base.total_s)
    assert float(st.total_s) - float(base.total_s) == pytest.approx(float(st.breakdown["host_exposed"]), rel=REL)
    # a floor never exceeds the host seconds it stands for
    upper = 2 * (host_f + host_b) + HOST["head_s"] + HOST["optimizer_s"] + HOST["embedding_s"]
    assert float(st.breakdown["host_exposed"]) <= upper
    assert float(st.total_s) >= upper   # the whole step cannot be shorter than its host time
    assert float(st.components["host"]) == pytest.approx(float(st.breakdown["host_exposed"]), rel=REL)


def test_long_step_is_gpu_bound(h200):
    cl = _with(h200, _curve(scale=1e-3))
    st = step_time(_ctx(cl, S=65536), micro_steps_override=1)
    assert float(st.breakdown["host_exposed"]) == 0.0


def test_nearest_structure_is_listed(h200):
    cl = _with(h200, _curve(model="some-other-model"))
    st = step_time(_ctx(cl, name="gpt-oss-20b"), micro_steps_override=1)
    assert any("not measured: the nearest measured structure (some-other-model" in a for a in st.assumed)
    assert float(st.breakdown["host_exposed"]) > 0


@pytest.mark.parametrize("lifetime", ["freed", "accumulate"])
def test_fsdp_copies_at_one_rank(h200, lifetime):
    import dataclasses

    ctx = dataclasses.replace(_ctx(h200), grad_lifetime=lifetime)
    lk = Lookups(h200)
    p_dense, p_exp = 1.0e7, 3.0e8
    g, r = BL._fsdp_comm(lk, ctx, p_dense, p_exp, np.asarray(1), np.asarray(1), 2, 1)
    hbm = hbm_bytes_per_s(lk)
    want_g = (BL.GATHER_SHARD_BYTES + BL.GATHER_FULL_BYTES) * (p_dense + p_exp) / hbm
    acc = BL.GRAD_ACCUMULATE_BYTES if lifetime == "accumulate" else 0
    want_r = (BL.REDUCE_FULL_BYTES + BL.REDUCE_SOLO_BYTES + acc) * (p_dense + p_exp) / hbm
    assert float(g) == pytest.approx(want_g, rel=REL)
    assert float(r) == pytest.approx(want_r, rel=REL)
