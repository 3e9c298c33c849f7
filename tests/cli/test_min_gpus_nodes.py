"""``min-gpus`` with a ``--gpus-per-node`` that is not a power of two answers a ``W`` that fills whole
nodes (or part of one), so ``planner search --gpus W`` accepts it instead of refusing it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner import api
from planner.api.sweep import world_sizes

ROOT = Path(__file__).resolve().parents[2]
MODEL = "olmoe-1b-7b"
SEQ_LEN = "4m"
"""Long enough that the answer is above one node of 3 GPUs (it was W = 4 before: not whole nodes)."""


def _run(*args) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("g", [1, 3, 6, 8, 12, 72])
def test_world_sizes_fill_whole_nodes(g):
    ws = world_sizes(4096, g)
    assert ws == sorted(set(ws)) and ws[0] == 1 and ws[-1] <= 4096 < 2 * ws[-1]
    assert all(w < g or w % g == 0 for w in ws)
    assert all(w & (w - 1) == 0 for w in ws if w < g)
    assert all((w // g) & (w // g - 1) == 0 for w in ws if w >= g)


def test_world_sizes_are_the_powers_of_two_for_a_power_of_two_node():
    for m in (1, 5, 8, 100, 4096):
        assert world_sizes(m, 8) == [1 << k for k in range(m.bit_length()) if 1 << k <= m]


def test_min_gpus_odd_node_answers_a_count_search_accepts():
    res = _run("min-gpus", MODEL, "--seq-len", SEQ_LEN, "--gpus-per-node", "3", "--json", "--no-progress")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    W = doc["min_gpus"]
    assert W is not None and W > 3 and W % 3 == 0
    assert all(r["world_size"] < 3 or r["world_size"] % 3 == 0 for r in doc["tried"])
    rows = {r["world_size"]: r for r in doc["tried"]}
    assert rows[W]["composed_fit"] > 0 and all(rows[w]["composed_fit"] == 0 for w in rows if w < W)
    rep = api.search(model=MODEL, gpus=W, seq_len=4 << 20, top=1, cluster_overrides={"gpus_per_node": 3})
    assert rep.result.top
    bad = _run("search", MODEL, "--gpus", "4", "--seq-len", SEQ_LEN, "--gpus-per-node", "3", "--no-progress")
    assert bad.returncode == 2 and "whole nodes" in bad.stderr and "Traceback" not in bad.stderr
