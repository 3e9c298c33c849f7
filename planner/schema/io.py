"""Reading and writing profiles and plan files, with one-line errors for bad input.

- ``load_model(ref)``: a shipped profile name (``gpt-oss-20b``), a model YAML, or a Hugging Face
  ``config.json``.
- ``load_cluster(ref)``: a shipped cluster name (``h200``) or a cluster YAML.
- ``load_planfile(path)``.
- ``write_yaml_atomic(path, data)``: temp file in the same folder, fsync, ``os.replace``;
  ``check_writable(path)`` fails fast before a long computation.

Every failure is an ``InvalidPlan`` naming the file or field, the value and the fix.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import InvalidPlan, UnwritableOutput
from planner.schema.read_bounds import (MAX_DEPTH, MAX_FILE_BYTES, MAX_INT, MAX_VALUES,  # noqa: F401 - re-exported
                                        _check_values, _check_yaml_depth, _Loader, _read_bytes, _too_deep)
from planner.schema.cluster import ClusterSpec
from planner.schema.model import ModelSpec
from planner.schema.planfile import PlanFile


PROFILES_DIR = Path(os.environ.get("MOE_PLANNER_PROFILES") or str(files("planner") / "profiles"))
"""Folder of the shipped profiles (``models/``, ``clusters/``, ``hf-configs/``), package data of
``planner`` (``planner/profiles``); ``MOE_PLANNER_PROFILES`` overrides."""


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
    too deep, expanding to too many values, holding an oversized integer, or malformed."""
    p = Path(path)
    text = _read_bytes(p).decode("utf-8", errors="replace")
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            _check_yaml_depth(p, text)
            data = yaml.load(text, Loader=_Loader)
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
    except ValueError as e:      # Python's limit on integer digits, in either parser
        raise InvalidPlan(str(p), "an integer", f"cannot be read: {str(e).split(';')[0]}",
                          "give a value below 2^62") from None
    _check_values(p, data)
    return data


def shipped(kind: str) -> list[str]:
    """Names of the shipped profiles of ``kind`` (``models`` or ``clusters``)."""
    d = PROFILES_DIR / kind
    return sorted(p.stem for p in d.glob("*.yaml") if not p.stem.startswith("_"))


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml", ".json")) or os.sep in ref


def load_model(ref: str) -> ModelSpec:
    """Load a model by profile name, YAML file, or Hugging Face ``config.json``."""
    return load_model_noted(ref)[0]


def load_model_noted(ref: str) -> tuple[ModelSpec, list[str]]:
    """``load_model`` and the Hugging Face importer's warnings (one line each; none for profiles)."""
    if not ref.strip():
        raise InvalidPlan("MODEL", ref, "is empty", "give a shipped profile name, a YAML or a config.json path")
    if not _looks_like_path(ref):
        path = PROFILES_DIR / "models" / f"{ref}.yaml"
        if not path.is_file():
            raise InvalidPlan("MODEL", ref, "is not a shipped model profile",
                              f"use one of: {', '.join(shipped('models'))}, or a YAML / config.json path")
        return validate(ModelSpec, read_structured(path), "model"), []
    data = read_structured(ref)
    if isinstance(data, dict) and {"plan", "workload"} & set(data) and "num_layers" not in data:
        raise InvalidPlan("MODEL", ref, "is a plan file, not a model profile",
                          f"pass it with --plan {ref} (flags override its fields)")
    if isinstance(data, dict) and "topology" in data and "num_layers" not in data:
        raise InvalidPlan("MODEL", ref, "is a cluster profile, not a model profile",
                          f"pass it with --cluster {ref} and give a model")
    if isinstance(data, dict) and "num_layers" not in data and "name" not in data:
        from planner.schema.hf_import import import_hf

        name = Path(ref).parent.name if Path(ref).name == "config.json" else Path(ref).stem
        return import_hf(data, name=name)
    return validate(ModelSpec, data, "model"), []


def load_cluster(ref: str) -> ClusterSpec:
    """Load a cluster profile by name or YAML path."""
    if not ref.strip():
        raise InvalidPlan("--cluster", ref, "is empty", f"use one of: {', '.join(shipped('clusters'))}, or a YAML path")
    path = Path(ref) if _looks_like_path(ref) else PROFILES_DIR / "clusters" / f"{ref}.yaml"
    if not _looks_like_path(ref) and not path.is_file():
        raise InvalidPlan("--cluster", ref, "is not a shipped cluster profile",
                          f"use one of: {', '.join(shipped('clusters'))}, or a YAML path")
    spec = validate(ClusterSpec, read_structured(path), "cluster")
    from planner.schema.curves import check_devices

    try:
        check_devices(spec.curves, spec.topology.gpu_name)
    except ValueError as e:
        raise InvalidPlan(f"cluster {ref}", spec.topology.gpu_name, str(e), "re-run planner calibrate on this cluster") from None
    return spec


def load_planfile(path: str | Path) -> PlanFile:
    """Load a plan file (``search --out`` output); its cluster may be embedded or named by
    ``planner.schema.cluster_ref``."""
    from planner.schema.cluster_ref import read_plan_document  # names its cluster by profile + checksum

    return read_plan_document(str(path))[0]


def _unwritable(path: Path, field: str, why: str) -> UnwritableOutput:
    return UnwritableOutput(field, str(path), why, "give a file path in a folder you can write")


def check_writable(path: str | Path, field: str = "output") -> Path:
    """Fail fast (before a long computation) when ``path`` cannot be written as a file.

    Tries what ``write_bytes_atomic`` will do: a temp file in the target's folder, removed at once.

    Raises:
        InvalidPlan: ``path`` is a directory, its folder is not a directory, or the folder refuses
            a new file.
    """
    p = Path(path)
    if p.is_dir():
        raise _unwritable(p, field, "is a directory")
    parent = p.parent
    if parent.exists() and not parent.is_dir():
        raise _unwritable(p, field, f"has a parent that is not a folder ({parent})")
    if parent.is_dir():
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
        except OSError as e:
            raise _unwritable(p, field, f"cannot be written: {e.strerror or e}") from None
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
    return p


def write_bytes_atomic(path: str | Path, data: bytes, field: str = "output") -> Path:
    """Write bytes atomically: temp file in the target's own folder, fsync, ``os.replace``, fsync of
    the folder.

    The file keeps an existing file's mode, else gets 0666 less the umask (``mkstemp`` alone gives
    0600). An interrupted write leaves the old file intact and no temp file behind; no temp file is
    ever created outside the target's folder.

    Raises:
        UnwritableOutput: (an ``InvalidPlan`` and an ``OSError``) ``path`` is a directory or cannot be
            written (``field`` names the option).
    """
    p = Path(path)
    if p.is_dir():
        raise _unwritable(p, field, "is a directory")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = f"cannot be written: its folder cannot be created ({e.strerror or e})"
        raise _unwritable(p, field, why) from None
    if p.exists():
        mode = p.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        raise _unwritable(p, field, f"cannot be written: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _unwritable(p, field, f"cannot be written: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return p


def write_text_atomic(path: str | Path, text: str, field: str = "output") -> Path:
    """Write UTF-8 text atomically (see ``write_bytes_atomic``)."""
    return write_bytes_atomic(path, text.encode("utf-8"), field)


class _Dumper(yaml.SafeDumper):
    """Safe YAML with scalar lists in flow style (``[1, 2, 3]``) so rate tables stay readable."""


def _represent_list(dumper: yaml.SafeDumper, data):
    flow = all(not isinstance(v, (list, tuple, dict)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", list(data), flow_style=flow)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(tuple, _represent_list)


def dump_yaml(data: Any) -> str:
    """YAML text of plain data, keys in insertion order, scalar lists in flow style."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def write_yaml_atomic(path: str | Path, data: Any, field: str = "output") -> Path:
    """Write ``data`` as YAML atomically (see ``write_bytes_atomic``)."""
    return write_text_atomic(path, dump_yaml(data), field)
