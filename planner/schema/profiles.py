"""Loading a model or cluster by shipped profile name or file path.

- ``load_model(ref)``: a shipped profile name (``gpt-oss-20b``), a model YAML, or a Hugging Face
  ``config.json`` (``planner.schema.hf_import``).
- ``load_cluster(ref)``: a shipped cluster name (``h200``) or a cluster YAML.
- ``shipped(kind)``: the shipped profile names.

Every failure is an ``InvalidPlan`` naming the reference, the value and the fix. ``planner.schema.io``
re-exports all of these.
"""

from __future__ import annotations

import functools
import os
from importlib.resources import files
from pathlib import Path

from planner.errors import InvalidPlan
from planner.schema.cluster import ClusterSpec
from planner.schema.curves import check_devices
from planner.schema.documents import read_structured, validate
from planner.schema.hf_import import default_profile_name, import_hf
from planner.schema.model import ModelSpec

PROFILES_DIR = Path(os.environ.get("MOE_PLANNER_PROFILES") or str(files("planner") / "profiles"))
"""Folder of the shipped profiles (``models/``, ``clusters/``, ``hf-configs/``), package data of
``planner`` (``planner/profiles``); ``MOE_PLANNER_PROFILES`` overrides."""


def shipped(kind: str) -> list[str]:
    """Names of the shipped profiles of ``kind`` (``models`` or ``clusters``).

    Raises:
        InvalidPlan: ``MOE_PLANNER_PROFILES`` names a folder without ``kind/`` (every shipped name
            would be unknown, and ``planner models`` an empty table).
    """
    d = PROFILES_DIR / kind
    if not d.is_dir() and os.environ.get("MOE_PLANNER_PROFILES"):
        raise InvalidPlan("MOE_PLANNER_PROFILES", os.environ["MOE_PLANNER_PROFILES"],
                          f"names no folder of profiles (it has no {kind}/ folder)",
                          "unset it to use the shipped profiles, or point it at a copy of planner/profiles")
    return sorted(p.stem for p in d.glob("*.yaml") if not p.stem.startswith("_"))


def _looks_like_path(ref: str) -> bool:
    """A file reference rather than a shipped profile name: a YAML/JSON suffix (any case), a
    folder separator, or an existing file that no shipped profile is named after."""
    if ref.lower().endswith((".yaml", ".yml", ".json")) or os.sep in ref:
        return True
    try:
        return os.path.lexists(ref) and not any(_is_file(PROFILES_DIR / k / f"{ref}.yaml") for k in ("models", "clusters"))
    except ValueError:          # a NUL byte: not a file name
        return False


def _is_file(path: Path) -> bool:
    """``path.is_file()``, false too for a name the file system refuses (longer than 255 bytes)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _what_else(data: dict) -> str | None:
    """What a mapping that is not a cluster profile holds: a plan file, a model profile, a Hugging
    Face config (``None``: it may be a cluster profile)."""
    if "topology" in data:
        return None
    if {"plan", "workload"} & set(data):
        return "plan"
    if "num_layers" in data or "num_hidden_layers" in data or "model_type" in data:
        return "model"
    return None


def load_model(ref: str) -> ModelSpec:
    """Load a model by profile name, YAML file, or Hugging Face ``config.json``."""
    return load_model_noted(ref)[0]


def load_model_noted(ref: str) -> tuple[ModelSpec, list[str]]:
    """``load_model`` and the Hugging Face importer's warnings (one line each; none for profiles)."""
    if not ref.strip():
        raise InvalidPlan("MODEL", ref, "is empty", "give a shipped profile name, a YAML or a config.json path")
    if not _looks_like_path(ref):
        path = PROFILES_DIR / "models" / f"{ref}.yaml"
        if not _is_file(path):
            raise InvalidPlan("MODEL", ref, "is not a shipped model profile",
                              f"use one of: {', '.join(shipped('models'))}, or a YAML / config.json path")
        return validate(ModelSpec, read_structured(path), "model"), []
    data = read_structured(ref)
    if not isinstance(data, dict):
        raise InvalidPlan(ref, type(data).__name__, "is not a model profile (it holds no key: value mapping)",
                          "give a model YAML, a Hugging Face config.json or a shipped name")
    if isinstance(data, dict) and {"plan", "workload"} & set(data) and "num_layers" not in data:
        raise InvalidPlan("MODEL", ref, "is a plan file, not a model profile",
                          f"pass it with --plan {ref} (flags override its fields)")
    if isinstance(data, dict) and "topology" in data and "num_layers" not in data:
        raise InvalidPlan("MODEL", ref, "is a cluster profile, not a model profile",
                          f"pass it with --cluster {ref} and give a model")
    if isinstance(data, dict) and "num_layers" not in data and "name" not in data:
        return import_hf(data, name=default_profile_name(ref))
    return validate(ModelSpec, data, "model"), []


def load_cluster(ref: str, field: str = "--cluster") -> ClusterSpec:
    """Load a cluster profile by name or YAML path (``field`` names where ``ref`` was given)."""
    if not ref.strip():
        raise InvalidPlan(field, ref, "is empty", f"use one of: {', '.join(shipped('clusters'))}, or a YAML path")
    path = Path(ref) if _looks_like_path(ref) else PROFILES_DIR / "clusters" / f"{ref}.yaml"
    if not _looks_like_path(ref) and not _is_file(path):
        raise InvalidPlan(field, ref, "is not a shipped cluster profile",
                          f"use one of: {', '.join(shipped('clusters'))}, or a YAML path")
    data = read_structured(path)
    if not isinstance(data, dict):
        raise InvalidPlan(str(path), type(data).__name__, "is not a cluster profile (it holds no key: value mapping)",
                          f"give a cluster profile YAML (planner calibrate writes one) or one of: "
                          f"{', '.join(shipped('clusters'))}")
    other = _what_else(data)
    if other == "plan":
        raise InvalidPlan(field, ref, "is a plan file, not a cluster profile",
                          f"pass it with --plan {ref} (it names its cluster itself), or give --cluster "
                          f"{' or '.join(shipped('clusters'))} or a cluster YAML")
    if other == "model":
        raise InvalidPlan(field, ref, "is a model (a profile or a Hugging Face config), not a cluster profile",
                          f"give it as MODEL (planner check {ref} ...), and --cluster "
                          f"{' or '.join(shipped('clusters'))} or a cluster YAML")
    spec = validate(ClusterSpec, data, "cluster")
    try:
        check_devices(spec.curves, spec.topology.gpu_name)
    except InvalidPlan:
        raise
    except ValueError as e:
        raise InvalidPlan(f"cluster {ref}", spec.topology.gpu_name, str(e), "re-run planner calibrate on this cluster") from None
    return spec


@functools.lru_cache(maxsize=None)
def shipped_cluster_for(gpu_name: str) -> str | None:
    """The shipped cluster profile whose ``topology.gpu_name`` is ``gpu_name`` (a measurement is
    predicted with the profile of the GPU it ran on), ``None`` when none is."""
    return next((name for name in shipped("clusters") if load_cluster(name).topology.gpu_name == gpu_name), None)
