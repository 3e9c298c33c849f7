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


_DOCUMENTS = {"PlanFile": "the plan file", "ModelSpec": "a model profile", "ClusterSpec": "a cluster profile"}
"""How an unknown top-level key names the document it sits in (by the schema class read)."""


def _section_keys(cls: type[BaseModel] | None, loc: tuple) -> list[str] | None:
    """The keys the schema allows beside the unknown key at ``loc``: the fields of the model that
    holds it (``None`` when the path leaves the nested models, e.g. through a list)."""
    import typing

    model = cls
    for part in loc[:-1]:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        nested = [a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = nested[0] if nested else None
    return None if model is None else list(model.model_fields)


def _unknown_key(field: str, value: Any, loc: tuple, prefix: str, cls: type[BaseModel] | None) -> InvalidPlan:
    """``plan.composed.bogus (1) is not a known key of plan.composed; fix: remove it (did you mean …?)``."""
    import difflib

    parent = ".".join(x for x in (prefix, *map(str, loc[:-1])) if x)
    where = parent or _DOCUMENTS.get(getattr(cls, "__name__", ""), "the document")
    keys = _section_keys(cls, loc)
    fix = "remove it or check its spelling"
    if keys:
        close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        fix = (f"remove it, or did you mean {close[0]}?" if close else "remove it or check its spelling")
        fix += f" (the keys of {where}: {', '.join(keys)})"
    return InvalidPlan(field, value, f"is not a known key of {where}", fix)


_TYPE_PROBLEMS = {
    "int_type": ("must be an integer", "write a plain integer, e.g. 8"),
    "int_parsing": ("must be an integer", "write a plain integer, e.g. 8"),
    "float_type": ("must be a number", "write a number, e.g. 0.5"),
    "float_parsing": ("must be a number", "write a number, e.g. 0.5"),
    "string_type": ("must be a string", "write text (quote it if YAML reads it as a number or a boolean)"),
    "bool_type": ("must be true or false", "write true or false"),
    "bool_parsing": ("must be true or false", "write true or false"),
    "list_type": ("must be a list", "write a list, e.g. [0, 2, 4]"),
    "tuple_type": ("must be a list", "write a list, e.g. [0, 2, 4]"),
    "dict_type": ("must be a mapping", "write key: value pairs under it"),
    "model_type": ("must be a mapping", "write key: value pairs under it"),
    "model_attributes_type": ("must be a mapping", "write key: value pairs under it"),
}
"""pydantic type-error kinds → (problem, fix): what the field must be, in the file's words."""


def validation_error(exc: ValidationError, prefix: str, cls: type[BaseModel] | None = None) -> InvalidPlan:
    """Turn pydantic's first error into a one-line ``InvalidPlan``.

    ``prefix`` names the document (``model``, ``cluster``, ``planfile``); an empty prefix means the
    error's location is already the full path (``plan.world_size``, ``workload.seq_len``). ``cls``,
    the schema read, lets an unknown key's message list the keys allowed where it stands.
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
        return _unknown_key(field, value, tuple(err.get("loc", ())), prefix, cls)
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
    if kind == "bool_not_other":
        return InvalidPlan(field, value, "must be true or false", "write true or false, without quotes")
    if kind == "float_not_bool":
        return InvalidPlan(field, value, "must be a number, not a boolean", "write a number")
    if kind in _TYPE_PROBLEMS:
        problem, fix = _TYPE_PROBLEMS[kind]
        return InvalidPlan(field, value, problem, fix)
    if kind == "literal_error" and ctx.get("expected"):
        return InvalidPlan(field, value, f"must be one of {ctx['expected']}", "use one of them")
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
        raise validation_error(exc, prefix, cls) from None
    except InvalidPlan:
        raise


JSON_SUFFIX = ".json"
"""Files read (and written) as JSON; every other suffix is YAML."""


def _refuse_json_duplicates(pairs: list) -> dict:
    """``object_pairs_hook`` of ``json.loads``: a JSON object stating a key twice is refused, as a
    YAML mapping is (``json`` would silently keep the last)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def read_structured(path: str | Path) -> Any:
    """Parse a YAML or JSON file. Raises ``InvalidPlan`` if missing, not a regular file, too large,
    too deep, expanding to too many values, holding an oversized integer, malformed, stating a
    mapping key twice, or empty (nothing but comments and blank lines)."""
    p = Path(path)
    raw = _read_bytes(p)
    nul = raw.find(b"\0")
    if nul >= 0:
        raise InvalidPlan(str(p), f"a NUL byte at offset {nul}", "is a binary file, not YAML or JSON text",
                          "give the plan, model or cluster YAML (or a config.json) itself")
    text = raw.decode("utf-8", errors="replace")
    try:
        if p.suffix == JSON_SUFFIX:
            data = json.loads(text, object_pairs_hook=_refuse_json_duplicates)
        else:
            _check_yaml_depth(p, text)
            data = yaml.load(text, Loader=_Loader)
    except DuplicateKey as e:
        where = f"lines {e.first_line} and {e.line}; YAML" if e.line else "JSON"
        raise InvalidPlan(str(p), f"key {e.key!r}", f"states the key twice ({where} would keep the last)",
                          "keep one of them") from None
    except json.JSONDecodeError as e:
        raise InvalidPlan(str(p), f"line {e.lineno} column {e.colno}", f"is not valid JSON: {e.msg}",
                          "fix the syntax") from None
    except yaml.reader.ReaderError as e:      # a control character: the reader names no line
        line = text.count("\n", 0, e.position) + 1
        char = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise InvalidPlan(str(p), f"line {line}", f"is not valid YAML: it holds the control character {char}",
                          "remove the character") from None
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
