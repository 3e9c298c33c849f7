"""CPU calibration end to end, atomic profile writing, merging into a declared profile, the chunk
curve hook. Runs without a GPU (the CI machine)."""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

import pytest
import torch
import yaml

import calibration
from calibration import chunks, collectives, config, io, runner
from calibration.__main__ import main as calibrate_main
from calibration.merge import merge
from planner.errors import InvalidPlan, ProfileGap
from planner.schema.io import PROFILES_DIR, load_cluster
from planner.timing import curves as C
from planner.timing.compute import table_rate

QUICK_BUDGET_S = 60.0
"""The CPU quick calibration must finish within a minute."""

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only profile; a GPU runs the GPU grids")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick") / "cpu.yaml"
    t0 = time.perf_counter()
    spec = calibration.run(out, quick=True, progress=False, command="pytest: calibrate --quick")
    return out, spec, time.perf_counter() - t0


def test_quick_cpu_profile_end_to_end(quick):
    out, spec, elapsed = quick
    assert elapsed < QUICK_BUDGET_S
    assert load_cluster(str(out)) == spec == C.parse_cluster(yaml.safe_load(out.read_text()))
    assert spec.topology.gpu_name == "cpu" and spec.topology.host_mem_bw_bytes_per_s > 1.0
    grid = config.CPU
    g = spec.curves.gemm
    assert g.axes == [list(grid.gemm_m), list(grid.gemm_n), list(grid.gemm_k)] and g.dtype == "fp32"
    assert g.provenance.command == "pytest: calibrate --quick" and g.provenance.gpus_on_machine == 0
    assert spec.curves.cpu_adamw.threads == list(grid.cpu_threads)
    # no GPU curves in the CPU profile
    assert spec.curves.h2d is None and spec.curves.attention_fwd is None and spec.curves.gpu_adamw is None
    assert all(spec.memory.model_dump()[k]["status"] != "measured" for k in runner.ASSUMED)
    # usable by the time model, with gaps outside the grid
    t = C.gemm_flops(300, 256, 256) / table_rate(spec.curves.gemm, "gemm", 300, 256, 256)
    assert 0 < t < 1
    with pytest.raises(ProfileGap):
        table_rate(spec.curves.gemm, "gemm", 4096, 256, 256)
    assert C.cpu_adamw_time_s(spec.curves, 10**9, 1) > 0
    assert "| gemm | measured | cpu |" in out.with_name(out.stem + ".summary.md").read_text()


def test_full_calibration_without_cuda_is_invalid(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    with pytest.raises(InvalidPlan, match=r"--quick \(False\) must be set on a machine without a CUDA device"):
        calibration.run(out, quick=False, progress=False, command="pytest")
    assert calibrate_main(["--out", str(out), "--no-progress"]) == 2
    assert "error: --quick" in capsys.readouterr().err and not out.exists()


def test_interrupted_calibration_leaves_old_profile(tmp_path, monkeypatch):
    out = tmp_path / "cluster.yaml"
    out.write_text("old profile\n")
    before = out.read_bytes()

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("calibration.optimizer.cpu_adamw_table", interrupt)
    with pytest.raises(KeyboardInterrupt):
        calibration.run(out, quick=True, progress=False, command="pytest")
    assert "gemm" in runner.LAST_RUN[0].curves  # it was interrupted mid-way, after measuring
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]


@pytest.mark.parametrize("where", ["replace", "fsync"])
def test_failed_write_leaves_old_profile(tmp_path, monkeypatch, where):
    out = tmp_path / "cluster.yaml"
    io.write_yaml_atomic(out, {"a": 1})
    before = out.read_bytes()

    def boom(*a, **k):
        raise KeyboardInterrupt if where == "fsync" else OSError("disk full")

    monkeypatch.setattr(io.os, where, boom)
    with pytest.raises((KeyboardInterrupt, OSError)):
        io.write_yaml_atomic(out, {"a": 2, "b": [1.5, 2.5]})
    monkeypatch.undo()
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]


def test_write_yaml_atomic_round_trip_and_mode(tmp_path):
    data = {"x": [[1.0, 2.0], [3.0, 4.0]], "name": "h200", "nested": {"k": [1, 2]}}
    path = io.write_yaml_atomic(tmp_path / "sub" / "p.yaml", data)
    assert yaml.safe_load(path.read_text()) == data
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_failed_section_is_reported_and_exit_code_1(tmp_path, monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("no kernel")

    monkeypatch.setattr("calibration.compute.gemm_table", broken)
    out = tmp_path / "p.yaml"
    assert calibrate_main(["--quick", "--no-progress", "--out", str(out)]) == 1
    spec = load_cluster(str(out))
    assert spec.curves.gemm is None and spec.curves.cpu_adamw is not None
    assert "gemm: RuntimeError: no kernel" in capsys.readouterr().err
    assert "gemm: RuntimeError: no kernel" in out.with_name(out.stem + ".summary.md").read_text()


def test_dispatch_kernels_section_on_cpu_smoke():
    """The GPU-only ``dispatch_kernels`` section's code path (``--sections dispatch_kernels``), run at
    the smoke shapes on the CPU: a validated curve with the run's provenance and host instance."""
    st = runner.RunState()
    prov = {"device": "cpu", "date": "2026-11-29", "command": "pytest", "host_instance": "vm-test"}
    runner._section("dispatch_kernels", config.SMOKE, torch.device("cpu"), prov, st, runner._Bar(False, 1))
    cv = st.curves["dispatch_kernels"]
    assert cv.provenance.command == "pytest" and cv.provenance.host_instance == "vm-test"
    assert cv.memory and cv.host_loops and cv.gemm_layouts


def test_memory_sizes_section_on_cpu_smoke():
    """The GPU-only ``memory_sizes`` section's code path (``--sections memory_sizes``) at the smoke
    sizes on the CPU: every kernel class at each size, with the run's provenance."""
    from calibration import memory_sizes

    st = runner.RunState()
    prov = {"device": "cpu", "date": "2026-12-01", "command": "pytest", "host_instance": "vm-test"}
    runner._section("memory_sizes", config.SMOKE, torch.device("cpu"), prov, st, runner._Bar(False, 1))
    cv = st.curves["memory_sizes"]
    assert cv.provenance.command == "pytest" and cv.provenance.host_instance == "vm-test"
    assert sorted({p.N for p in cv.points}) == sorted(s["N"] for _, s in memory_sizes.SMOKE)
    assert len({p.cls for p in cv.points}) >= 10


def _declared(tmp_path: Path) -> Path:
    """The shipped H200 profile's declared topology and constants, re-labelled for this CPU."""
    data = yaml.safe_load((PROFILES_DIR / "clusters" / "h200.yaml").read_text())
    data["topology"]["gpu_name"] = "cpu"
    data["curves"] = {}
    path = tmp_path / "declared.yaml"
    io.write_yaml_atomic(path, data)
    return path


def _fragment_on(device: str) -> dict:
    prov = {"device": device, "date": "2026-11-29", "command": "torchrun ...", "gpus_on_machine": 2}
    sizes = [1 << e for e in range(16, 31, 2)]
    c = C.bandwidth_curve(sizes, [20e-6 + n / 150e9 for n in sizes], provenance=prov, group_size=2)
    nccl = {"value": 5e8, "status": "measured", "provenance": prov, "note": "test"}
    return collectives.fragment({name: {2: c} for name in C.COLLECTIVES}, nccl)


def test_merge_keeps_declared_topology(quick, tmp_path):
    out, measured, _ = quick
    declared = _declared(tmp_path)
    base = load_cluster(str(declared))
    spec = merge(declared, out)
    assert spec.topology == base.topology
    assert spec.curves.gemm == measured.curves.gemm and spec.curves.cpu_adamw == measured.curves.cpu_adamw
    assert spec.memory == base.memory  # the quick CPU run measured no memory constant
    frag = tmp_path / "coll.yaml"
    io.write_yaml_atomic(frag, _fragment_on("cpu"))
    spec2 = merge(declared, frag)
    assert spec2.memory.nccl_buffer_bytes.status == "measured" and spec2.memory.nccl_buffer_bytes.value == 5e8
    assert spec2.memory.cuda_context_bytes == base.memory.cuda_context_bytes
    assert spec2.curves.gemm == measured.curves.gemm  # earlier merge kept
    assert set(spec2.curves.collectives.all_to_all) == {2}
    assert load_cluster(str(declared)) == spec2


def test_merge_rejects_other_device_and_keeps_profile(tmp_path):
    declared = _declared(tmp_path)
    before = declared.read_bytes()
    frag = tmp_path / "coll.yaml"
    io.write_yaml_atomic(frag, _fragment_on("NVIDIA H200"))
    with pytest.raises(InvalidPlan, match=r"provenance\.device \('NVIDIA H200'\) must equal topology\.gpu_name"):
        merge(declared, frag)
    assert declared.read_bytes() == before


def test_chunk_curve_hook(monkeypatch):
    monkeypatch.setattr(chunks, "MODULE", "planner.runtime._no_such_operator")
    with pytest.raises(chunks.Skipped, match="is not there yet"):
        chunks.load_hook()
    fake = types.ModuleType("fake_pipelined_llep")
    monkeypatch.setitem(sys.modules, "fake_pipelined_llep", fake)
    monkeypatch.setattr(chunks, "MODULE", "fake_pipelined_llep")
    with pytest.raises(chunks.Skipped, match="has no calibration_case"):
        chunks.load_hook()
    calls = []

    def calibration_case(num_chunks, *, smoke, device):
        x = torch.randn(64, 64)
        calls.append(num_chunks)
        return (lambda: [x @ x for _ in range(num_chunks)]), {"tokens_per_rank": 64, "top_k": 2}

    fake.calibration_case = calibration_case
    prov = {"device": "cpu", "date": "2026-11-29", "command": "pytest"}
    curve = chunks.chunk_curve(smoke=True, device=torch.device("cpu"), prov=prov, tick=lambda n: None,
                               min_time_s=1e-4)
    assert curve.num_chunks == list(chunks.SMOKE_CHUNK_COUNTS) == calls
    assert curve.shape == {"tokens_per_rank": 64, "top_k": 2} and all(t > 0 for t in curve.time_s)
