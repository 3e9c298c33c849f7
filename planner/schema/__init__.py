"""Frozen pydantic schema: models, clusters, workloads, plans and plan files."""

from planner.schema.base import SCHEMA_VERSION, Frozen
from planner.schema.cluster import ClusterSpec, Constant, MemoryConstants, Provenance, Topology
from planner.schema.curves import (BandwidthCurve, ChunkCurve, CollectiveCurves, CpuAdamWTable, Curves,
                                   ParamRateCurve, RateTable)
from planner.schema.model import MLASpec, ModelSpec
from planner.schema.plan import BaselineKnobs, ComposedKnobs, Plan, parse_routing
from planner.schema.planfile import PlanFile
from planner.schema.workload import Workload

__all__ = [
    "SCHEMA_VERSION", "Frozen", "ClusterSpec", "BandwidthCurve", "ChunkCurve", "CollectiveCurves",
    "CpuAdamWTable", "Curves", "ParamRateCurve", "RateTable", "Constant", "MemoryConstants", "Provenance",
    "Topology", "MLASpec", "ModelSpec", "BaselineKnobs", "ComposedKnobs", "Plan", "parse_routing",
    "PlanFile", "Workload",
]
