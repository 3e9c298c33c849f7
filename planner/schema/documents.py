"""Reading a YAML or JSON document and validating it against a schema, with one-line errors.

- ``read_structured(path)``: parse a bounded YAML/JSON file (size, depth, value count, integer size:
  ``planner.schema.read_bounds``).
- ``validate(cls, data, prefix)``: ``cls.model_validate`` with pydantic's first error as an
  ``InvalidPlan`` naming the field, the value and the fix (``validation_error``).

The lowest layer of the schema's input: ``planner.schema.profiles``, ``hf_import``, ``cluster_ref``
and ``io`` read through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import InvalidPlan
from planner.schema.read_bounds import DuplicateKey, _check_values, _check_yaml_depth, _Loader, _read_bytes, _too_deep


_BOUND_PROBLEMS = {
    "greater_than": ("gt", "must be > {}"), "greater_than_equal": ("ge", "must be >= {}"),
    "less_than": ("lt", "must be < {}"), "less_than_equal": ("le", "must be <= {}"),
}
"""pydantic constraint error types → (ctx key, problem wording)."""


def validation_error(exc: ValidationError, prefix: str) -> InvalidPlan:
    """Turn pydantic's first error into a one-line ``InvalidPlan``.

    ``prefix`` names the document (``model``, ``cluster``, ``planfile``); an empty prefix means the
    error's location is already the full path (``plan.world_size``, ``workload.seq_len``).
    """
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    field = ".".join(x for x in (prefix, loc) if x) or "input"
    kind = err.get("type", "")
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return InvalidPlan(field, None, "is missing", "add the field")
    if kind == "extra_forbidden":
        return InvalidPlan(field, value, "is not a known key",
                           f"remove it or check its spelling in {prefix or loc.split('.')[0]}")
    if isinstance(ctx.get("error"), InvalidPlan):
        return ctx["error"]
    if kind in _BOUND_PROBLEMS:
        key, wording = _BOUND_PROBLEMS[kind]
        bound = ctx.get(key)
        relation = wording.removeprefix("must be ").format(bound)
        return InvalidPlan(field, value, wording.format(bound), f"give a value {relation}")
    if kind == "finite_number":
        return InvalidPlan(field, value, "must be a finite number", "give a finite value")
    if kind == "measured_without_provenance":
        return InvalidPlan(f"{field}.provenance", None, "is required when status is 'measured'",
                           "add device, date and command, or mark the value 'assumed'")
    if kind == "int_not_bool":
        return InvalidPlan(field, value, "must be an integer, not a boolean", "write a number")
    if kind == "int_not_str":
        return InvalidPlan(field, value, "must be an integer, not a string",
                           "write a plain integer without quotes (131072, not '131072', 128k or 1.31072e5)")
    if kind == "int_not_float":
        return InvalidPlan(field, value, "must be an integer, not a decimal number",
                           "write a plain integer (8, not 8.0; 131072, not 1.31072e5)")
    if kind == "float_not_bool":
        return InvalidPlan(field, value, "must be a number, not a boolean", "write a number")
    msg = err.get("msg", "is invalid")
    msg = msg[0].lower() + msg[1:] if msg else msg
    return InvalidPlan(field, value, msg.removeprefix("value error, "), "correct the value")


def validate(cls: type[BaseModel], data: Any, prefix: str):
    """``cls.model_validate(data)`` with errors as ``InvalidPlan``."""
    if not isinstance(data, dict):
        raise InvalidPlan(prefix, type(data).__name__, "must be a mapping", "write key: value pairs")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, prefix) from None
    except InvalidPlan:
        raise


def read_structured(path: str | Path) -> Any:
    """Parse a YAML or JSON file. Raises ``InvalidPlan`` if missing, not a regular file, too large,
    too deep, expanding to too many values, holding an oversized integer, malformed, stating a
    mapping key twice, or empty (nothing but comments and blank lines)."""
    p = Path(path)
    text = _read_bytes(p).decode("utf-8", errors="replace")
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            _check_yaml_depth(p, text)
            data = yaml.load(text, Loader=_Loader)
    except DuplicateKey as e:
        raise InvalidPlan(str(p), f"key {e.key!r}",
                          f"states the key twice (lines {e.first_line} and {e.line}; YAML would keep the last)",
                          "keep one of them") from None
    except json.JSONDecodeError as e:
        raise InvalidPlan(str(p), f"line {e.lineno} column {e.colno}", f"is not valid JSON: {e.msg}",
                          "fix the syntax") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "?"
        problem = getattr(e, "problem", None) or "syntax error"
        raise InvalidPlan(str(p), where, f"is not valid YAML: {problem}", "fix the syntax") from None
    except RecursionError:
        raise _too_deep(p, "?") from None
    except InvalidPlan:          # the depth check's own refusal (an InvalidPlan is a ValueError too)
        raise
    except ValueError as e:      # Python's limit on integer digits, in either parser
        raise InvalidPlan(str(p), "an integer", f"cannot be read: {str(e).split(';')[0]}",
                          "give a value below 2^62") from None
    if data is None:
        what = "is empty" if not text.strip(" \t\r\n\ufeff") else "is empty (only comments, blank lines or null)"
        raise InvalidPlan(str(p), "", what, "write the document's key: value pairs")
    _check_values(p, data)
    return data
