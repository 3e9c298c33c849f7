"""``planner max-context`` / ``max-batch``: whole-grid scans of ``S`` or the batch (DESIGN §3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.api.build import build
from planner.context.resolve import resolve_plan
from planner.errors import InvalidPlan
from planner.plans.routing import routing_basis
from planner.schema import PlanFile
from planner.schema.cluster_ref import planfile_doc


@dataclass
class FrontierReport:
    """``planner max-context`` / ``max-batch``: the largest value that fits and the whole scan."""

    planfile: PlanFile
    axis: str
    scan: Any
    cluster_ref: dict | None = None

    def to_json(self) -> dict:
        s = self.scan
        best = s.best
        out: dict[str, Any] = {"fits": best is not None, "first_fail": s.first_fail,
                               "capacity_bytes": s.capacity_bytes, "host_capacity_bytes": s.host_capacity_bytes}
        if self.axis == "seq_len":
            out["max_seq_len"] = best
            out["seq_step"] = int(s.values[1] - s.values[0]) if len(s.values) > 1 else int(s.values[0])
        else:
            from planner.budget.frontier import seq_degree

            W = self.planfile.plan.world_size
            deg = seq_degree(s.plan)
            out["max_seqs_per_microbatch"] = best
            out["max_global_batch_tokens"] = (None if best is None
                                              else W // deg * best * self.planfile.workload.seq_len)
        out["grid"] = {"values": s.values.tolist(), "tokens_per_rank": s.tokens_per_rank.tolist(),
                       "peak_bytes": s.peak_bytes.tolist(), "host_bytes": s.host_bytes.tolist(),
                       "fits": s.fits.tolist(),
                       "peak_exact": (np.ones(len(s.values), bool) if s.exact is None else s.exact).tolist()}
        out["routing"] = routing_basis(self.planfile.model, self.planfile.plan)
        out["plan"] = planfile_doc(self.planfile, self.cluster_ref)
        return out


DEFAULT_SEQ_STEP_PER_RANK = 1024
"""``max-context`` grid step without ``--seq-step``: ``S`` grows by ``1024·D`` (1024 tokens per rank)."""


def max_context(*, seq_step: int | None = None, max_seq_len: int = 16 * 2**20, min_headroom: float | None = None,
                **kwargs) -> FrontierReport:
    """``planner max-context``: scan ``S`` over the whole grid (DESIGN §3.4). ``seq_step`` and
    ``max_seq_len`` are both total context ``S``; the step is rounded up to a multiple of the
    sequence-sharding degree ``D`` (``cp`` for the baseline), default ``1024·D``."""
    from planner.budget.frontier import seq_degree, seq_len_grid

    if kwargs.get("seq_len") is None and not kwargs.get("plan_file"):
        kwargs["seq_len"] = (seq_step or DEFAULT_SEQ_STEP_PER_RANK) * (kwargs.get("gpus") or 1)

    def grid(pf: PlanFile, plan) -> Any:
        per_rank = DEFAULT_SEQ_STEP_PER_RANK if seq_step is None else -(-seq_step // seq_degree(plan))
        return seq_len_grid(pf, per_rank, max_seq_len, plan=plan)

    return _frontier("seq_len", grid, min_headroom, kwargs)


def max_batch(*, max_tokens: int = 16 * 2**20, min_headroom: float | None = None, **kwargs) -> FrontierReport:
    """``planner max-batch``: scan sequences per micro-batch at fixed ``S`` (whole grid)."""
    from planner.budget.frontier import batch_grid

    return _frontier("seqs_per_microbatch", lambda pf, plan: batch_grid(pf, max_tokens), min_headroom, kwargs)


NO_STEP_BATCH = ("a rank's memory does not depend on the tokens per optimizer step, and the scan changes the "
                 "tokens per micro-step it must be a multiple of")
"""Why both scans refuse ``global_batch_tokens`` (it would be silently ignored)."""


def _frontier(axis: str, grid, min_headroom: float | None, build_kwargs: dict) -> FrontierReport:
    """Both scans: build the plan file (``build``), resolve its plan once, lay the grid
    (``grid(pf, resolved plan)``) and scan it with that plan.

    Raises:
        InvalidPlan: ``global_batch_tokens`` given (``NO_STEP_BATCH``)."""
    from planner.budget.frontier import scan

    if build_kwargs.get("global_batch_tokens") is not None:
        command = "max-context" if axis == "seq_len" else "max-batch"
        raise InvalidPlan("workload.global_batch_tokens", build_kwargs["global_batch_tokens"],
                          f"does not apply to {command}", f"drop it: {NO_STEP_BATCH}")

    pf, ref = build(**build_kwargs)
    plan = resolve_plan(pf.model, pf.workload, pf.plan)
    values = grid(pf, plan)
    return FrontierReport(pf, axis, scan(pf, axis, values, min_headroom_of(min_headroom), plan=plan), ref)


def min_headroom_of(min_headroom: float | None) -> float:
    """``--min-headroom`` of every command that keeps it (``search``, ``sweep``, ``min-gpus``,
    ``max-context``, ``max-batch``), checked: ``None`` is ``budget.frontier.MIN_HEADROOM``.

    Raises:
        InvalidPlan: a value outside ``[0, 1)``."""
    from planner.budget.frontier import MIN_HEADROOM

    if min_headroom is None:
        return MIN_HEADROOM
    if not 0.0 <= min_headroom < 1.0:
        raise InvalidPlan("--min-headroom", min_headroom, "must be in [0, 1)", "use e.g. 0.03")
    return float(min_headroom)
