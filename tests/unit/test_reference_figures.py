"""Checks of the planner against the reference figures and its own invariants:
the dense head with our profile's constants, both dispatch bounds at shape A with their formulas,
and a peak that never rises with the SCO budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.budget import gathered, vocab, workspace
from planner.budget.build import make_context
from planner.budget.peak import evaluate
from planner.budget.terms import Phase
from planner.schema import ComposedKnobs, ModelSpec, Plan, Workload
from planner.units import GiB
from tests.conftest import tiny_moe

REFERENCE_DENSE_GIB = {16384: 42.462, 32768: 79.521}
"""reference/paper-figures.md: the standard (dense, fp32) head's peaks."""
REFERENCE_TOL = 0.01
"""the dense-head formula lands within 1% of them."""
SHAPE_A = Path(__file__).resolve().parents[2] / "docs" / "examples" / "shape-a.yaml"


def _dense_head_bytes(h200, N: int) -> int:
    m = ModelSpec(name="head-only", num_layers=1, hidden_size=7168, vocab_size=200_000, num_heads=56,
                  num_kv_heads=56, head_dim=128, dense_ffn=1)
    plan = Plan(world_size=1, dtype="fp32", composed=ComposedKnobs(vocab="dense", checkpoint="per_layer",
                                                                      optimizer="gpu"))
    ctx = make_context(m, h200, Workload(seq_len=N), plan)
    head = Phase("head")
    terms = [t for t in gathered.terms(ctx) if t.name.startswith("head gather")]
    terms += vocab.terms(ctx) + [t for t in workspace.terms(ctx) if "cuBLAS" in t.name]
    return int(sum(int(t.bytes_in(head)) for t in terms))


def test_dense_head_matches_reference_with_our_constants(h200):
    for N, ref in REFERENCE_DENSE_GIB.items():
        got = _dense_head_bytes(h200, N) / GiB
        assert abs(got / ref - 1) <= REFERENCE_TOL, f"N={N}: {got:.3f} GiB vs reference {ref}"


def _check(*extra) -> dict:
    cmd = [sys.executable, "-m", "planner.cli", "check", str(SHAPE_A), "--gpus", "8", "--seq-len", "512k",
           "--seq-parallel", "8", "--expert-parallel", "8", "--token-budget", "6554", "--json", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def test_shape_a_prints_both_dispatch_bounds_with_formulas():
    # one routing for both: by default the expected size (no launch-time bound) uses the named skew
    g, e = (_check("--routing", "balanced", "--dispatch-bound", b) for b in ("guarantee", "expected"))
    assert g["derived"]["tokens_per_rank"] == 65536 and g["derived"]["num_chunks"] == 10
    for doc in (g, e):
        terms = doc["live_sets"]["dispatch"]["terms"]
        assert terms and all(t["formula"] for t in terms)
        assert any(t["name"].startswith("PipelinedLLEP") for t in terms)
    assert g["dispatch_bounds"] == e["dispatch_bounds"]
    assert g["dispatch_bounds"]["guarantee"] >= g["dispatch_bounds"]["expected"] > 0
    assert g["live_sets"]["dispatch"]["max_bytes"] == g["dispatch_bounds"]["guarantee"]
    assert e["live_sets"]["dispatch"]["max_bytes"] == e["dispatch_bounds"]["expected"]


@settings(max_examples=60, deadline=None)
@given(budgets=st.lists(st.integers(0, 64 * 2**20), min_size=2, max_size=6),
       layers=st.integers(1, 5), S=st.sampled_from([2048, 8192, 20480]))
def test_peak_never_rises_with_the_sco_budget(h200, budgets, layers, S):
    m = tiny_moe(num_layers=layers)
    peaks = []
    for b in sorted(budgets):
        ctx = make_context(m, h200, Workload(seq_len=S),
                           Plan(world_size=4, composed=ComposedKnobs(checkpoint="sco", sco_host_bytes=b)))
        peaks.append(int(evaluate(ctx).peak_bytes))
    assert all(np.diff(peaks) <= 0), peaks
