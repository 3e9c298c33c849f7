"""Architecture rules (DESIGN §9): the core never imports torch; imports flow one way; no import
cycle anywhere in ``planner/``, ``calibration/`` or ``bench/`` (``tests/import_graph.py``); the
runtime, calibration and bench import the core only downward; the CLI starts without pandas, scipy
or torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import import_graph  # tests/import_graph.py

ROOT = Path(__file__).resolve().parents[2]
PLANNER = ROOT / "planner"

LAYERS = ["schema", "plans", "context", "budget", "timing", "search", "api", "report", "cli"]
"""``schema → plans → context → budget → timing → search → api/report → cli``: a module may import only
its own layer or earlier ones (api and report share a level). ``context`` is the resolution layer:
the resolved plan and every derived symbol, below both the memory and the time model."""
RANK = {"schema": 0, "errors": 0, "units": 0, "plans": 1, "context": 2, "budget": 3, "timing": 4, "search": 5,
        "api": 6, "report": 6, "cli": 7}


ENTRY_POINTS = {PLANNER / "train.py"}
"""``python -m planner.train``: a re-export of ``planner.runtime.train`` (stands with the runtime)."""


def _core_files():
    return [p for p in PLANNER.rglob("*.py") if "runtime" not in p.relative_to(PLANNER).parts
            and p not in ENTRY_POINTS]


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def _layer(mod_or_rel: str) -> str | None:
    parts = mod_or_rel.split(".")
    if parts[0] != "planner" or len(parts) < 2:
        return None
    return parts[1]


def _module_level_imports(path: Path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_never_imports_torch(path):
    bad = [m for m in _imports(path) if m == "torch" or m.startswith("torch.") or m.startswith("planner.runtime")
           or (m.startswith("calibration") and path != PLANNER / "cli" / "tools.py")]
    assert not bad, f"{path} imports {bad}"


def test_cli_imports_calibration_only_inside_calibrate():
    """``planner calibrate`` needs torch; the module-level CLI must not."""
    assert not [m for m in _module_level_imports(PLANNER / "cli" / "tools.py") if m.startswith("calibration")]


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
    rel = path.relative_to(PLANNER).with_suffix("")
    own = rel.parts[0]
    if own not in RANK:
        return
    for m in _imports(path):
        other = _layer(m)
        if other in RANK:
            assert RANK[other] <= RANK[own], f"{path}: {own} imports {m} (a later layer)"


def test_cli_starts_without_heavy_imports():
    code = ("import sys, planner.cli, planner.api; "
            "print(','.join(m for m in ('torch', 'pandas', 'scipy', 'matplotlib') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "", f"core imported {res.stdout.strip()}"


RUNTIME_MAY_IMPORT = {"schema", "errors", "units", "plans", "context", "budget", "timing", "api"}
"""Core layers the runtime (operators, step harnesses, ``validate``) may import: the schema and plans it
executes, and the model it is checked against; never the search, the report or the CLI."""
CALIBRATION_MAY_IMPORT = {"schema", "errors", "units", "timing", "runtime"}
"""What ``calibration/`` may import from ``planner``: the profile schema, the curve fits it writes
(``planner.timing.curves``) and the runtime it measures; never the budget, search, api or CLI."""


@pytest.fixture(scope="module")
def graph():
    return import_graph.graph()


def test_no_import_cycles(graph):
    """Every import counts, at module level or inside a function (a lazy import only hides a cycle)."""
    assert import_graph.cycles(graph) == []


def test_import_graph_finds_a_cycle():
    """The cycle finder itself: a three-module ring and a self-contained pair are found, a chain is not."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert import_graph.cycles(g) == [["a", "b", "c"], ["d", "e"]]
    assert import_graph.cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _targets(graph, tree: str):
    for mod, targets in sorted(graph.items()):
        if mod == tree or mod.startswith(tree + "."):
            yield mod, targets


def test_runtime_imports_core_downward_only(graph):
    found = list(_targets(graph, "planner.runtime"))
    assert found, "planner.runtime has no modules"
    for mod, targets in found:
        bad = [t for t in targets if t.split(".")[0] in ("calibration", "bench")
               or (t.startswith("planner.") and _layer(t) in RANK and _layer(t) not in RUNTIME_MAY_IMPORT)]
        assert not bad, f"{mod} imports {bad}"


def test_calibration_imports_core_downward_only(graph):
    found = list(_targets(graph, "calibration"))
    assert found, "calibration has no modules"
    for mod, targets in found:
        bad = [t for t in targets if t.startswith("bench")
               or (t.startswith("planner.") and _layer(t) not in CALIBRATION_MAY_IMPORT)]
        assert not bad, f"{mod} imports {bad}"


def test_nothing_imports_bench(graph):
    """``bench/`` is a leaf: its scripts use the planner, the runtime and calibration, never the
    other way round."""
    for tree in ("planner", "calibration"):
        for mod, targets in _targets(graph, tree):
            bad = [t for t in targets if t == "bench" or t.startswith("bench.")]
            assert not bad, f"{mod} imports {bad}"
