"""Peak over phases, the usable capacity and the verdict's ingredients (DESIGN §3.1).

``evaluate(ctx)`` sums every live set's terms in every phase (numpy-broadcast over candidates),
takes the maximum and names the binding phase. Two invariants are checked on every evaluation
(STYLE §9): every term is ≥ 0 in every phase, and the peak is ≥ every phase.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from planner.context.ctx import Ctx
from planner.budget.phases import critical_phases, full_phases
from planner.budget.terms import LIVE_SETS, Phase, Term
from planner.schema import cluster_constants

MODULES = ("persistent", "gathered", "boundary_terms", "attention", "ffn", "dispatch", "vocab", "optimizer",
           "workspace")
"""The live-set modules of ``planner.budget``; ``optimizer`` holds the ``optimizer_step`` live set."""


def all_terms(ctx: Ctx) -> list[Term]:
    """Every term of every live set for ``ctx``."""
    out: list[Term] = []
    for name in MODULES:
        out.extend(importlib.import_module(f"planner.budget.{name}").terms(ctx))
    return out


@dataclass
class Evaluation:
    """Bytes of every live set in every phase, for one configuration or many candidates."""

    ctx: Ctx
    terms: list[Term]
    phases: list[Phase]
    by_phase: np.ndarray
    """``[n_phases, *candidates]`` total bytes per phase."""
    term_bytes: np.ndarray | None = None
    """``[n_terms, n_phases, *candidates]`` bytes of each term in each phase (``None`` when the
    evaluation kept only the phase totals, as the search does)."""

    def live_set_bytes(self, live_set: str) -> np.ndarray:
        """``[n_phases, *candidates]`` bytes of one live set."""
        assert self.term_bytes is not None, "evaluate(..., per_term=True) keeps the terms"
        idx = [i for i, t in enumerate(self.terms) if t.live_set == live_set]
        if not idx:
            return np.zeros(self.term_bytes.shape[1:], dtype=np.int64)
        return self.term_bytes[idx].sum(axis=0)

    @property
    def peak_bytes(self) -> np.ndarray:
        """Peak over phases, per candidate."""
        return self.by_phase.max(axis=0)

    @property
    def binding_index(self) -> np.ndarray:
        """Index into ``phases`` of the binding (first maximal) phase, per candidate."""
        return self.by_phase.argmax(axis=0)


def _rows(t: Term, phases: list[Phase]) -> np.ndarray:
    """``[n_phases, *candidates]`` bytes of one term (candidate axes as the term has them)."""
    if t.at is None:  # constant while resident: a residency mask times the bytes
        mask = np.array([t.resident(p) for p in phases], dtype=np.int64)
        b = np.asarray(t.bytes, dtype=np.int64)
        return mask.reshape(-1, *([1] * b.ndim)) * b
    return np.stack(np.broadcast_arrays(*[np.asarray(t.bytes_in(p), dtype=np.int64) for p in phases]))


def evaluate(ctx: Ctx, *, phases: list[Phase] | None = None, critical: bool = False,
             per_term: bool = True) -> Evaluation:
    """Evaluate every term in ``phases`` (default: all phases; ``critical=True``: the reduced set).

    ``per_term=False`` keeps only the phase totals (the search: no ``[terms × phases × candidates]``
    array).

    Raises:
        AssertionError: a term is negative in some phase, or the peak is below some phase (bugs).
    """
    terms = all_terms(ctx)
    assert set(t.live_set for t in terms) <= set(LIVE_SETS)
    if phases is None:
        phases = critical_phases(ctx) if critical else full_phases(ctx)
    if per_term:
        rows = [_rows(t, phases) for t in terms]
    else:  # terms resident in the same phases are summed before the phase axis is spread
        grouped: dict[tuple, object] = {}
        rows = []
        for t in terms:
            if t.at is None:
                key = tuple(t.resident(p) for p in phases)
                b = np.asarray(t.bytes, dtype=np.int64)
                assert (b >= 0).all(), f"term {t.name!r} of {t.live_set} is negative"
                grouped[key] = grouped.get(key, 0) + b
            else:
                rows.append(_rows(t, phases))
        for key, b in grouped.items():
            b = np.asarray(b)
            rows.append(np.array(key, dtype=np.int64).reshape(-1, *([1] * b.ndim)) * b)
    cand = np.broadcast_shapes(*(r.shape[1:] for r in rows))
    lead = lambda r: r.reshape(r.shape[:1] + (1,) * (len(cand) + 1 - r.ndim) + r.shape[1:])  # noqa: E731
    for r in rows:
        assert (r >= 0).all(), "a term is negative in some phase"
    if per_term:
        tb = np.empty((len(terms), len(phases), *cand), dtype=np.int64)
        for i, r in enumerate(rows):
            tb[i] = lead(r)
        ev = Evaluation(ctx, terms, phases, tb.sum(axis=0), tb)
    else:
        tot = np.zeros((len(phases), *cand), dtype=np.int64)
        for r in rows:
            tot += lead(r)
        ev = Evaluation(ctx, terms, phases, tot)
    assert (ev.peak_bytes >= ev.by_phase).all(), "peak below a phase"
    return ev


def outside_allocator_bytes(ctx: Ctx) -> int:
    """CUDA context + NCCL buffers (NCCL only when ``W > 1``): subtracted from the capacity."""
    mem = ctx.cluster.memory
    nccl = mem.nccl_buffer_bytes.value if ctx.world_size > 1 else 0
    return int(mem.cuda_context_bytes.value + nccl)


RESERVE_FLOOR = 0.02
"""DESIGN §3.1: the fragmentation reserve is at least 2% of the usable HBM, whatever the profile says."""


def reserve_fraction(ctx: Ctx) -> float:
    """The fragmentation reserve: at least 2% (``RESERVE_FLOOR``) and the profile's
    ``reserve_fraction``, never below the measured fragmentation."""
    mem = ctx.cluster.memory
    return max(RESERVE_FLOOR, mem.reserve_fraction.value, mem.fragmentation_fraction.value)


def capacity_bytes(ctx: Ctx) -> int:
    """Usable HBM per rank: HBM − (context + NCCL) − reserve (DESIGN §3.1 "What fits means")."""
    usable = ctx.cluster.topology.hbm_bytes - outside_allocator_bytes(ctx)
    return int(usable - int(np.ceil(usable * reserve_fraction(ctx))))


def constants_used(ctx: Ctx) -> list[str]:
    """The cluster constants this verdict used: derived from the registry's ``used_by`` and
    ``used_when`` (``planner.schema.cluster_constants``), never listed here by hand."""
    return cluster_constants.used(ctx.world_size)


def assumed_used(ctx: Ctx) -> list[str]:
    """Assumed (not measured) constants this verdict used."""
    mem = ctx.cluster.memory
    out = [f"memory.{n}" for n in constants_used(ctx) if getattr(mem, n).status == "assumed"]
    if ctx.cluster.topology.topology_status == "assumed":
        out.append("topology (host RAM, cores)")
    return out
