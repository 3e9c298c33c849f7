"""The knob registry: one declaration per knob, read from the plan schema (``planner.schema.plan``).

Every knob is declared once, as a field of ``Plan``, ``ComposedKnobs`` or ``BaselineKnobs``: its
name, type, default, bounds and docstring there, and its command-line form in a ``Cli`` annotation.
Everything else is derived from here: the CLI options and their enums (``planner.cli``), the
override key sets of the api, the flag → plan translation (``plan_overrides``), the refusal of inert
knobs (``check_inert``) and the defaults of ``Ctx`` and of the operators' signatures
(``default``). ``tests/unit/test_knob_registry.py`` fails when a knob default is declared again.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Any

from pydantic.fields import FieldInfo

from planner.schema.base import MAX_BYTES
from planner.schema.plan import BaselineKnobs, Cli, ComposedKnobs, Plan

PARTS = {"plan": Plan, "composed": ComposedKnobs, "baseline": BaselineKnobs}
"""Where a knob lands in a plan: ``plan`` itself, ``plan.composed`` or ``plan.baseline``."""
_NOT_KNOBS = {"world_size", "composed", "baseline"}
"""``Plan`` fields that are no knobs: the world size (``--gpus``) and the two knob groups."""


@dataclass(frozen=True)
class Knob:
    """One knob, as declared in the plan schema."""

    name: str
    part: str
    """``plan``, ``composed`` or ``baseline`` (``PARTS``)."""
    field: FieldInfo
    cli: Cli | None
    """Its command-line form; ``None``: set in a plan file only."""

    @property
    def default(self) -> Any:
        return self.field.default

    @property
    def annotation(self) -> Any:
        return self.field.annotation

    @property
    def doc(self) -> str:
        return self.field.description or ""

    @property
    def path(self) -> str:
        """Where the knob sits in a plan file: ``plan.dtype``, ``plan.composed.token_budget``."""
        return f"plan.{self.name}" if self.part == "plan" else f"plan.{self.part}.{self.name}"

    @property
    def flag(self) -> str:
        return (self.cli.flag if self.cli and self.cli.flag else None) or "--" + self.name.replace("_", "-")

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The values of a ``Literal`` knob (``None`` for a numeric one)."""
        args = typing.get_args(self.annotation)
        return args if typing.get_origin(self.annotation) is typing.Literal else None


def _collect() -> dict[str, Knob]:
    out: dict[str, Knob] = {}
    for part, cls in PARTS.items():
        for name, f in cls.model_fields.items():
            if part == "plan" and name in _NOT_KNOBS:
                continue
            assert name not in out, f"knob {name} declared in two parts"
            cli = next((m for m in f.metadata if isinstance(m, Cli)), None)
            out[name] = Knob(name, part, f, cli)
    return out


KNOBS: dict[str, Knob] = _collect()
"""Every knob, by name, in declaration order (plan, composed, baseline)."""
PLAN_KEYS = frozenset(n for n, k in KNOBS.items() if k.part == "plan")
COMPOSED_KEYS = frozenset(n for n, k in KNOBS.items() if k.part == "composed")
BASELINE_KEYS = frozenset(n for n, k in KNOBS.items() if k.part == "baseline")
ALIASES = {"expert_parallel": "ep"}
"""A composed knob that means a baseline knob under ``stack: fsdp2`` (``--expert-parallel``)."""


def default(name: str) -> Any:
    """The declared default of knob ``name`` (``None``: derived when the plan is resolved)."""
    return KNOBS[name].default


def enum_of(name: str) -> type[Enum]:
    """A ``str`` enum of a ``Literal`` knob's choices, for typer (derived, never repeated)."""
    choices = KNOBS[name].choices
    assert choices, name
    return Enum(f"{name.title().replace('_', '')}Choice", {c: c for c in choices}, type=str)


def flag_of(name: str) -> str:
    """The command-line flag of a knob (its name for the plan-file-only ones)."""
    return KNOBS[name].flag if name in KNOBS else "--" + name.replace("_", "-")


def parse_flag(name: str, value: Any) -> Any:
    """A knob's typed command-line value in plan units (``Cli.parse``).

    Raises:
        InvalidPlan: a malformed count, parameter count or GiB budget.
    """
    from planner.errors import InvalidPlan
    from planner.units import GiB, parse_count, parse_params

    value = value.value if isinstance(value, Enum) else value
    parse = KNOBS[name].cli.parse if KNOBS[name].cli else "plain"
    if parse == "count":
        return parse_count(value, flag_of(name))
    if parse == "params":
        return parse_params(value, flag_of(name))
    if parse == "gib":
        if not math.isfinite(value) or value < 0:
            raise InvalidPlan(flag_of(name), value, "must be >= 0 and finite", "give a budget in GiB, e.g. 64")
        if value > MAX_BYTES // GiB:      # refused here, in GiB: the schema's bound would name bytes
            raise InvalidPlan(flag_of(name), value, f"must be <= {MAX_BYTES // GiB} GiB (2^60 bytes)",
                              "give a budget in GiB, e.g. 64")
        return int(Decimal(repr(value)) * GiB)
    return value


def plan_overrides(flags: dict[str, Any], *, baseline: bool = False) -> dict[str, Any]:
    """The knob flags a user typed (``None``/``False`` = not given) → plan overrides, in plan
    units; ``baseline`` selects the FSDP2 stack (``--baseline``). The one place flags become plan
    values; which stack's field a flag lands in (``ALIASES``) is ``stack_overrides``'s, in
    ``api.build``, for flags and api callers alike."""
    ov = {k: parse_flag(k, v) for k, v in flags.items() if v is not None and v is not False}
    if baseline:
        ov["stack"] = "fsdp2"
    return ov


def _alias(ov: dict) -> None:
    """Under the FSDP2 baseline, a composed knob's flag names its baseline twin (``ALIASES``)."""
    for a, b in ALIASES.items():
        if a in ov:
            ov.setdefault(b, ov.pop(a))


def stack_overrides(ov: dict, stack: str) -> dict:
    """Reject overrides of the stack that is not evaluated (they would be silently ignored);
    ``expert_parallel`` means ``ep`` for the FSDP2 baseline (``ALIASES``).

    Raises:
        InvalidPlan: a baseline knob for the composed stack, or a composed knob for the baseline.
    """
    from planner.errors import InvalidPlan

    ov = dict(ov)
    if stack == "fsdp2":
        _alias(ov)
        bad = sorted(set(ov) & COMPOSED_KEYS)
        if bad:
            f = flag_of(bad[0])
            raise InvalidPlan(f, ov[bad[0]], "applies to the composed stack, not the FSDP2 baseline",
                              f"drop {f}, or evaluate the composed stack (no --baseline, or a composed plan file)")
    else:
        bad = sorted(set(ov) & BASELINE_KEYS)
        if bad:
            f = flag_of(bad[0])
            raise InvalidPlan(f, ov[bad[0]], "applies to the FSDP2 baseline only", f"add --baseline, or drop {f}")
    return ov


def check_inert(given: set[str], composed: dict) -> None:
    """Refuse composed knobs in ``given`` (the flags the user typed) that do nothing under the
    operator choices of ``composed`` (its values, defaults for the missing ones; ``Cli.live``).

    Raises:
        InvalidPlan: the first such knob, naming the choice that ignores it.
    """
    from planner.errors import InvalidPlan

    for name in sorted(given & COMPOSED_KEYS):
        cli = KNOBS[name].cli
        if cli is None or cli.live is None:
            continue
        op, live = cli.live
        choice = composed.get(op) or default(op)
        if choice not in live:
            f, typed = flag_of(name), composed.get(name)
            if cli.parse == "gib" and isinstance(typed, (int, float)):   # echo the GiB typed, not bytes
                from planner.units import GiB

                typed = float(typed) / GiB
            raise InvalidPlan(f, typed, f"does nothing with --{op} {choice}",
                              f"drop {f}, or use --{op} {' / '.join(live)}")
