"""The ``dispatch_kernels`` curve (``planner.schema.curves.DispatchKernelsCurve``): its conversion
from a ``calibration.dispatch_kernels`` run, its merge into a profile, and the rules of
``planner.timing.kernel_rates`` that read it (layout ratios, sustained factor, host loops)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_profiles import flat_cluster

from calibration import dispatch_kernels as bench
from calibration.merge import merge_data, read_measured
from planner.schema.curves import DispatchKernelsCurve
from planner.timing import kernel_rates as KR
from planner.timing.compute import gemm_s, hbm_bytes_per_s
from planner.timing.curves import parse_cluster
from planner.timing.lookups import Lookups

RUN = Path(__file__).resolve().parents[2] / "bench" / "results" / "calibration" / "dispatch_kernels.json"


def _with_curve(curve: dict):
    base = flat_cluster().model_dump(mode="json")
    prov = dict(curve["provenance"], device=base["topology"]["gpu_name"])
    base["curves"]["dispatch_kernels"] = dict(curve, provenance=prov)
    return parse_cluster(base)


@pytest.fixture(scope="module")
def run_doc() -> dict:
    if not RUN.exists():
        pytest.skip(f"{RUN.name} is not committed")
    return json.loads(RUN.read_text())


def test_conversion_keeps_the_run(run_doc, tmp_path):
    """Every kernel row becomes its class (ratio recomputed from bytes/s), provenance and host
    instance kept; the merge reads the JSON run directly."""
    frag = bench.fragment(run_doc)["curves"]["dispatch_kernels"]
    cv = DispatchKernelsCurve.model_validate(frag)
    assert cv.provenance.host_instance == run_doc["provenance"]["host_instance"] != ""
    assert len(cv.memory) == len(run_doc["memory"])
    for r in run_doc["memory"]:
        assert cv.memory[bench.CLASSES[r["kernel"]]].vs_reference == pytest.approx(r["vs_adamw_rate"], rel=1e-12)
    assert len(cv.gemm_layouts) == len(run_doc["gemm_layouts"])
    assert cv.sustained.continuous_s / cv.sustained.short_window_s == pytest.approx(run_doc["sustained"]["ratio"])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_doc))
    merged = merge_data({"curves": {}}, read_measured(path))
    assert merged["curves"]["dispatch_kernels"] == frag


def test_a_new_host_measurement_moves_every_width_curves_host_loops(run_doc):
    """A ``dispatch_kernels`` fragment alone gives each width curve its host loops (tiny rows: the
    same at every width), and nothing else of theirs; a fragment with its own widths is left as is."""
    frag = bench.fragment(run_doc)
    new = frag["curves"]["dispatch_kernels"]
    old = dict(new, host_loops={k: dict(v, s_per_block=2 * v["s_per_block"]) for k, v in new["host_loops"].items()},
               host_call_s=2 * new["host_call_s"], widths=dict(new["widths"], H=4096))
    merged = merge_data({"curves": {"dispatch_kernels_widths": [old, old]}}, frag)
    assert [w["host_loops"] for w in merged["curves"]["dispatch_kernels_widths"]] == [new["host_loops"]] * 2
    assert [w["host_call_s"] for w in merged["curves"]["dispatch_kernels_widths"]] == [new["host_call_s"]] * 2
    assert [w["widths"]["H"] for w in merged["curves"]["dispatch_kernels_widths"]] == [4096, 4096]
    both = {"curves": {**frag["curves"], "dispatch_kernels_widths": [old]}}
    assert merge_data({"curves": {"dispatch_kernels_widths": [new]}}, both)["curves"]["dispatch_kernels_widths"] == [old]


COVERAGE = RUN.parents[1] / "calibration" / "coverage" / "coverage.json"
"""The later coverage run (``bench/calibrate_coverage.py``): its shape-A width replaces the run above."""


def test_shipped_profile_carries_the_run(h200, run_doc):
    cv = h200.curves.dispatch_kernels
    doc = run_doc
    if COVERAGE.exists():
        cov = json.loads(COVERAGE.read_text())
        doc = next(w for w in cov["dispatch_widths"]["widths"]
                   if (w["shape"]["H"], w["shape"]["I"], w["shape"]["k"]) == (7168, 2048, 8))
        assert [c.widths["H"] for c in h200.curves.dispatch_kernels_widths] == \
            [w["shape"]["H"] for w in cov["dispatch_widths"]["widths"]]
    assert cv is not None and cv.provenance.host_instance == doc["provenance"]["host_instance"]
    assert cv.reference_bytes_per_s == doc["adamw_ref_bytes_per_s"]


def test_rules(run_doc):
    """Class rates = ratio × the profile's HBM rate; misaligned NN references are not used; the
    layout ratio is clamped outside the measured rows; the sustained factor runs from 1 at the short
    window to the measured ratio at the continuous run; host seconds per block as measured."""
    c = _with_curve(bench.fragment(run_doc)["curves"]["dispatch_kernels"])
    cv = c.curves.dispatch_kernels
    lk = Lookups(c, strict=True)
    rates = KR.class_rates(lk)
    assert rates["index_add_bf16"] == pytest.approx(cv.memory["index_add_bf16"].vs_reference * hbm_bytes_per_s(lk))
    aligned = [g for g in cv.gemm_layouts if g.role == "g_down" and g.k % 8 == 0]
    assert len(aligned) == 1 and len([g for g in cv.gemm_layouts if g.role == "g_down"]) == 3
    want = aligned[0].runtime_s / aligned[0].nn_s
    assert np.allclose(KR.layout_factor(lk, "g_down", np.array([64, 3277, 10**6]), 7168, 2048), want)
    gx = sorted((g.m, g.runtime_s / g.nn_s) for g in cv.gemm_layouts if g.role == "gx")
    assert KR.layout_factor(lk, "gx", gx[1][0], 7168, 2048) == pytest.approx(gx[1][1])
    assert KR.layout_factor(lk, "gx", 1, 7168, 2048) == pytest.approx(gx[0][1])
    assert KR.layout_factor(lk, "up", 1000, 7168, 2048) == 1.0
    s = cv.sustained
    f = KR.sustained_factor(lk, np.array([s.short_window_len_s / 10, s.short_window_len_s, s.continuous_len_s, 100.0]))
    t_table = float(gemm_s(lk, s.m, s.n, s.k))   # both read against the table's own time of that GEMM
    f0, f1 = s.short_window_s / t_table, s.continuous_s / t_table
    assert np.allclose(f, [f0, f0, f1, f1])
    mid = KR.sustained_factor(lk, np.sqrt(s.short_window_len_s * s.continuous_len_s))   # log-linear between
    assert float(mid) == pytest.approx((f0 + f1) / 2)
    t = KR.host_s(lk, 3, {"chunk_bwd": 2.0})
    assert t == pytest.approx(3 * cv.host_call_s + 2 * cv.host_loops["chunk_bwd"].s_per_block)


def test_without_the_curve_everything_falls_back():
    lk = Lookups(flat_cluster(), strict=True)
    assert KR.class_rates(lk) == {} and KR.sustained_factor(lk, 1.0) == 1.0
    assert KR.layout_factor(lk, "gx", 100, 64, 64) == 1.0
    assert any("no dispatch_kernels curve" in a for a in lk.assumed)


def test_forward_factor_reads_the_role_at_the_block_rows(run_doc):
    """Forward expert GEMMs: the measured runtime/table ratio of the role at the block rows, over
    the sustained GEMM's short-window ratio; the nearest measured rows outside."""
    c = _with_curve(bench.fragment(run_doc)["curves"]["dispatch_kernels"])
    cv, lk = c.curves.dispatch_kernels, Lookups(c, strict=True)
    s = cv.sustained
    f0 = s.short_window_s / float(gemm_s(lk, s.m, s.n, s.k))
    for role in KR.FORWARD_ROLES:
        pts = sorted((g.m, g.runtime_s / float(gemm_s(lk, g.m, g.n, g.k))) for g in cv.gemm_layouts if g.role == role)
        got = KR.forward_factor(lk, role, np.array([p[0] for p in pts] + [1, 10**7]))
        assert np.allclose(got, [p[1] / f0 for p in pts] + [pts[0][1] / f0, pts[-1][1] / f0])
    assert KR.forward_factor(lk, "gx", 1000) == 1.0


LOOP_H = 1e-4
"""Host seconds per block in the loop-pace cases (synthetic)."""


def test_loop_pace_follows_the_block_order():
    """A loop starting on an idle GPU: host-bound blocks early leave the GPU waiting even when the
    loop's GPU seconds exceed its host seconds; the same blocks after long ones are hidden."""
    h = LOOP_H
    assert float(KR.loop_exposed_s(h, [10 * h], [5])) == 0.0                        # GPU-bound: none
    assert float(KR.loop_exposed_s(h, [h / 4], [8])) == pytest.approx(8 * h - 8 * h / 4)  # host-bound: H − G
    small, big = [h / 4, 40 * h], [16, 1]                     # 16 small blocks, then one long block
    early = float(KR.loop_exposed_s(h, small, big))
    assert early == pytest.approx(16 * h - 16 * h / 4)        # the long block starts after 16 launches
    assert 16 * h / 4 + 40 * h > 17 * h                        # although the loop's GPU seconds exceed its host's
    assert float(KR.loop_exposed_s(h, small[::-1], big[::-1])) == 0.0   # long block first: hidden
    batch = KR.loop_exposed_s(h, np.array([[10 * h], [h / 4]]), np.array([[5], [8]]))  # vectorised over rows
    assert batch.shape == (2,) and batch[0] == 0.0 and batch[1] == pytest.approx(6 * h)


def test_plan_blocks_in_the_runtime_order():
    """``plan_loads`` lists a PipelinedLLEP rank's blocks slot by slot, each slot's full blocks then
    its remainder (``ExpertChunk``'s loop order), so the loop's host pace sees them in order."""
    from planner.plans.llep import LlepKnobs
    from planner.timing.dispatch import plan_loads

    N, E, k, E_p, K = 4096, 64, 2, 8, 4
    L = plan_loads("pipelined_llep", N, E, k, E_p, K, "95/16", LlepKnobs(1.0, 16, 1.3, 4))
    rows, cnt = L["rows"], L["cnt"]
    assert rows.shape[-1] % 2 == 0 and (cnt > 1).any()
    full, rem = rows[..., 0::2], rows[..., 1::2]               # per slot: full blocks, remainder
    br = full.max()
    assert set(np.unique(full)) <= {0, br} and (rem < br).all()
    slot_rows = full * cnt[..., 0::2] + rem * cnt[..., 1::2]
    assert (slot_rows.sum(-1) == L["recv"]).all()
