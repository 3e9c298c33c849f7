"""Curve schema, fits and lookups (``planner.schema.curves``, ``planner.timing.curves``).

Synthetic data with known answers: latency-bandwidth fits recover α and β; rate tables interpolate
exactly where the truth is multilinear in log2 of the axes; lookups raise ``ProfileGap`` outside
the measured range; bad profiles fail with one-line ``InvalidPlan``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import yaml

import planner.schema.curves as schema_curves
from planner.errors import InvalidPlan, ProfileGap
from planner.timing import compute
from planner.timing import curves as C

EXACT_REL_TOL = 1e-9
"""Noise-free synthetic data: the fit must recover α and β to rounding."""
NOISY_BETA_REL_TOL = 0.02
"""±1% multiplicative noise on 9 sizes: β within 2%."""
NOISY_ALPHA_ABS_TOL_S = 2e-6
"""±1% noise on a 10 µs latency: α within 2 µs."""
INTERP_REL_TOL = 1e-9
"""Interpolation of a table that is exactly multilinear in log2 of its axes."""

PROV = {"device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "nccl": "2.27.7", "date": "2026-11-29",
        "command": "python3 -m calibration --out x.yaml", "gpus_on_machine": 1}
SIZES = [1 << e for e in range(16, 33, 2)]  # 64 KiB .. 4 GiB


def _times(alpha, beta, sizes=SIZES):
    return [alpha + n / beta for n in sizes]


def _bw(alpha=10e-6, beta=50e9, **kw):
    return C.bandwidth_curve(SIZES, _times(alpha, beta), provenance=PROV, **kw)


def _memory():
    from planner.schema.cluster import MemoryConstants

    return {n: {"value": 0.5, "status": "assumed"} for n, f in MemoryConstants.model_fields.items()
            if n != "expandable_segments"}


def _cluster(curves: dict, gpu_name="NVIDIA H200") -> dict:
    return {"name": "t", "memory": _memory(), "curves": curves,
            "topology": {"gpu_name": gpu_name, "hbm_bytes": 1 << 37, "gpus_per_node": 8,
                         "host_ram_bytes": 1 << 41, "host_cores": 112, "host_mem_bw_bytes_per_s": 6e11}}


# ---------------------------------------------------------------------------------------------
# fits
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha,beta", [(10e-6, 50e9), (0.0, 400e9), (3e-3, 1e9)])
def test_fit_recovers_exact_alpha_beta(alpha, beta):
    a, b, res = C.fit_latency_rate(SIZES, _times(alpha, beta))
    assert a == pytest.approx(alpha, rel=EXACT_REL_TOL, abs=1e-15)
    assert b == pytest.approx(beta, rel=EXACT_REL_TOL)
    assert res < 1e-9


def test_fit_recovers_alpha_beta_under_noise():
    rng = np.random.default_rng(7)
    t = np.array(_times(10e-6, 44.1e9)) * (1 + rng.uniform(-0.01, 0.01, len(SIZES)))
    a, b, res = C.fit_latency_rate(SIZES, t)
    assert abs(a - 10e-6) < NOISY_ALPHA_ABS_TOL_S
    assert b == pytest.approx(44.1e9, rel=NOISY_BETA_REL_TOL)
    assert res < 0.03


def test_fit_keeps_latency_non_negative():
    """Data that a free fit would give a negative intercept: α is clamped at 0, β stays > 0."""
    t = [n / 50e9 - 1e-6 for n in SIZES[2:]]
    a, b, _ = C.fit_latency_rate(SIZES[2:], t)
    assert a == 0.0 and b > 0


def test_fit_rejects_flat_or_short_data():
    with pytest.raises(InvalidPlan, match="must grow with size"):
        C.fit_latency_rate([1, 2, 3], [1.0, 0.5, 0.25])
    with pytest.raises(InvalidPlan, match="≥ 2 points"):
        C.fit_latency_rate([1], [1.0])


# ---------------------------------------------------------------------------------------------
# host optimizer tables (``planner.timing.curves``)
# ---------------------------------------------------------------------------------------------
def test_cpu_adamw_lookup():
    cpu = C.CpuAdamWTable(threads=[1, 2, 4, 16], s_per_param=[2e-9, 1.1e-9, 0.6e-9, 0.229e-9],
                          num_params=1 << 25, provenance=PROV)
    curves = C.Curves(cpu_adamw=cpu)
    assert C.cpu_adamw_time_s(curves, 10**9, 16) == pytest.approx(0.229)
    assert C.cpu_adamw_time_s(curves, 10**9, 3) == pytest.approx(10**9 * 0.85e-9)  # linear in threads
    assert C.cpu_adamw_time_s(curves, 0, 2) == 0.0                                   # zero work is free
    with pytest.raises(ProfileGap, match="threads"):
        C.cpu_adamw_time_s(curves, 10**9, 32)
    with pytest.raises(ProfileGap, match="num_params"):
        C.cpu_adamw_time_s(curves, 1000, 4)  # could run from cache: not what was measured
    with pytest.raises(ProfileGap, match="the profile has no cpu_cast curve; fix: run `planner calibrate`"):
        C.cpu_cast_time_s(curves, 10**9, 4)   # not measured


def test_a_host_table_measured_at_1e9_times_any_shard_from_the_floor_and_lists_the_rule():
    """The shipped tables are measured at 10^9 parameters; a shard of 8.6·10^8 (olmoe-1b-7b's
    CPUOffloadAdamW candidates) is timed at the measured per-parameter cost, listed as assumed,
    not dropped as a time-model gap; below ``HOST_TABLE_FLOOR_PARAMS`` it is a gap."""
    from planner.schema.profiles import load_cluster
    from planner.timing.lookups import Lookups
    from planner.timing.offload import host_adamw_s

    h200 = load_cluster("h200")
    table = h200.curves.cpu_adamw
    assert table.num_params == 10**9 and C.HOST_TABLE_FLOOR_PARAMS < 8.6e8
    lk = Lookups(h200, strict=True)
    t = host_adamw_s(lk, 8.6e8, 16, casts=True)
    assert t == pytest.approx(8.6e8 * (table.s_per_param[-1] + h200.curves.cpu_cast.s_per_param[-1]), rel=1e-9)
    assert [a.split(":")[0] for a in lk.assumed if "measured per-parameter cost" in a] == ["cpu_adamw", "cpu_cast"]
    lk = Lookups(h200, strict=True)
    host_adamw_s(lk, 2e9, 16, casts=False)
    assert not any("measured per-parameter cost" in a for a in lk.assumed)
    with pytest.raises(ProfileGap, match="cpu_adamw.num_params has no measurement at 1e\\+06"):
        host_adamw_s(Lookups(h200, strict=True), 1e6, 16, casts=False)


def test_a_missing_curve_of_a_cpu_profile_says_a_gpu_is_needed():
    from planner.schema.profiles import load_cluster
    from planner.timing.lookups import Lookups

    h200 = load_cluster("h200")
    cpu = h200.model_copy(update={"topology": h200.topology.model_copy(update={"gpu_name": "cpu"}),
                                  "curves": C.Curves()})
    for cluster, fix in ((cpu, "this profile was calibrated without a GPU; run `planner calibrate` on a GPU of "
                               "the cluster"),
                         (h200.model_copy(update={"curves": C.Curves()}), "run `planner calibrate` on this cluster")):
        lk = Lookups(cluster)
        assert lk.required("attention_fwd") is None
        assert lk.gaps == [f"the profile has no attention_fwd curve; fix: {fix}"]


# ---------------------------------------------------------------------------------------------
# rate tables (``planner.timing.compute``: what the time model reads)
# ---------------------------------------------------------------------------------------------
M, N, K = [64, 256, 1024, 4096], [512, 2048, 8192], [256, 1024, 4096]


def _loglin(m, n, k):
    """A rate that is exactly multilinear in (log2 m, log2 n, log2 k)."""
    lm, ln, lk = np.log2(m), np.log2(n), np.log2(k)
    return 1e12 * (50 + 3 * lm + 2 * ln + lk + 0.5 * lm * ln + 0.1 * lm * ln * lk)


def _gemm_table(fn=_loglin):
    vals = [[[float(fn(m, n, k)) for k in K] for n in N] for m in M]
    return C.RateTable(axis_names=["m", "n", "k"], axes=[M, N, K], flops_per_s=vals, provenance=PROV)


def test_table_interpolation_exact_for_multilinear_truth():
    t = _gemm_table()
    for m, n, k in [(100, 700, 300), (3000, 8000, 4000), (64, 512, 256), (4096, 8192, 4096)]:
        assert compute.table_rate(t, "gemm", m, n, k) == pytest.approx(_loglin(m, n, k), rel=INTERP_REL_TOL)


def test_table_keeps_non_monotone_dips():
    """Wave quantisation: a measured dip is reproduced at its point, not smoothed away."""
    def dip(m, n, k):
        return 5e14 if (m, n, k) == (1024, 2048, 1024) else 7e14
    t = _gemm_table(dip)
    assert compute.table_rate(t, "gemm", 1024, 2048, 1024) == pytest.approx(5e14)
    # halfway (in log2 m) between the dip and its neighbour at m = 4096
    assert compute.table_rate(t, "gemm", 2048, 2048, 1024) == pytest.approx(6e14)


def test_table_profile_gap_names_axis():
    t = _gemm_table()
    with pytest.raises(ProfileGap, match=r"gemm\.m .*65536"):
        compute.table_rate(t, "gemm", 65536, 512, 256)
    with pytest.raises(ProfileGap, match=r"gemm\.k"):
        compute.table_rate(t, "gemm", 64, 512, 16)
    with pytest.raises(ProfileGap):
        compute.table_rate(t, "gemm", -5, 2048, 1024)


def test_vectorised_table_lookup_matches_scalar():
    t = _gemm_table()
    m = np.array([64, 100, 777, 4096])
    got = compute.table_rate(t, "gemm", m, 2048, 1000)
    assert np.allclose(got, [compute.table_rate(t, "gemm", int(v), 2048, 1000) for v in m], rtol=1e-12)
    assert compute.table_rate(t, "gemm", 0, 2048, 1000) == compute.table_rate(t, "gemm", 64, 2048, 1000)


def _attn_table(rate):
    S, H, D = [1024, 4096, 16384], [1, 8, 64], [64, 128]
    vals = [[[rate for _ in D] for _ in H] for _ in S]
    return C.RateTable(axis_names=["seq_len", "heads", "head_dim"], axes=[S, H, D], flops_per_s=vals,
                       provenance=PROV)


def test_attention_lookup_and_quadratic_rule():
    fwd, bwd = _attn_table(4e14), _attn_table(3e14)
    t_f = compute.attention_time_s(fwd, "attention_fwd", 8192, 8, 128, backward=False)
    assert t_f == pytest.approx(2 * 8192**2 * 8 * 128 / 4e14)
    assert compute.attention_time_s(bwd, "attention_bwd", 8192, 8, 128, backward=True) == pytest.approx(
        5 * 8192**2 * 8 * 128 / 3e14)
    t_max = compute.attention_time_s(fwd, "attention_fwd", 16384, 8, 128, backward=False)
    assert compute.attention_time_s(fwd, "attention_fwd", 65536, 8, 128, backward=False) == pytest.approx(16 * t_max)
    assert compute.attention_time_s(fwd, "attention_fwd", 0, 8, 128, backward=False) == 0.0
    with pytest.raises(ProfileGap, match="head_dim"):
        compute.attention_time_s(fwd, "attention_fwd", 8192, 8, 192, backward=False)
    with pytest.raises(ProfileGap, match="seq_len"):
        compute.attention_time_s(fwd, "attention_fwd", 512, 8, 128, backward=False)


# ---------------------------------------------------------------------------------------------
# validation: one-line InvalidPlan
# ---------------------------------------------------------------------------------------------
def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_non_monotone_bandwidth_curve_rejected():
    good = _bw().model_dump(mode="json")
    bad = dict(good, time_s=list(good["time_s"]))
    bad["time_s"][5] = bad["time_s"][4] * 0.8  # 20% faster with 4x the bytes
    with pytest.raises(InvalidPlan, match=r"curves\.h2d.*must not decrease") as err:
        C.parse_curves({"h2d": bad})
    _one_line(err)


def test_noise_within_tolerance_accepted():
    good = _bw().model_dump(mode="json")
    t = list(good["time_s"])
    t[1] = t[0] * (1 - 0.5 * C.MONOTONE_NOISE_FRACTION)  # latency-bound noise, below tolerance
    C.parse_curves({"h2d": dict(good, time_s=t)})


def test_missing_field_rejected():
    data = _bw().model_dump(mode="json")
    del data["time_s"]
    with pytest.raises(InvalidPlan, match=r"curves\.h2d\.time_s \(none given\) is missing") as err:
        C.parse_curves({"h2d": data})
    _one_line(err)
    data = _bw().model_dump(mode="json")
    data["provenance"] = None
    with pytest.raises(InvalidPlan, match="provenance") as err:
        C.parse_curves({"d2h": data})
    _one_line(err)


def test_mismatched_device_rejected():
    data = _cluster({"h2d": _bw().model_dump(mode="json")}, gpu_name="NVIDIA H100 80GB HBM3")
    with pytest.raises(InvalidPlan, match=r"curves\.h2d\.provenance\.device .*must equal topology\.gpu_name") as err:
        C.parse_cluster(data)
    _one_line(err)
    coll = {"all_gather": {2: _bw(group_size=2).model_dump(mode="json")}}
    with pytest.raises(InvalidPlan, match=r"collectives\.all_gather\.2\.provenance\.device"):
        C.parse_curves({"collectives": coll}, gpu_name="cpu")


def test_bad_tables_rejected():
    t = _gemm_table().model_dump(mode="json")
    with pytest.raises(InvalidPlan, match="full grid"):
        C.parse_curves({"gemm": dict(t, flops_per_s=t["flops_per_s"][:-1])})
    with pytest.raises(InvalidPlan, match="axis_names must be"):
        C.parse_curves({"gemm": dict(t, axis_names=["n", "m", "k"])})
    with pytest.raises(InvalidPlan, match="strictly increasing"):
        C.parse_curves({"gemm": dict(t, axes=[M[::-1], N, K])})
    c = _bw(group_size=2).model_dump(mode="json")
    with pytest.raises(InvalidPlan, match="keyed by its group_size"):
        C.parse_curves({"collectives": {"all_to_all": {4: c}}})


def test_profile_round_trip_through_yaml():
    curves = {"h2d": _bw().model_dump(mode="json"), "gemm": _gemm_table().model_dump(mode="json"),
              "collectives": {"p2p_ring": {2: _bw(group_size=2).model_dump(mode="json")}}}
    spec = C.parse_cluster(_cluster(curves))
    again = C.parse_cluster(yaml.safe_load(yaml.safe_dump(spec.model_dump(mode="json"))))
    assert again == spec
    ring = again.curves.collectives.p2p_ring[2]
    assert (ring.latency_s, ring.bytes_per_s) == pytest.approx((10e-6, 50e9), rel=1e-6)


CURVE_MODELS = [obj for _, obj in inspect.getmembers(schema_curves, inspect.isclass)
                if obj.__module__ == schema_curves.__name__]


@pytest.mark.parametrize("cls", CURVE_MODELS, ids=lambda c: c.__name__)
def test_curve_models_frozen_forbid_documented(cls):
    cfg = cls.model_config
    assert cfg.get("frozen") is True and cfg.get("extra") == "forbid"
    assert not [n for n, f in cls.model_fields.items() if not f.description]
