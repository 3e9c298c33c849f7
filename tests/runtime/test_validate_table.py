"""The committed H200 runs of ``planner validate`` (bench/results/validate/) held against the formula
as it is now (``bench/validate_table.py``): no phase of any recorded case may be predicted more than
``UNDER`` below its measurement — a false fit — except the known gaps listed here with their reason.
A listed gap that is no longer under fails too, so the list cannot go stale."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import validate_table  # noqa: E402

from planner.runtime.validate_compare import MEMORY_UNDER, time_ok  # noqa: E402

UNDER = MEMORY_UNDER
_PERSISTENT = ("DeepSeek W = 64 step start and optimizer 4.8 MiB (1.5%) under on a 330 MiB rank, not a workspace: the "
               "2 MiB of cuBLASLt workspace the run carried from gpt-oss cases earlier in its process are taken off "
               "the measurement (validate_table.carried_workspace_bytes) and DeepSeek-V2-Lite allocates none of "
               "its own (no biased linear); re-run with each case's workspaces cleared first (bench/results/"
               "validate/validate_fsdp2_fresh.json) the row is 0.9845 (5.1 MiB). The recorded allocations of "
               "the H200 allocator history match the inventory to 112 B, so the bytes were not recorded; "
               "bench/blas_workspaces.py (a fresh process per case) says where they are. The step's peak is 1.000")
KNOWN_UNDER = {
    # (stack, case, W, S, lifetime): reason
    ("fsdp2", "dsv2-W64-full", 64, 32768, "accumulate"): _PERSISTENT,
}
"""Phases below the measurement by more than ``UNDER`` today, each with its reason. No composed
case is here: every phase of the 41 composed cases is at least 0.996 of the H200."""


@pytest.fixture(scope="module")
def records():
    return [validate_table.row(stem, c, pf) for stem in validate_table.STEMS
            for c, pf in validate_table.cases(stem)]


def _key(r):
    return (r["stack"], r["case"], r["W"], r["S"], r["lifetime"])


def test_every_recorded_case_is_read(records):
    stacks = {r["stack"] for r in records}
    assert stacks == {"composed", "fsdp2"}
    assert len(records) >= 40


def test_no_peak_is_a_false_fit(records):
    """The verdict itself (the step's peak) is never more than ``UNDER`` below the measurement."""
    assert [(_key(r), r["peak_predicted"] / r["peak_measured"]) for r in records
            if r["peak_predicted"] < (1 - UNDER) * r["peak_measured"]] == []


def test_no_new_false_fit_against_the_h200(records):
    under = {_key(r): f"{r['min_row']} {r['min_ratio']:.3f}" for r in records if r["min_ratio"] < 1 - UNDER}
    assert {k: v for k, v in under.items() if k not in KNOWN_UNDER} == {}
    assert sorted(k for k in KNOWN_UNDER if k not in under) == []


_QWEN3_HOST = ("Qwen3-30B-A3B composed at W = 1 (128 experts: 51k-140k kernel launches per 2-layer step, the GPU "
               "idle about half of it, bench/results/step_profile): host-bound, and the host's speed differs "
               "between H200 instances; 64k measured 4.47 (bench/results/step_phases), 4.85, 5.04, 5.33, 5.66 and "
               "5.94 s against 4.91 s predicted (0.83-1.10), 32k 2.85, 3.19, 3.49, 3.67 and 3.68 s against 3.09 s "
               "(0.84-1.08). On the instance of validate_w1_run5 the tiny-width host calibrations "
               "(bench/results/calibration/instance_c275be5e) measured the chunk loops at 175 / 42 / 464 us per "
               "block against the profile's 165 / 35 / 519: the slowdown is not in what the calibration measures")
_SLOW_INSTANCE = ("gpt-oss-20b composed at W = 1, 16k: 1.46 s on the instance of validate_w1_run5 (c275be5e), where "
                  "Qwen3's host-bound steps are also slowest, against 1.26-1.42 s on four other instances and 1.24 s "
                  "predicted (0.85-0.98 there)")
_QWEN3_FSDP2_HOST = ("Qwen3-30B-A3B FSDP2 at W = 1, 16k: 0.35 s on the calibrating instance (validate_fsdp2.json), "
                     "0.54 s on the instance of validate_fsdp2_run2.json against 0.34 s predicted; that instance's own "
                     "calibration.step_host rows are within 10% of the profile's (bench/results/calibration/"
                     "instance_c275be5e), and its other eight W = 1 steps are within 15%")
KNOWN_SLOW = {
    ("composed", "qwen3-30b-a3b", 1, 65536, "freed"): _QWEN3_HOST,
    ("composed", "qwen3-30b-a3b", 1, 32768, "freed"): _QWEN3_HOST,
    ("composed", "gpt-oss-20b", 1, 16384, "freed"): _SLOW_INSTANCE,
    ("fsdp2", "qwen3-W1-S16384", 1, 16384, "freed"): _QWEN3_FSDP2_HOST,
}
"""W = 1 step times outside ``TIME_TOLERANCE`` today (on any run of the key), each with its reason. The
nine FSDP2 W = 1 steps are 0.90-1.14 of the calibrating instance (``planner.timing.baseline_host``)."""


def test_w1_step_time_within_tolerance(records):
    """Every real (W = 1) step's predicted time is within ``TIME_TOLERANCE`` of the measured median,
    except the listed gaps; a listed gap that closed fails too. A key measured in several runs is
    judged on every run."""
    timed = [r for r in records if r["W"] == 1 and r["step_s_measured"] and r["step_s_predicted"]]
    assert len({(r["model"], r["S"]) for r in timed if r["stack"] == "composed"}) >= 9
    off = {_key(r) for r in timed if not time_ok(r["step_s_predicted"], r["step_s_measured"])}
    assert sorted(off - set(KNOWN_SLOW)) == []
    assert sorted(set(KNOWN_SLOW) - off) == []
