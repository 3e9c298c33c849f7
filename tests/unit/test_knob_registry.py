"""One source per knob (issue 14): every knob default lives in the plan schema, and the CLI, api and
``Ctx`` derive theirs from the registry (``planner.schema.knobs``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from planner.schema.knobs import BASELINE_KEYS, COMPOSED_KEYS, KNOBS, PLAN_KEYS, default, enum_of

ROOT = Path(__file__).resolve().parents[2]
DECLARED_IN = ROOT / "planner" / "schema" / "plan.py"
"""The one file allowed to write a knob's default as a literal."""
SCANNED = [ROOT / "planner", ROOT / "calibration", ROOT / "bench"]
ALIASES = {"alpha": "llep_alpha", "min_tokens": "llep_min_tokens", "lam": "llep_lambda", "K_max": "max_chunks",
           "n_imp": "max_imports"}
"""Parameter names the operators, plans and traces give a knob (``plan_layer(alpha=…)``)."""
DELIBERATE = {
    ("planner/api/search.py", "stack"): "search's --stack (best | composed | fsdp2), not the plan's stack",
    ("planner/context/ctx.py", "seq_parallel"): "no split: the FSDP2 Ctx has no D (resolved plans set it)",
    ("planner/context/ctx.py", "expert_parallel"): "no split until resolved (the knob's default is derived)",
    ("planner/context/ctx.py", "vocab_parallel"): "no split until resolved (the knob's default is derived)",
    ("planner/context/ctx.py", "sco_host_bytes"): "no SCO budget outside SCO (the knob's default is derived)",
    ("planner/context/ctx.py", "dp_shard"): "no split until resolved (the knob's default is derived)",
    ("planner/context/ctx.py", "ep"): "no split until resolved (the knob's default is derived)",
    ("planner/plans/routing.py", "expert_parallel"): "a routing profile's rank count, 1 = one rank",
    ("planner/runtime/fsdp2_layout.py", "dp_shard"): "a layout's neutral degree (resolved plans set it)",
    ("planner/runtime/fsdp2_layout.py", "ep"): "a layout's neutral degree (resolved plans set it)",
    ("planner/runtime/fsdp2_trace.py", "grad_lifetime"): "validate runs steps with set_to_none (DESIGN §2)",
    ("planner/runtime/step_trace.py", "grad_lifetime"): "validate runs steps with set_to_none (DESIGN §2)",
    ("planner/runtime/model.py", "checkpoint"): "a bare Decoder checkpoints nothing unless asked",
    ("planner/runtime/model.py", "head"): "the Decoder's head module kind, not the baseline's head knob",
    ("planner/runtime/vocab_trace.py", "dtype"): "the vocab trace's fp32 reference",
    ("planner/schema/curves.py", "dtype"): "a measured curve's dtype (bf16 | fp16 | fp32), not the activation dtype",
    ("planner/timing/compute.py", "dtype"): "a GEMM table's dtype, not the activation dtype",
    ("planner/timing/flops.py", "tp"): "no tensor parallelism: the composed stack's FLOPs (baseline passes tp)",
    ("planner/timing/regions.py", "tp"): "attention_region: no tensor parallelism unless the baseline passes tp",
    ("planner/timing/regions.py", "cp"): "attention_region: no context parallelism unless the baseline passes cp",
}
"""``(file, knob)`` whose literal default is another quantity that shares the knob's name (a
neutral degree, another command's choice), with the reason. Each entry must still be found, so the
list only shrinks."""


def _literal(node) -> bool:
    """A constant (or a negated / tuple constant): a default written out, not derived."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    return False


def declared_defaults(tree: ast.AST):
    """``(knob, line)`` of every parameter, keyword-only parameter or annotated class field named
    after a knob (or an ``ALIASES`` name) whose default is a literal."""
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = [*zip(pos[len(pos) - len(a.defaults):], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
            pairs = [(arg.arg, d) for arg, d in pairs if d is not None]
        elif isinstance(node, ast.ClassDef):
            pairs = [(st.target.id, st.value) for st in node.body if isinstance(st, ast.AnnAssign)
                     and isinstance(st.target, ast.Name) and st.value is not None]
        for name, d in pairs:
            knob = ALIASES.get(name, name)
            if knob in KNOBS and _literal(d):
                yield knob, d.lineno


def _files():
    for base in SCANNED:
        for p in sorted(base.rglob("*.py")):
            if p != DECLARED_IN:
                yield p


def _found() -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for p in _files():
        for name, line in declared_defaults(ast.parse(p.read_text())):
            out.setdefault((str(p.relative_to(ROOT)), name), []).append(line)
    return out


def test_no_knob_default_is_declared_twice():
    found = _found()
    again = [f"{f}:{lines}: {name}" for (f, name), lines in sorted(found.items()) if (f, name) not in DELIBERATE]
    assert not again, ("knob defaults written again outside planner/schema/plan.py (use "
                       "planner.schema.knobs.default):\n" + "\n".join(again))
    stale = sorted(set(DELIBERATE) - set(found))
    assert not stale, f"DELIBERATE lists defaults no longer written (drop them): {stale}"


def test_the_scan_catches_a_second_declaration():
    """The scan is not vacuous: a signature, a keyword-only argument and a dataclass field that
    repeat a default are all found; derived ones are not."""
    src = ("def f(token_budget=4096, *, lam=1.3, max_chunks=default('max_chunks')): ...\n"
           "class C:\n    staging_slots: int = 2\n    vocab_blocks: int = default('vocab_blocks')\n")
    assert sorted(n for n, _ in declared_defaults(ast.parse(src))) == ["llep_lambda", "staging_slots", "token_budget"]


def test_registry_partitions_the_plan_schema():
    from planner.schema.plan import BaselineKnobs, ComposedKnobs

    assert COMPOSED_KEYS == set(ComposedKnobs.model_fields) and BASELINE_KEYS == set(BaselineKnobs.model_fields)
    assert PLAN_KEYS == {"stack", "routing", "dispatch_bound", "dtype"}
    assert not (COMPOSED_KEYS & BASELINE_KEYS)


@pytest.mark.parametrize("name", [n for n, k in KNOBS.items() if k.choices])
def test_cli_enums_are_the_plan_literals(name):
    assert tuple(e.value for e in enum_of(name)) == KNOBS[name].choices


def test_ctx_defaults_are_the_registry_defaults():
    import dataclasses

    from planner.context.ctx import Ctx

    for f in dataclasses.fields(Ctx):
        if f.name in KNOBS and default(f.name) is not None and f.default is not dataclasses.MISSING:
            assert f.default == default(f.name), f.name
