"""``planner.runtime.allocator``: a run of a plan puts the caching allocator in its cluster file's
mode, and says so (the H200 runs in ``bench/results/allocator_modes/`` show why)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from planner.errors import InvalidPlan
from planner.runtime import allocator

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "allocator_modes"
LARGE_POOL_SPLIT_BYTES = 2 ** 20
"""``kSmallSize`` of ``c10/cuda/CUDACachingAllocator.cpp``: in the default mode a large-pool block is
split only when more than this would remain, so one tensor can hold up to this much beyond its
request; with ``expandable_segments:True`` a block is split whenever 512 B remain."""


def _torch(calls: list, with_setter: bool = True, new_api: bool = False):
    setter = {"_set_allocator_settings": calls.append} if with_setter and not new_api else {}
    c = types.SimpleNamespace(**({"_accelerator_setAllocatorSettings": calls.append} if new_api else {}))
    return types.SimpleNamespace(cuda=types.SimpleNamespace(memory=types.SimpleNamespace(**setter)), _C=c,
                                 __version__="x")


def test_the_torch_c_setter_is_preferred(monkeypatch):
    for v in allocator.ENV_VARS:
        monkeypatch.delenv(v, raising=False)
    calls: list = []
    allocator.configure(_torch(calls, new_api=True), True)
    assert calls == ["expandable_segments:True"]


@pytest.mark.parametrize("on", [True, False])
def test_configure_sets_the_cluster_mode(on, monkeypatch):
    for v in allocator.ENV_VARS:
        monkeypatch.delenv(v, raising=False)
    calls: list = []
    line = allocator.configure(_torch(calls), on)
    assert calls == [f"expandable_segments:{on}"]
    assert line.startswith(f"allocator: expandable_segments:{on} ") and "overridden" not in line


def test_a_contrary_environment_setting_is_named(monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False,max_split_size_mb:512")
    line = allocator.configure(_torch([]), True)
    assert "'expandable_segments:False,max_split_size_mb:512' is overridden" in line


def test_bad_mode_and_old_torch_are_refused():
    with pytest.raises(InvalidPlan, match="memory.expandable_segments"):
        allocator.configure(_torch([]), "yes")
    with pytest.raises(InvalidPlan, match="cannot set the CUDA allocator"):
        allocator.configure(_torch([], with_setter=False), True)


def _runs():
    return {(d["case"], d["mode"]): d for d in json.loads((RESULTS / "allocator_modes.json").read_text())["cases"]
            if "marks" in d}


def test_expandable_mode_holds_what_the_tensors_request():
    """H200: in the cluster's mode the allocator counts at most a few rounding bytes per tensor beyond
    the requests at every phase start; the default mode held 5.08 MiB more at DeepSeek W = 64's step
    start (the 11 MiB expert shards in unsplit 12 MiB blocks)."""
    runs = _runs()
    for (case, mode), d in runs.items():
        gaps = [m["allocated"] - m["requested"] for m in d["marks"].values()]
        assert min(gaps) >= 0, case
        if mode == "expandable":   # rounding remainders only: together less than one unsplit block's
            assert max(gaps) < LARGE_POOL_SPLIT_BYTES, (case, max(gaps))
    ss = runs[("fsdp2-dsv2-W64-full", "default")]["marks"]["step start"]
    assert ss["allocated"] - ss["requested"] > LARGE_POOL_SPLIT_BYTES   # several unsplit blocks
    assert runs[("fsdp2-dsv2-W64-full", "expandable")]["worst_row"]["ratio"] > 0.999
