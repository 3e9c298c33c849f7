"""bench/blas_workspaces.py without a GPU: the cases' budget side, the reading of an allocator
snapshot (which block is a cuBLAS / cuBLASLt workspace, which thread made it) and the split of the
bytes clearing the workspaces frees."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import blas_workspaces as bw  # noqa: E402

MiB = 2**20
CUBLAS, LT = 32 * MiB, MiB
"""The two block sizes of a synthetic snapshot (the H200's, here only test inputs)."""


def _block(size, names, state="active_allocated", py=None):
    frames = [{"name": n, "filename": "??", "line": 0} for n in names]
    if py:
        frames.append({"name": "forward", "filename": "/repo/planner/runtime/attention.py", "line": 136})
    return {"size": size, "state": state, "frames": frames}


def _snapshot():
    lt_fwd = _block(LT, ["c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate",
                         "at::cuda::getNewCUDABlasLtWorkspace()", "at::cuda::getCUDABlasLtWorkspace()",
                         "void at::cuda::blas::gemm_and_bias<c10::BFloat16, c10::BFloat16>(...)",
                         "at::native::addmm_out_cuda_impl(...)"], py=True)
    lt_bwd = _block(LT, ["at::cuda::getNewCUDABlasLtWorkspace()", "void at::cuda::blas::gemm_and_bias<c10::BFloat16>",
                         "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"])
    cub = _block(CUBLAS, ["at::cuda::getNewWorkspace()", "at::cuda::setWorkspaceForHandle(...)",
                          "at::cuda::getCurrentCUDABlasHandle()", "void at::cuda::blas::gemm<c10::BFloat16>(...)"])
    freed_lt = _block(LT, ["at::cuda::getNewCUDABlasLtWorkspace()"], state="inactive")
    other = _block(5 * MiB, ["at::native::empty_cuda(...)"])
    return {"segments": [{"blocks": [lt_fwd, cub, other]}, {"blocks": [lt_bwd, freed_lt]}]}


def test_workspace_blocks_names_kind_op_site_and_thread():
    got = bw.workspace_blocks(_snapshot())
    assert [(b["kind"], b["bytes"], b["thread"]) for b in got] == [
        ("cublaslt", LT, "caller"), ("cublas", CUBLAS, "caller"), ("cublaslt", LT, "backward")]
    assert got[0]["op"] == "void at::cuda::blas::gemm_and_bias<c10::BFloat16, c10::BFloat16>(...)"  # innermost
    assert got[1]["op"] == "void at::cuda::blas::gemm<c10::BFloat16>(...)"
    assert got[0]["site"] == "runtime/attention.py:136"
    assert got[2]["site"] == "?"


def test_counts_splits_the_freed_bytes():
    assert bw.counts(2 * CUBLAS + 2 * LT, CUBLAS, LT) == {"n_cublas": 2, "n_lt": 2, "unexplained_bytes": 0}
    assert bw.counts(2 * CUBLAS, CUBLAS, LT) == {"n_cublas": 2, "n_lt": 0, "unexplained_bytes": 0}
    assert bw.counts(2 * CUBLAS + LT + 512, CUBLAS, LT) == {"n_cublas": 2, "n_lt": 1, "unexplained_bytes": 512}


def test_every_case_has_the_budget_rule_value():
    got = {n: bw.budget(n)["n_lt"] for n in bw.CASES}
    assert got == {"fsdp2-gptoss-W8-selective": 1, "fsdp2-dsv2-W64-full": 0, "fsdp2-gptoss-W8-none": 1,
                   "fsdp2-gptoss-W8-full": 2, "fsdp2-qwen3-W8-full": 0, "composed-gptoss-W8-S32768": 2,
                   "fsdp2-qwen3-W1-full": 0}


def test_smoke_run_writes_a_summary(tmp_path):
    assert bw.main(["--out", str(tmp_path), "--smoke", "--case", "fsdp2-qwen3-W8-full"]) == 0
    md = (tmp_path / "blas_workspaces.md").read_text()
    assert "| fsdp2-qwen3-W8-full | 2 / 0 | smoke (no CUDA run) |" in md


def test_marker_totals_reads_a_free_at_request_and_at_completion():
    """A block freed while a side stream still used it: gone at ``free_requested``, still allocated
    (and in ``memory_allocated``) until ``free_completed``."""
    mark = 997 * 512
    py = [{"name": "f", "filename": "/r/planner/runtime/expert_parallel.py", "line": 148}]
    ev = [{"action": "alloc", "addr": 1, "size": 4 * MiB, "frames": py},        # persistent
          {"action": "alloc", "addr": 2, "size": 2 * MiB, "frames": py},        # used on a side stream
          {"action": "free_requested", "addr": 2, "size": 2 * MiB},
          {"action": "alloc", "addr": 9, "size": mark},                         # step_start marker
          {"action": "free_requested", "addr": 9, "size": mark},
          {"action": "free_completed", "addr": 9, "size": mark},
          {"action": "free_completed", "addr": 2, "size": 2 * MiB},
          {"action": "alloc", "addr": 8, "size": mark}]                         # optimizer marker
    got = bw.marker_totals({"device_traces": [ev]}, [("step_start", 9), ("optimizer", 8)], mark)
    assert got["step_start"]["live_bytes_free_requested"] == 4 * MiB
    assert got["step_start"]["live_bytes_free_completed"] == 6 * MiB
    assert got["step_start"]["pending"] == [{"bytes": 2 * MiB, "site": "runtime/expert_parallel.py:148"}]
    assert got["optimizer"]["live_bytes_free_completed"] == got["optimizer"]["live_bytes_free_requested"] == 4 * MiB
    assert got["optimizer"]["pending"] == []
