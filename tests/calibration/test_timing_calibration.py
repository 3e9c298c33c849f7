"""The fp32 GEMM rate table of the calibration (``calibration.compute.gemm_fp32_table``): the rate
of the fp32 vocabulary heads, TF32 off, and its fragment that ``calibration.merge`` folds in."""

from __future__ import annotations

import pytest
import torch
import yaml

from calibration import compute, config
from calibration.merge import merge_data
from planner.errors import InvalidPlan
from planner.runtime.measure import provenance
from planner.timing import curves as C
from planner.timing.compute import Lookups, gemm_s


def test_fp32_table_on_the_smoke_grid_restores_tf32():
    before = compute.tf32_state()
    seen = []
    t = compute.gemm_fp32_table(config.SMOKE, torch.device("cpu"), provenance("pytest"),
                                lambda n: seen.append(compute.tf32_state()))
    assert compute.tf32_state() == before and seen and all(v in ("ieee", False) for v in seen)
    g = config.SMOKE
    assert t.dtype == "fp32" and t.axes == [list(g.gemm_fp32_m), list(g.gemm_fp32_n), list(g.gemm_fp32_k)]
    assert compute.counts(g)["gemm_fp32"] == len(g.gemm_fp32_m) * len(g.gemm_fp32_n) * len(g.gemm_fp32_k)


def test_full_grid_covers_the_vocab_strips_within_budget():
    """FULL: m 1k..16k, n 2k..32k, k 1k..16k (larger strips by blocks); ≤ 30 s at 40 TFLOP/s fp32
    counting five calls per point (warm-up, sizing, three windows)."""
    g = config.FULL
    flops = 5 * 2.0 * sum(g.gemm_fp32_m) * sum(g.gemm_fp32_n) * sum(g.gemm_fp32_k)
    assert flops / 40e12 < 30
    assert min(g.gemm_fp32_m) <= 1024 and max(g.gemm_fp32_n) >= 32768 and max(g.gemm_fp32_k) >= 8192
    assert config.CPU.gemm_fp32_m == ()  # the CPU quick profile's own GEMM table is fp32 already


def test_fragment_merges_and_feeds_the_time_model(tmp_path, cpu_profile):
    out = tmp_path / "frag.yaml"
    assert compute.main(["--fp32-gemm", "--smoke", "--out", str(out)]) == 0
    frag = yaml.safe_load(out.read_text())
    assert list(frag["curves"]) == ["gemm_fp32"]
    merged = C.parse_cluster(merge_data(cpu_profile.model_dump(mode="json"), frag))
    assert merged.curves.gemm_fp32.dtype == "fp32"
    assert gemm_s(Lookups(merged, strict=True), 48, 48, 48, dtype="fp32") > 0
    bad = dict(frag)
    bad["curves"] = {"gemm_fp32": {**frag["curves"]["gemm_fp32"], "dtype": "bf16"}}
    with pytest.raises(InvalidPlan, match="gemm_fp32.dtype must be fp32"):
        C.parse_cluster(merge_data(cpu_profile.model_dump(mode="json"), bad))


def test_merged_reads_paths_and_mappings_in_order(tmp_path, cpu_profile):
    from calibration.merge import merged

    out = tmp_path / "frag.yaml"
    assert compute.main(["--fp32-gemm", "--smoke", "--out", str(out)]) == 0
    frag = yaml.safe_load(out.read_text())
    base = cpu_profile.model_dump(mode="json")
    assert merged(base, [out]) == merged(base, [frag]) == C.parse_cluster(merge_data(base, frag))
    later = {"curves": {"gemm_fp32": {**frag["curves"]["gemm_fp32"], "note": "the later file"}}}
    assert merged(base, [out, later]).curves.gemm_fp32.note == "the later file"
    assert merged(base, []) == cpu_profile


def test_a_whole_calibration_keeps_the_profiles_width_curves():
    """A whole profile from ``python -m calibration`` carries ``dispatch_kernels_widths: []`` when the
    widths were not measured (here the H200 same-instance run's ``measured.yaml``): merged into the
    shipped profile, the profile's width curves stay and take the new host loops; the sections it
    measured replace the profile's."""
    from pathlib import Path

    from calibration.io import read_yaml
    from calibration.merge import merged
    from planner.schema.profiles import load_cluster

    run = Path(__file__).resolve().parents[2] / "bench/results/dispatch_same_instance/h200_dec975e8/measured.yaml"
    measured = read_yaml(run)
    assert measured["curves"]["dispatch_kernels_widths"] == []
    shipped = load_cluster("h200")
    out = merged(shipped.model_dump(mode="json"), [run])
    assert len(out.curves.dispatch_kernels_widths) == len(shipped.curves.dispatch_kernels_widths) > 0
    new_loops = out.curves.dispatch_kernels.host_loops
    assert new_loops != shipped.curves.dispatch_kernels.host_loops
    assert all(w.host_loops == new_loops for w in out.curves.dispatch_kernels_widths)
    assert list(out.curves.chunk_count.time_s) == measured["curves"]["chunk_count"]["time_s"]
    assert out.curves.gemm == shipped.curves.gemm   # not measured by that run: the profile's
