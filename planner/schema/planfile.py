"""The plan file: one YAML document ``{schema_version, model, cluster, workload, plan}``.

``search --out`` writes it; ``check --plan`` and ``validate`` read it unchanged (DESIGN §10).
"""

from __future__ import annotations

from pydantic import field_validator, model_validator

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

    @model_validator(mode="after")
    def _whole_nodes(self) -> "PlanFile":
        """``W`` fills whole nodes (``W`` a multiple of ``gpus_per_node``) or part of one
        (``W < gpus_per_node``): the host live sets count ``min(W, gpus_per_node)`` ranks per node,
        which a last, partly filled node would make wrong."""
        from planner.errors import InvalidPlan

        W, g = self.plan.world_size, self.cluster.topology.gpus_per_node
        if W > g and W % g:
            raise InvalidPlan("plan.world_size", W, f"must be a multiple of cluster.topology.gpus_per_node ({g}) "
                              f"or smaller than it (whole nodes, or part of one)",
                              f"use --gpus {W - W % g} or {W + g - W % g}, or fix --gpus-per-node")
        return self
