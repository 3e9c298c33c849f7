"""The FSDP2 baseline's host floor and FSDP2 copy traffic (``planner.timing.baseline_host``,
``planner.timing.baseline._fsdp_comm``) on the shipped H200 profile with a synthetic
``baseline_host`` curve.

- without the curve: no ``host_exposed`` time, and the missing curve is listed;
- with it: each segment takes ``max(GPU, host)``: with host seconds above every segment's GPU
  seconds the step is exactly the rows' host seconds plus the dispatch's booked seconds;
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


def _without(cluster):
    """``cluster`` without its measured host curve (a profile calibrated before it existed)."""
    return _with(cluster, None)


def test_no_curve_no_floor(h200):
    st = step_time(_ctx(_without(h200)), micro_steps_override=1)
    assert float(st.breakdown.get("host_exposed", 0.0)) == 0.0
    assert any("baseline host time not measured" in a for a in st.assumed)


@pytest.mark.parametrize("ac", ["full", "selective", "none"])
def test_floor_is_max_of_gpu_and_host(h200, ac):
    """A synthetic row whose host seconds exceed every segment's GPU seconds: the step then takes
    exactly the host seconds outside the expert loops plus the dispatch (booked by the dispatch model) and
    the optimizer's GPU part where it is longer."""
    big = 5.0   # seconds: far above any GPU segment of this 2-layer step
    cl = _with(h200, _curve(ac=ac, layer_fwd_s={"moe": big}, layer_bwd_s={"moe": 2 * big}, head_s=big,
                            optimizer_s=big, embedding_s=big))
    ctx = _ctx(cl, ac=ac)
    st = step_time(ctx, micro_steps_override=1)
    base = step_time(_ctx(_without(h200), ac=ac), micro_steps_override=1)
    assert float(base.breakdown.get("host_exposed", 0.0)) == 0.0
    # the dispatch seconds of one layer, as the baseline books them
    from planner.timing.dispatch import moe_dispatch_s
    from planner.timing.regions import knobs, moe_profile
    lk = Lookups(cl)
    m = ctx.model
    op = moe_dispatch_s(lk, "ep", int(ctx.tokens_per_rank), m.num_experts, m.top_k, 1, 1, m.hidden_size, m.expert_ffn,
                        ctx.act_bytes, profile=moe_profile(ctx), knobs=knobs(ctx), comm=True)
    d_f = op["compute_fwd"] + op["elem_fwd"]
    d_r = {"full": d_f, "selective": op["elem_fwd"], "none": 0.0}[ac]
    d_b = d_r + op["compute_bwd"] + op["elem_bwd"]
    layers = m.num_layers * ((big + d_f) + (2 * big + d_b))
    # head, embedding and optimizer segments are host-bound too: each takes its host seconds (the
    # embedding's gradient reduce, at the end of backward, is not in its segment)
    _, r_emb = BL._fsdp_comm(lk, ctx, ctx.vocab_size * ctx.hidden_size, 0, np.asarray(1), np.asarray(1),
                             ctx.act_bytes, 1)
    want = layers + 3 * big + float(r_emb)
    assert float(st.total_s) == pytest.approx(want, rel=1e-6)
    assert float(st.components["host"]) == pytest.approx(float(st.breakdown["host_exposed"]), rel=REL)
    assert float(st.total_s) - float(base.total_s) == pytest.approx(float(st.breakdown["host_exposed"]), rel=REL)


def test_floor_adds_only_what_the_gpu_does_not_cover(h200):
    cl = _with(h200, _curve())
    st = step_time(_ctx(cl), micro_steps_override=1)
    base = step_time(_ctx(h200), micro_steps_override=1)
    extra = float(st.total_s) - float(base.total_s)
    upper = 2 * (HOST["layer_fwd_s"]["moe"] + HOST["layer_bwd_s"]["moe"]) + HOST["head_s"] + HOST["optimizer_s"] \
        + HOST["embedding_s"]
    assert 0 < extra <= upper


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


def test_the_shipped_profile_carries_the_measured_floor(h200):
    """The H200 profile holds the host seconds measured by ``calibration.step_host``; a short FSDP2
    step then books some of them and no longer lists the floor as not measured."""
    assert h200.curves.baseline_host is not None and h200.curves.baseline_host.status == "measured"
    st = step_time(_ctx(h200, S=4096), micro_steps_override=1)
    assert float(st.breakdown.get("host_exposed", 0.0)) > 0.0
    assert not any("baseline host time not measured" in a for a in st.assumed)
