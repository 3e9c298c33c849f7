"""The FSDP2 baseline's host time and FSDP2 copy traffic (``planner.timing.baseline_host``,
``planner.timing.baseline._fsdp_comm``) on the shipped H200 profile with a synthetic
``baseline_host`` curve.

- without the curve: no host time, and the missing curve is listed;
- with it: every segment takes GPU + host seconds (hand-summed: the rows' seconds outside the
  loops, one block per expert and pass at the dispatch bench's seconds per block, the dispatch's
  own exposed launch time taken out of its GPU seconds); a tiny host time still adds;
- the loops' launches are counted one block per local expert and pass;
- seconds per launch from counted launches; a row without counts is listed;
- without the dispatch curve the loops take the row's in-step seconds per block, listed;
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


def test_no_curve_no_host_time(h200):
    st = step_time(_ctx(_without(h200)), micro_steps_override=1)
    assert float(st.breakdown.get("host_exposed", 0.0)) == 0.0
    assert any("baseline host time not measured" in a for a in st.assumed)


@pytest.mark.parametrize("ac", ["full", "selective", "none"])
def test_host_outside_the_loops_adds_to_the_gpu(h200, ac):
    """Every segment takes GPU seconds + the host seconds outside the expert loops: the step is the
    GPU-only step (no curve) plus, per layer, the row's seconds outside the loops, and the head's,
    optimizer's and embedding's. The loops' host time is the dispatch model's (each block paced at
    the slower of host and GPU), so it is the same with and without the curve."""
    cl = _with(h200, _curve(ac=ac))
    ctx = _ctx(cl, ac=ac)
    st = step_time(ctx, micro_steps_override=1)
    base = step_time(_ctx(_without(h200), ac=ac), micro_steps_override=1)
    assert float(base.breakdown.get("host_exposed", 0.0)) == 0.0
    m = ctx.model
    per_layer = HOST["layer_fwd_s"]["moe"] + HOST["layer_bwd_s"]["moe"]
    host = m.num_layers * per_layer + HOST["head_s"] + HOST["optimizer_s"] + HOST["embedding_s"]
    assert float(st.components["host"]) == pytest.approx(host, rel=REL)
    assert float(st.total_s) == pytest.approx(float(base.total_s) + host, rel=REL)


def test_host_is_never_hidden_behind_the_gpu(h200):
    """Unlike a floor, a host time far below the GPU time still adds: ``segment = GPU + host``."""
    cl = _with(h200, _curve(scale=1e-3))
    st = step_time(_ctx(cl, S=65536), micro_steps_override=1)
    outside = 1e-3 * (2 * (HOST["layer_fwd_s"]["moe"] + HOST["layer_bwd_s"]["moe"]) + HOST["head_s"]
                      + HOST["optimizer_s"] + HOST["embedding_s"])
    assert float(st.breakdown["host_exposed"]) == pytest.approx(outside, rel=REL)


@pytest.mark.parametrize("ac", ["full", "selective", "none"])
def test_loop_launch_count(ac):
    """One block per local expert and pass, ``LOOP_LAUNCH`` launches per block and the backward's two
    gradient zero-fills; a dense layer none."""
    got = BH.loop_launches("moe", ac, 128)
    rec = BH.RECOMPUTES_LOOP[ac]
    assert float(got["fwd"]) == 128 * 4
    assert float(got["bwd"]) == 128 * (4 * rec + 11) + 2
    assert {k: float(v) for k, v in BH.loop_launches("dense", ac, 128).items()} == {"fwd": 0.0, "bwd": 0.0}


def test_seconds_per_launch_from_counted_launches(h200):
    """A row with counted launches prices each launch at the phase's seconds ÷ its launches; without
    them the phase seconds stand and the missing count is listed."""
    counted = _curve(launches={"layer_fwd:moe": 100, "layer_bwd:moe": 250, "head": 30, "optimizer": 7,
                               "embedding": 20}).rows[0]
    assert BH.per_launch_s(counted, "layer_fwd", "moe") == pytest.approx(HOST["layer_fwd_s"]["moe"] / 100, rel=REL)
    assert BH.per_launch_s(counted, "optimizer") == pytest.approx(HOST["optimizer_s"] / 7, rel=REL)
    assert BH.per_launch_s(_curve().rows[0], "head") is None
    st = step_time(_ctx(_with(h200, _curve())), micro_steps_override=1)
    assert any("launches per phase not counted" in a for a in st.assumed)
    st = step_time(_ctx(_with(h200, _curve(launches=dict(counted.launches)))), micro_steps_override=1)
    assert not any("launches per phase not counted" in a for a in st.assumed)


def test_layer_host_is_outside_the_loops_only(h200):
    """``layer`` gives the row's seconds outside the loops, whatever the loops' per-block seconds."""
    row = _with(h200, _curve()).curves.baseline_host.rows[0]
    assert BH.layer(row, "moe") == pytest.approx((HOST["layer_fwd_s"]["moe"], HOST["layer_bwd_s"]["moe"]), rel=REL)


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


def test_the_shipped_profile_carries_the_measured_host(h200):
    """The H200 profile holds the host seconds measured by ``calibration.step_host``; a short FSDP2
    step then books them and no longer lists the host time as not measured."""
    assert h200.curves.baseline_host is not None and h200.curves.baseline_host.status == "measured"
    st = step_time(_ctx(h200, S=4096), micro_steps_override=1)
    assert float(st.breakdown.get("host_exposed", 0.0)) > 0.0
    assert not any("baseline host time not measured" in a for a in st.assumed)
