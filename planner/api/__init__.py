"""Pure functions behind the CLI (DESIGN §10): ``check``, ``max_context``, ``max_batch``,
``search``, ``sweep``, ``min_gpus``, and ``build`` (a plan file from a model and plan overrides).

Each takes keyword arguments only and returns a report object; rendering lives in
``planner.report``. Errors are ``planner.errors.PlanError`` subclasses.
"""

from planner.api.build import build, build_planfile, refuse_planner_file
from planner.api.check import (CheckReport, check, check_planfile, derived_symbols, dispatch_bounds,
                               param_summary, resolved_planfile, step_summary)
from planner.api.frontier import DEFAULT_SEQ_STEP_PER_RANK, FrontierReport, max_batch, max_context
from planner.api.search import STACKS, Closest, SearchReport, search
from planner.api.sweep import MIN_GPUS_MAX, MinGpusReport, SweepRow, min_gpus, sweep

__all__ = [
    "build", "build_planfile", "refuse_planner_file", "CheckReport", "check", "check_planfile",
    "derived_symbols", "dispatch_bounds", "param_summary", "resolved_planfile", "step_summary",
    "DEFAULT_SEQ_STEP_PER_RANK", "FrontierReport", "max_batch", "max_context", "STACKS", "Closest",
    "SearchReport", "search", "MIN_GPUS_MAX", "MinGpusReport", "SweepRow", "min_gpus", "sweep",
]
