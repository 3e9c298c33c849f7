"""The ``workspace`` live set's BLAS terms (planner.budget.workspace): two cuBLAS workspaces for
every model, cuBLASLt workspaces only where a biased linear runs, one per thread that runs it; and
the table's account of the workspaces a committed run carried from one case to the next
(bench/validate_table.carried_workspace_bytes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from planner.api.build import build_planfile
from planner.budget import workspace
from planner.budget.build import make_context
from planner.budget.peak import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import validate_table  # noqa: E402

W, S = 8, 8192
LT, CUBLAS = "cuBLASLt workspace", "cuBLAS workspace"


def _ctx(model: str, **overrides):
    pf = build_planfile(model=model, gpus=W, seq_len=S, overrides=overrides or None)
    return make_context(pf.model, pf.cluster, pf.workload, pf.plan)


def _terms(ctx) -> dict[str, int]:
    return {t.name: int(t.count) * t.elem_bytes for t in workspace.terms(ctx) if "BLAS" in t.name}


def _lt_unit(ctx) -> int:
    return int(ctx.cluster.memory.cublaslt_workspace_bytes.value)


# (model, overrides, n_lt): gpt-oss has q/k/v/o and router biases; the backward's thread re-runs them
# under the composed stack and FSDP2 ac=full, not under selective (addmm saved) or none.
CASES = [
    ("gpt-oss-20b", {}, 2),
    ("gpt-oss-20b", {"stack": "fsdp2", "ac": "full"}, 2),
    ("gpt-oss-20b", {"stack": "fsdp2", "ac": "selective"}, 1),
    ("gpt-oss-20b", {"stack": "fsdp2", "ac": "none"}, 1),
    ("gpt-oss-20b", {"stack": "fsdp2", "tp": 8}, 2),
    ("qwen1.5-moe-a2.7b", {"stack": "fsdp2", "ac": "none"}, 1),   # q/k/v biases (qkv_bias)
    ("qwen3-30b-a3b", {}, 0),
    ("qwen3-30b-a3b", {"stack": "fsdp2"}, 0),
    ("qwen3-30b-a3b", {"stack": "fsdp2", "cp": 8, "cpu_offload": True}, 0),
    ("deepseek-v2-lite", {}, 0),
    ("deepseek-v2-lite", {"stack": "fsdp2"}, 0),
    ("deepseek-v3", {"stack": "fsdp2"}, 2),   # router_bias is DeepSeek-V3's correction: booked, errs high
]


@pytest.mark.parametrize("model,overrides,n_lt", CASES)
def test_blaslt_handles_follow_the_biased_linears_and_the_recompute(model, overrides, n_lt):
    ctx = _ctx(model, **overrides)
    assert workspace.blaslt_handles(ctx) == n_lt
    assert workspace.blaslt_bytes(ctx) == n_lt * _lt_unit(ctx)


@pytest.mark.parametrize("model,overrides,n_lt", CASES)
def test_the_terms_book_two_cublas_workspaces_and_n_lt_cublaslt_ones(model, overrides, n_lt):
    ctx = _ctx(model, **overrides)
    got = _terms(ctx)
    assert got[CUBLAS] == workspace.BLAS_HANDLES * int(ctx.cluster.memory.cublas_workspace_bytes.value)
    if n_lt:
        assert got[LT] == n_lt * _lt_unit(ctx)
    else:
        assert LT not in got


def test_the_lt_term_is_held_in_every_phase_and_says_its_rule():
    ctx = _ctx("gpt-oss-20b", stack="fsdp2", ac="none")
    lt = next(t for t in workspace.terms(ctx) if t.name == LT)
    assert lt.phases == ("forward", "head", "backward", "optimizer")
    assert "n_lt" in lt.formula and "CublasHandlePool.cpp" in lt.source and "Blas.cpp" in lt.source
    ev = evaluate(ctx, per_term=True)
    blas = ev.live_set_bytes("workspace").min()
    assert blas >= 2 * int(ctx.cluster.memory.cublas_workspace_bytes.value) + _lt_unit(ctx)


def test_a_model_without_biased_linears_holds_only_the_cublas_workspaces_at_the_step_start():
    """Qwen3 under FSDP2 (no FlashAttention term outside its attention sub-step): the workspace
    bytes every phase holds are exactly the two cuBLAS workspaces."""
    ctx = _ctx("qwen3-30b-a3b", stack="fsdp2")
    ev = evaluate(ctx, per_term=True)
    assert int(ev.live_set_bytes("workspace").min()) == 2 * int(ctx.cluster.memory.cublas_workspace_bytes.value)


def test_biased_linear_reads_the_spec():
    m = _ctx("gpt-oss-20b").model
    assert workspace.biased_linear(m)
    assert not workspace.biased_linear(m.model_copy(update={"attention_bias": False, "router_bias": False}))
    assert workspace.biased_linear(m.model_copy(update={"router_bias": False}))
    mla = _ctx("deepseek-v2-lite").model
    assert not workspace.biased_linear(mla.model_copy(update={"attention_bias": True}))   # MLA: bias-free


@pytest.mark.parametrize("own,held,carried", [(0, 0, 0), (0, 2, 2), (1, 2, 1), (2, 2, 0), (2, 0, 0)])
def test_carried_workspace_bytes(own, held, carried):
    assert validate_table.carried_workspace_bytes(own, held) == carried


def test_the_committed_fsdp2_run_carries_gpt_oss_workspaces_into_every_later_case():
    """bench/results/validate/validate_fsdp2.json ran qwen3-W1-full, then gptoss-W1-full (ac full:
    2 MiB of cuBLASLt workspace), then 21 cases in the same process: each of those holds the 2 MiB
    (a Qwen3 / DeepSeek case's own 0 plus 2 carried; gpt-oss ac = none: its own 1 plus 1)."""
    got = {c["name"]: c["carried_bytes"] for c, _ in validate_table.cases("validate_fsdp2")}
    unit = _lt_unit(_ctx("qwen3-30b-a3b"))
    assert got["qwen3-W1-full"] == 0 and got["gptoss-W1-full"] == 0
    assert got["qwen3-W8-full"] == got["dsv2-W64-full"] == got["qwen3-W8-cp8-offload-allgather"] == 2 * unit
    assert got["gptoss-W8-none-accumulate"] == unit
    assert got["gptoss-W8-tp8"] == 0
