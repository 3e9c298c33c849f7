"""The plan file: one YAML document ``{schema_version, model, cluster, workload, plan}``.

``search --out`` writes it; ``check --plan`` and ``validate`` read it unchanged (DESIGN §10).
"""

from __future__ import annotations

from pydantic import field_validator

from planner.schema.base import SCHEMA_VERSION, Frozen, check_schema_version
from planner.schema.cluster import ClusterSpec
from planner.schema.model import ModelSpec
from planner.schema.plan import Plan
from planner.schema.workload import Workload


class PlanFile(Frozen):
    """A complete, resolved launch configuration."""

    schema_version: int = SCHEMA_VERSION
    """Schema version of this file."""
    model: ModelSpec
    """The model architecture."""
    cluster: ClusterSpec
    """The cluster profile the verdict used."""
    workload: Workload
    """Sequence length and batch."""
    plan: Plan
    """Degrees and operator choices, fully resolved (no ``None`` left)."""

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        return check_schema_version(v)
