"""The chunk-count curve measured on an emulated ``E_p = 8`` rank (``planner calibrate`` on one GPU
since ``pipelined_llep_calibration.EMULATED_EXPERT_PARALLEL``): its replay is GPU-bound where the
``E_p = 1`` curve's is host-bound, and the committed H100 measurement repeats on its instance."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.io import read_yaml
from planner.schema.profiles import load_cluster
from planner.timing import chunk_curve
from planner.timing import dispatch as D
from planner.timing.lookups import Lookups

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
EP8_RUN = RESULTS / "calibration" / "chunk_ep8_h100_d4d3ef6b" / "chunk_count.yaml"
SAME_INSTANCE_RUN = RESULTS / "dispatch_same_instance" / "h100_d4d3ef6b" / "measured.yaml"
REPEAT_TOL = 0.01
"""Two calibrations of the E_p = 8 curve minutes apart on one instance agree this closely at the
GPU-bound points (K ≤ ``GPU_BOUND_K``)."""
GPU_BOUND_K = 10
SHAPE_A = dict(tokens_per_rank=65536, hidden_size=7168, expert_ffn=2048, num_experts=128, top_k=8)


@pytest.mark.parametrize("profile", ["h200", "h100"])
def test_the_emulated_configuration_replays_gpu_bound(profile):
    lk = Lookups(load_cluster(profile), strict=False)
    for K in (1, 2, 3, 5, 10):
        op8, _, host8 = D._curve_replay(lk, K, dict(SHAPE_A, expert_parallel=8))
        assert host8 <= chunk_curve.HOST_BOUND_SHARE * op8, (profile, K, host8 / op8)
    op1, _, host1 = D._curve_replay(lk, 10, dict(SHAPE_A, expert_parallel=1))
    assert host1 > chunk_curve.HOST_BOUND_SHARE * op1, "at E_p = 1 the K = 10 point is host-bound"


def test_the_emulated_curve_repeats_on_its_instance():
    a, b = (read_yaml(p)["curves"]["chunk_count"] for p in (EP8_RUN, SAME_INSTANCE_RUN))
    assert a["shape"] == b["shape"] and a["shape"]["expert_parallel"] == 8
    assert a["provenance"]["host_instance"] == b["provenance"]["host_instance"]
    assert a["fill_bytes"] == b["fill_bytes"] and min(a["fill_bytes"]) > 0
    for K, ta, tb in zip(a["num_chunks"], a["time_s"], b["time_s"]):
        if K <= GPU_BOUND_K:
            assert abs(ta / tb - 1) <= REPEAT_TOL, (K, ta, tb)


COVERAGE_RUN = RESULTS / "calibration" / "chunk_ep8_h100_d4d3ef6b" / "coverage_chunk_curves.json"
CHUNK_TARGET = 5 / 6
"""Held-out chunk-curve points within ``HELDOUT_TOL`` (the issue's target: at least 5 of 6)."""


def test_heldout_shape_b_on_its_instance():
    """The E_p = 8 curve at shape B (``bench/calibrate_coverage.py --sections chunk_curves``, same
    instance), predicted with the instance's calibration, whose φ was measured at shape A."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from heldout_gaps import CHUNK_B_EP8
    from test_heldout_dispatch_instance import instance_profile
    from test_heldout_timing import chunk_count_cases, compare, within

    curves = json.loads(COVERAGE_RUN.read_text())["chunk_curves"]["curves"]
    cluster = instance_profile("h100_d4d3ef6b")
    cases = chunk_count_cases(cluster, curves["B"], " [B]")
    bad, table = compare(cases, {"chunk-count curve [B] N=32768 H=4096 K=5 (E_p=8) fwd+bwd": CHUNK_B_EP8})
    ok, n = within(cases)
    print(table)
    assert n == 6 and ok >= CHUNK_TARGET * n, table
    assert not bad, table
    own = chunk_count_cases(cluster, curves["A"], " [A]")
    assert not any(c.held_out for c in own), "shape A is the calibration curve's own shape"


def test_a_curve_too_small_to_time_the_operator_is_left_out_not_negative(tmp_path):
    """A profile whose chunk-count curve measured less than its replay's router and fills (a smoke
    calibration's tiny shape) gives no negative φ: its points are left out and listed, and the step
    is priced with φ = 1 (a profile that validates never makes an internal error)."""
    import math

    from planner.api import check

    data = load_cluster("h200").model_dump(mode="json")
    cc = data["curves"]["chunk_count"]
    cc["time_s"] = [1e-9] * len(cc["num_chunks"])
    from calibration.io import write_yaml_atomic

    write_yaml_atomic(tmp_path / "tiny_curve.yaml", data)
    rep = check(model="qwen3-30b-a3b", cluster=str(tmp_path / "tiny_curve.yaml"), gpus=8, seq_len=32768)
    step = rep.to_json()
    assert step["step_s"] is not None and math.isfinite(step["step_s"]) and step["step_s"] > 0
    assert any("left out of φ(K)" in a and "not positive" in a for a in step["step_assumed"])
    assert any("from the operator replay alone" in a for a in step["step_assumed"])
