"""``bench/step_spread.py`` on the CPU (gloo, tiny widths): each block of each case times its steps
(the first not), records the host's state beside every one, pins only the ``pinned`` block, and the
pooled correlation reads deviations within a case."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import step_spread  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def case():
    name, model, knobs, S, lt = step_spread.SMOKE_CASES[1]
    return step_spread.run_case(name, model, knobs, S, lt, torch, True, STEPS)


def test_every_block_times_its_steps_beside_the_host(case):
    assert [b["mode"] for b in case["blocks"]] == list(step_spread.BLOCKS)
    keys = {"step_s", "wall_s", "host_s", "nivcsw", "steal_s", "gc_s", "gc_n", "launch_us", "python_us", "cpu"}
    for b in case["blocks"]:
        assert len(b["steps"]) == STEPS - 1
        for s in b["steps"]:
            assert keys <= set(s) and s["step_s"] > 0 and 0 < s["host_s"] <= s["wall_s"] * 1.5
            assert s["launch_us"] > 0 and s["python_us"] > 0 and s["gc_s"] >= 0


def test_only_the_pinned_block_is_pinned(case):
    pinned = [b for b in case["blocks"] if "host_cores" in b]
    assert [b["mode"] for b in pinned] == ["pinned"]
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1:
        core = pinned[0]["host_cores"]["core"]
        assert core is not None and all(s["cpu"] == core for s in pinned[0]["steps"])


def test_correlation_pools_deviations_within_each_case():
    def c(xs, ys):
        return {"blocks": [{"steps": [{"step_s": y, "k": x} for x, y in zip(xs, ys)]}]}
    # within each case the step follows k exactly; the cases' levels differ by 100x
    r = step_spread.correlation([c([1, 2, 3], [1.0, 2.0, 3.0]), c([10, 11, 12], [100.0, 200.0, 300.0])], "k")
    assert r == pytest.approx(1.0, abs=0.05)
    assert step_spread.correlation([c([1], [1.0])], "k") is None
