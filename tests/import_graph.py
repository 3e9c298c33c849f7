"""Import graph of ``planner/``, ``calibration/`` and ``bench/``; exits 1 on an import cycle.

Every ``import`` statement counts, at module level or inside a function: a function-level import
breaks a cycle at load time but not in the design, so it does not hide one here.

    python3 tests/import_graph.py            # the cycles (none) and a one-line summary
    python3 tests/import_graph.py --edges    # also every edge, ``a -> b``

``tests/unit/test_architecture.py`` runs ``cycles()``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "calibration", "bench")
"""The trees whose modules are nodes of the graph."""


def module_name(path: Path) -> str:
    """``planner/schema/io.py`` → ``planner.schema.io``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of ``PACKAGES``, by dotted name."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside (``planner.schema.io.validate`` →
    ``planner.schema.io``); ``None`` outside the graph (stdlib, torch, pydantic ...)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The graph modules that ``mod`` imports anywhere in its file (``from pkg import sub`` counts
    ``pkg.sub`` when that is a module)."""
    out: set[str] = set()
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for n in names:
            target = _resolve(n, known)
            if target is not None and target != mod:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    """``module → modules it imports``, over ``PACKAGES``."""
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def cycles(g: dict[str, set[str]] | None = None) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    g = graph() if g is None else g
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        work = [(v, iter(sorted(g.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def main(argv: list[str]) -> int:
    g = graph()
    if "--edges" in argv:
        for m in sorted(g):
            for t in sorted(g[m]):
                print(f"{m} -> {t}")
    found = cycles(g)
    for comp in found:
        print("cycle: " + " <-> ".join(comp))
    print(f"{len(g)} modules, {sum(len(t) for t in g.values())} imports, {len(found)} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
