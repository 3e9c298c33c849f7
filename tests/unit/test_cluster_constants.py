"""The registry of cluster constants (``planner.schema.cluster_constants``) is the one source: the
profile schema, the calibration's unmeasured defaults, the merge rule and the verdict's list of
constants used all come from it, and its ``used_by``/``measured_by`` match the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from planner.budget.peak import assumed_used, constants_used
from planner.schema import cluster_constants as reg
from planner.schema.cluster import Constant, MemoryConstants

ROOT = Path(__file__).resolve().parents[2]
READ = re.compile(r"\b(?:mem|memory)\.(\w+)\b")
"""How the planner reads a constant: ``mem.NAME`` / ``cluster.memory.NAME``."""


def _planner_reads() -> dict[str, set[str]]:
    """``constant → planner modules that read it`` (a static scan of ``planner/``, runtime excluded)."""
    out: dict[str, set[str]] = {c.name: set() for c in reg.CONSTANTS}
    for path in sorted((ROOT / "planner").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] in ("runtime", "schema"):
            continue
        mod = ".".join(rel.with_suffix("").parts)
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        for name in READ.findall(code):
            if name in out:
                out[name].add(mod)
    return out


def test_schema_fields_are_the_registry():
    fields = [n for n, f in MemoryConstants.model_fields.items() if f.annotation is Constant]
    assert fields == [c.name for c in reg.CONSTANTS]
    for c in reg.CONSTANTS:
        assert MemoryConstants.model_fields[c.name].description == c.doc


def test_used_by_matches_the_code():
    """Every planner module that reads a constant is in its ``used_by``, and nothing else is: a new
    read that is not declared fails here, so the verdict's assumed list cannot silently miss it."""
    reads = _planner_reads()
    for c in reg.CONSTANTS:
        assert reads[c.name] == set(c.used_by), f"{c.name}: read by {sorted(reads[c.name])}, declared {c.used_by}"


def test_measured_by_names_a_real_function():
    """A policy is never measured; a measured constant names the function that measures it (empty:
    no measurement yet, the constant stays assumed)."""
    for c in reg.CONSTANTS:
        if c.default_status == "policy":
            assert not c.measured_by, c.name
        if not c.measured_by:
            continue
        mod, fn = c.measured_by.split(":")
        tree = ast.parse((ROOT / Path(*mod.split("."))).with_suffix(".py").read_text())
        assert fn in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, c.measured_by


def test_omitted_constant_holds_its_unmeasured_default(h200):
    doc = h200.model_dump(mode="json")
    doc["memory"].pop("pin_seconds_per_gib")
    doc["memory"].pop("reserve_fraction")
    mem = type(h200).model_validate(doc).memory
    pin, res = reg.BY_NAME["pin_seconds_per_gib"], reg.BY_NAME["reserve_fraction"]
    assert (mem.pin_seconds_per_gib.value, mem.pin_seconds_per_gib.status) == (pin.default, "assumed")
    assert (mem.reserve_fraction.value, mem.reserve_fraction.status) == (res.default, "policy")


@pytest.mark.parametrize("W", [1, 8])
def test_every_assumed_constant_a_verdict_reads_is_reported(h200, W):
    """Mark every constant assumed: the verdict lists exactly those it reads (at ``W = 1`` no NCCL)."""
    from synthetic_profiles import ctx_of, tiny_model

    mem = {c.name: Constant(value=c.default, status="assumed") for c in reg.CONSTANTS}
    cluster = h200.model_copy(update={"memory": h200.memory.model_copy(update=mem)})
    ctx = ctx_of(tiny_model(), cluster, W=W)
    used = [c.name for c in reg.CONSTANTS if c.used_by and (W > 1 or c.used_when == "always")]
    assert sorted(constants_used(ctx)) == sorted(used)
    assert ("nccl_buffer_bytes" in constants_used(ctx)) == (W > 1)
    listed = [a for a in assumed_used(ctx) if a.startswith("memory.")]
    assert sorted(listed) == sorted(f"memory.{n}" for n in used)
    assert "memory.pin_seconds_per_gib" not in listed       # measured or not, no verdict reads it
