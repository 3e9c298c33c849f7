"""Defects found by hostile-user fuzzing (CLI contract, verdict honesty, runtime operators).

Every test states the CORRECT behaviour and is marked ``xfail(strict=True)`` while the defect is
open: fixing the defect makes the test pass, strict xfail then fails, and the marker comes off.
Each reason names the file believed responsible. Runtime tests run in one process on the CPU
(``group=None``); nothing here spawns gloo workers.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from planner import api, cli
from planner.errors import InvalidPlan

HANG_TIMEOUT_S = 15
"""Wall-clock limit for a command that should answer at once (it hangs today)."""
CLEAN_EXIT = 2
"""DESIGN §10: invalid input exits 2 with one ``error:`` line and no traceback."""


def _xfail(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


def _cli(argv, capsys) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def _assert_one_line_error(code: int, err: str) -> None:
    assert code == CLEAN_EXIT, f"exit {code}; stderr:\n{err}"
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "; fix: " in lines[0], err


# ---- 1. CLI contract -----------------------------------------------------------------------------
USAGE_ERRORS = {
    "bad_int": ["check", "gpt-oss-20b", "--gpus", "abc", "--seq-len", "128k"],
    "bad_choice": ["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--dispatch", "bogus"],
    "unknown_option": ["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--nosuchflag"],
    "missing_value": ["check", "gpt-oss-20b", "--seq-len", "128k", "--gpus"],
    "unknown_command": ["bogus"],
}


@_xfail("planner/cli.py main(): typer 0.29 raises typer._click exceptions, which are not "
        "click.exceptions.ClickException, so every usage error exits 3 with a traceback")
@pytest.mark.parametrize("argv", list(USAGE_ERRORS.values()), ids=list(USAGE_ERRORS))
def test_usage_errors_exit_2_with_one_line(argv, capsys):
    _assert_one_line_error(*_cli(argv, capsys))


OVERFLOWS = {
    "seq_len": ["--seq-len", "99999999999999999999"],
    "bucket_params": ["--seq-len", "128k", "--bucket-params", "99999999999999999999999"],
    "max_chunks": ["--seq-len", "128k", "--max-chunks", "99999999999999999999"],
    "llep_min_tokens": ["--seq-len", "128k", "--llep-min-tokens", "99999999999999999999"],
}


@_xfail("no upper bounds on integer knobs (planner/schema/plan.py, workload.py): numpy int64 "
        "conversion raises OverflowError (planner/units.py ceil_div, budget/build.py:65, "
        "budget/optimizer.py:54, plans/chunking.py:107) -> exit 3")
@pytest.mark.parametrize("extra", list(OVERFLOWS.values()), ids=list(OVERFLOWS))
def test_huge_integers_are_invalid_input(extra, capsys):
    _assert_one_line_error(*_cli(["check", "gpt-oss-20b", "--gpus", "8", *extra], capsys))


@_xfail("unbounded world size: the default-degree resolution walks every divisor candidate of W "
        "(O(W); W=1e7 takes ~5 s, W=1e20 never returns) in planner/budget/resolve.py")
def test_huge_world_size_answers_quickly():
    try:
        p = subprocess.run([sys.executable, "-m", "planner.cli", "check", "gpt-oss-20b", "--gpus",
                            "1000000000000", "--seq-len", "128k"], capture_output=True, text=True,
                           timeout=HANG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"planner check --gpus 1e12 ran longer than {HANG_TIMEOUT_S} s")
    assert p.returncode in (1, 2), p.stderr


@_xfail("max-context/max-batch allocate the whole grid at once: a huge --max-seq-len/--max-tokens "
        "raises numpy's _ArrayMemoryError -> exit 3 (planner/budget/frontier.py:91, planner/api.py:281)")
@pytest.mark.parametrize("argv", [
    ["max-context", "gpt-oss-20b", "--gpus", "8", "--max-seq-len", "99999999999999999999"],
    ["max-batch", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--max-tokens", "99999999999999999999"],
], ids=["max_context", "max_batch"])
def test_huge_frontier_grid_is_invalid_input(argv, capsys):
    _assert_one_line_error(*_cli(argv, capsys))


@_xfail("planner/units.py parse_count goes through float(): integers above 2^53 are silently "
        "rounded ('99999999999999999999' -> 1e20, which then passes the global-batch multiple check)")
def test_parse_count_is_exact_for_large_integers():
    from planner.units import parse_count

    assert parse_count("9007199254740993") == 9007199254740993


@_xfail("planner/cli.py _overrides formats the value as f'{v}GiB' and units._NUM has no sign, so "
        "--sco-host-gib -1 reports \"('-1.0GiB') is not a byte size\" instead of must be >= 0")
def test_negative_sco_budget_message_names_value_and_problem(capsys):
    code, err = _cli(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--sco-host-gib", "-1"],
                     capsys)
    _assert_one_line_error(code, err)
    assert "GiB'" not in err and ">= 0" in err, err


def _write_target_cases(tmp_path):
    d = tmp_path / "a_directory"
    d.mkdir()
    return {
        "search_out_dir": ["search", "olmoe-1b-7b", "--gpus", "2", "--seq-len", "8k", "--top", "1",
                           "--no-progress", "--out", d],
        "search_out_unwritable": ["search", "olmoe-1b-7b", "--gpus", "2", "--seq-len", "8k", "--top", "1",
                                  "--no-progress", "--out", "/proc/plan.yaml"],
        "sweep_csv_dir": ["sweep", "olmoe-1b-7b", "--gpus", "2", "--seq-lens", "8k", "--no-progress",
                          "--csv", d],
        "import_hf_out_dir": ["import-hf", "profiles/hf-configs/olmoe-1b-7b-0924.json", "-o", d],
    }


@_xfail("planner/schema/io.py write_text_atomic: OSError (directory target, unwritable folder) is "
        "not turned into InvalidPlan -> exit 3; for a directory target the temp file is even "
        "created in the directory's parent")
@pytest.mark.parametrize("case", ["search_out_dir", "search_out_unwritable", "sweep_csv_dir",
                                  "import_hf_out_dir"])
def test_unwritable_output_is_invalid_input(case, tmp_path, capsys, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    _assert_one_line_error(*_cli(_write_target_cases(tmp_path)[case], capsys))


def _model_yaml(tmp_path, **changes) -> str:
    from planner.schema.io import load_model

    doc = load_model("olmoe-1b-7b").model_dump(mode="json")
    doc.update(changes)
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@_xfail("planner/timing/step.py:153 _check_invariants broadcasts E_p against a non-scalar for "
        "models without MoE layers -> ValueError, exit 3 (check accepts the same models)")
@pytest.mark.parametrize("kind", ["dense", "all_layers_dense"])
def test_search_on_models_without_moe_layers(kind, tmp_path, capsys):
    if kind == "dense":
        m = _model_yaml(tmp_path, name="dense", num_experts=0, top_k=0, expert_ffn=0, dense_ffn=4096)
    else:
        m = _model_yaml(tmp_path, name="alldense", dense_layers=list(range(16)), dense_ffn=4096)
    code, err = _cli(["search", m, "--gpus", "8", "--seq-len", "32k", "--top", "1", "--no-progress"], capsys)
    assert code in (0, 1), err


def _cluster_doc():
    from planner.schema.io import load_cluster

    return load_cluster("h200").model_dump(mode="json")


def _cluster_yaml(tmp_path, mutate) -> str:
    doc = _cluster_doc()
    mutate(doc)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@_xfail("a cluster profile without curves (Curves() default) passes check but `search` trips an "
        "assert in planner/timing/dispatch.py:204 -> exit 3; expected ProfileGap (exit 2)")
def test_search_with_curveless_cluster_is_a_profile_gap(tmp_path, capsys):
    c = _cluster_yaml(tmp_path, lambda d: d.pop("curves"))
    _assert_one_line_error(*_cli(["search", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--top", "1",
                                  "--no-progress", "--cluster", c], capsys))


def _set_const(name, value):
    return lambda d: d["memory"][name].update(value=value)


BAD_CONSTANTS = {
    "nan_context": _set_const("cuda_context_bytes", float("nan")),
    "negative_context": _set_const("cuda_context_bytes", -1e12),
    "negative_flash_workspace": _set_const("flash_workspace_bytes_per_elem", -100.0),
    "negative_reserve": lambda d: (_set_const("reserve_fraction", -0.5)(d),
                                   _set_const("fragmentation_fraction", -0.5)(d)),
    "negative_host_reserve": _set_const("host_reserve_fraction", -1.0),
    "negative_host_baseline": _set_const("host_baseline_bytes_per_rank", -1e12),
}


@_xfail("planner/schema/cluster.py Constant.value is an unconstrained float and peak.py trusts it: "
        "NaN -> exit 3 (peak.py:125), negative workspace -> assert (peak.py:106), negative context "
        "gives capacity > HBM and negative reserves/host baseline inflate capacity -> false 'fits'; "
        "DESIGN §3.1 reserve 'at least 2%' is not enforced (peak.py reserve_fraction)")
@pytest.mark.parametrize("case", list(BAD_CONSTANTS))
def test_bad_cluster_constants_are_invalid_input(case, tmp_path, capsys):
    c = _cluster_yaml(tmp_path, BAD_CONSTANTS[case])
    _assert_one_line_error(*_cli(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--cluster", c],
                                 capsys))


RESERVE_FLOOR = 0.02
"""DESIGN §3.1: the fragmentation reserve is at least 2% of the usable HBM."""


@_xfail("planner/budget/peak.py reserve_fraction takes max(profile reserve, fragmentation) with "
        "no 2% floor: a profile with reserve 0 gives capacity = HBM - context - NCCL")
def test_reserve_is_at_least_two_percent(tmp_path):
    c = _cluster_yaml(tmp_path, lambda d: (_set_const("reserve_fraction", 0.0)(d),
                                           _set_const("fragmentation_fraction", 0.0)(d)))
    try:
        rep = api.check(model="gpt-oss-20b", gpus=8, seq_len=1 << 17, cluster=c)
    except InvalidPlan:             # rejecting the profile is also correct
        return
    usable = rep.hbm_bytes - rep.outside_allocator_bytes
    assert rep.capacity_bytes <= usable * (1 - RESERVE_FLOOR)


@_xfail("schema_version is checked only for plan files (planner/schema/planfile.py); model and "
        "cluster profiles of another version load silently (schema/model.py, schema/cluster.py)")
@pytest.mark.parametrize("kind", ["model", "cluster"])
def test_profile_schema_version_is_checked(kind, tmp_path, capsys):
    if kind == "model":
        argv = ["check", _model_yaml(tmp_path, name="ver99", schema_version=99), "--gpus", "8", "--seq-len", "128k"]
    else:
        c = _cluster_yaml(tmp_path, lambda d: d.update(schema_version=7))
        argv = ["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--cluster", c]
    _assert_one_line_error(*_cli(argv, capsys))


@_xfail("planner/schema/plan.py bucket_params only needs > 0, but OffloadStreamAdamW refuses "
        "buckets below the 16-element cut alignment (planner/plans/buckets.py): check says FITS "
        "for a plan the operator rejects")
def test_bucket_below_alignment_is_rejected_by_check(capsys):
    _assert_one_line_error(*_cli(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k",
                                  "--bucket-params", "15"], capsys))


# ---- 2. Verdict honesty --------------------------------------------------------------------------
def _dispatch_max(model, W, S, **ov) -> int:
    return api.check(model=model, gpus=W, seq_len=S, overrides=ov).live_set_bytes("dispatch")[1]


@_xfail("planner/plans/llep.py:176 residue_bound_routes: ceil(max(α,λ)·k·N) cast to int64 "
        "overflows for α = inf or 1e300, so a LARGER α gives a SMALLER guarantee (schema accepts "
        "inf); the runtime plan raises OverflowError for α = inf")
@pytest.mark.parametrize("alpha", [float("inf"), 1e300])
def test_guarantee_is_monotone_in_llep_alpha(alpha):
    base = _dispatch_max("gpt-oss-20b", 8, 1 << 17, llep_alpha=1.0)
    big = _dispatch_max("gpt-oss-20b", 8, 1 << 17, llep_alpha=alpha)
    assert big >= base


@_xfail("the PipelinedLLEP guarantee assumes the LLEP plan places every excess (unplaced == 0); "
        "with the default n_import_max = 4 and E_p = 2 the 'worst' routing leaves 491520 routes on "
        "rank 0 against a residue bound of 406259, so guarantee (2.35 GiB) < expected (2.56 GiB). "
        "planner/budget/dispatch.py guarantee / planner/plans/llep.py residue_bound_routes")
def test_dispatch_guarantee_bounds_the_expected_size():
    kw = dict(dispatch="pipelined_llep", routing="worst", expert_parallel=2)
    g = _dispatch_max("qwen3-30b-a3b", 8, 1 << 17, dispatch_bound="guarantee", **kw)
    e = _dispatch_max("qwen3-30b-a3b", 8, 1 << 17, dispatch_bound="expected", **kw)
    assert g >= e


@_xfail("design-level: R/H with H < k is accepted and (as DESIGN §3.2 writes it) repeats hot "
        "experts within a token, which no top-k router can do; for standard EP it then exceeds "
        "the 'worst' routing (100/1: 33.9 GiB vs worst 23.4 GiB on gpt-oss-20b). Reject H < k or "
        "make 'worst' the maximum (planner/schema/plan.py _routing, planner/plans/routing.py)")
def test_worst_routing_bounds_every_accepted_profile():
    worst = _dispatch_max("gpt-oss-20b", 8, 1 << 17, dispatch="ep", routing="worst")
    try:
        skew = _dispatch_max("gpt-oss-20b", 8, 1 << 17, dispatch="ep", routing="100/1")
    except InvalidPlan:
        return
    assert skew <= worst


# ---- 3. Runtime operators (CPU, one process) -----------------------------------------------------
@_xfail("planner/runtime/ring_dtp.py does not validate targets: an id outside [0, V) that is not "
        "ignore_index silently contributes y_t = 0 (loss = lse); torch's cross_entropy raises")
@pytest.mark.parametrize("bad", [11, -1])
def test_ring_dtp_rejects_out_of_range_targets(bad):
    import torch

    from planner.runtime.ring_dtp import ring_dtp_cross_entropy

    x, w = torch.randn(5, 8), torch.randn(11, 8)
    t = torch.tensor([0, 1, 2, 3, bad])
    with pytest.raises((InvalidPlan, IndexError, ValueError, RuntimeError)):
        ring_dtp_cross_entropy(x, t, w, group=None, vocab_start=0)


@_xfail("PipelinedLLEP leaves the stacked expert .grad None when this rank's experts receive no "
        "routes (ExpertChunk only touches slots with rows, planner/runtime/expert_chunk.py), while "
        "EP and LLEP give zeros; AdamW then skips the shard on this rank only and replicas diverge")
def test_pipelined_llep_expert_grads_exist_without_routes():
    import torch

    from planner.runtime.expert_mlp import ExpertShard
    from planner.runtime.pipelined_llep import PipelinedLLEP

    shard = ExpertShard(4, 6, 5, dtype=torch.float32)
    op = PipelinedLLEP(shard, 4, 2, None, token_budget=3, max_chunks=4, min_tokens=1)
    x = torch.randn(0, 6, requires_grad=True)
    y = op(x, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2))
    (y.sum() + 0 * x.sum()).backward()
    assert shard.w_up_nHJ.grad is not None and shard.w_down_nIH.grad is not None


def _sco_setup():
    import torch

    from planner.runtime.sco import SCO

    torch.manual_seed(0)
    L, N, H = 4, 3, 4
    ws = [torch.randn(H, H, requires_grad=True) for _ in range(L)]
    sco = SCO(num_boundaries=L, boundary_shape=(N, H), dtype=torch.float32, device="cpu",
              host_budget_bytes=1 << 30, register=False)
    regions = [lambda x, w=w: x + torch.tanh(x @ w) for w in ws]
    return sco, ws, regions, torch.randn(N, H), torch.randn(N, H)


def _grads(ws, fn):
    for w in ws:
        w.grad = None
    fn()
    return [w.grad.clone() for w in ws]


@_xfail("planner/runtime/sco.py: a second forward before the backward (two micro-batches in one "
        "graph) overwrites the host slots and gives silently wrong gradients (max error ~9); the "
        "docstring forbids it but nothing detects it; it should raise or be exact")
def test_sco_two_forwards_before_backward_are_exact_or_rejected():
    import torch
    import torch.utils.checkpoint as tuc

    sco, ws, regions, x1, x2 = _sco_setup()

    def plain(x):
        for f in regions:
            x = tuc.checkpoint(f, x, use_reentrant=False)
        return x

    def offl(x):
        for i, f in enumerate(regions):
            x = sco.region(i + 1, f, x)
        return x

    ref = _grads(ws, lambda: (plain(x1).sum() + plain(x2).sum()).backward())
    try:
        got = _grads(ws, lambda: (offl(x1).sum() + offl(x2).sum()).backward())
    except (RuntimeError, ValueError, InvalidPlan):
        return
    finally:
        sco.close()
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


@_xfail("planner/runtime/sco.py: running the same region index twice in one forward overwrites "
        "its host slot and silently corrupts the first use's gradient")
def test_sco_same_region_twice_is_exact_or_rejected():
    import torch
    import torch.utils.checkpoint as tuc

    sco, ws, regions, x1, _ = _sco_setup()
    f = regions[0]
    ref = _grads(ws[:1], lambda: tuc.checkpoint(f, tuc.checkpoint(f, x1, use_reentrant=False),
                                                 use_reentrant=False).sum().backward())
    try:
        got = _grads(ws[:1], lambda: sco.region(1, f, sco.region(1, f, x1)).sum().backward())
    except (RuntimeError, ValueError, InvalidPlan):
        return
    finally:
        sco.close()
    assert torch.equal(ref[0], got[0])


def _adamw_pair(n=4):
    import torch

    from planner.runtime.offload_adamw import OffloadStreamAdamW

    a = torch.nn.Parameter(torch.zeros(n))
    b = torch.nn.Parameter(torch.zeros(n))
    return a, b, OffloadStreamAdamW([a], lr=1e-2, bucket_params=64, register=False), \
        torch.optim.AdamW([b], lr=1e-2, fused=True)


@_xfail("planner/runtime/offload_adamw.py snapshots the parameter list in __init__: params added "
        "with the public add_param_group are silently never updated")
def test_offload_adamw_add_param_group_updates_new_params():
    import torch

    a, b, o1, o2 = _adamw_pair()
    ea, eb = torch.nn.Parameter(torch.zeros(10)), torch.nn.Parameter(torch.zeros(10))
    o1.add_param_group({"params": [ea]})
    o2.add_param_group({"params": [eb]})
    for p in (a, b, ea, eb):
        p.grad = torch.ones_like(p)
    o1.step()
    o2.step()
    assert torch.equal(ea, eb)


@_xfail("planner/runtime/offload_adamw.py keeps the fp32 master on the host from __init__: an "
        "in-place change of the parameters between steps (model.load_state_dict after building "
        "the optimizer) is silently reverted by the next step; torch.optim.AdamW honours it")
def test_offload_adamw_honours_parameter_changes_between_steps():
    import torch

    a, b, o1, o2 = _adamw_pair()
    with torch.no_grad():
        a.fill_(0.5)
        b.fill_(0.5)
    a.grad, b.grad = torch.ones(4), torch.ones(4)
    o1.step()
    o2.step()
    assert torch.equal(a, b)


def test_reference_behaviour_still_holds():
    """Control, not a defect: the AdamW helper matches torch bitwise where nothing is wrong."""
    import torch

    a, b, o1, o2 = _adamw_pair()
    for _ in range(3):
        a.grad, b.grad = torch.ones(4), torch.ones(4)
        o1.step()
        o2.step()
    assert torch.equal(a, b)
