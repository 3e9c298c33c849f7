"""``planner check``: the verdict of one configuration (``check``, ``check_planfile``) and its
report (``CheckReport``, rendered by ``planner.report.check_view``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.api.build import build
from planner.budget.build import make_context
from planner.budget.frontier import MIN_HEADROOM, within_headroom
from planner.context.ctx import Ctx
from planner.budget.host import host_budget
from planner.budget.peak import Evaluation, assumed_used, capacity_bytes, evaluate, outside_allocator_bytes
from planner.context.resolve import released_context_note, seq_parallel_note
from planner.budget.sensitivity import routing_sensitivity
from planner.plans.routing import routing_basis
from planner.budget.terms import LIVE_SETS, PHASE_KINDS
from planner.budget.work_bounds import TooCostly
from planner.schema import PlanFile
from planner.schema.cluster_ref import planfile_doc


def resolved_planfile(pf: PlanFile, ctx: Ctx) -> PlanFile:
    """``pf`` with every default filled in, the SCO budget included, ready to paste."""
    plan = ctx.plan
    if plan.stack == "composed" and plan.composed.checkpoint == "sco":
        plan = plan.model_copy(update={"composed": plan.composed.model_copy(
            update={"sco_host_bytes": int(ctx.sco_host_bytes)})})
    return pf.model_copy(update={"plan": plan})


@dataclass
class CheckReport:
    """The verdict of ``planner check`` for one configuration."""

    planfile: PlanFile
    ctx: Ctx
    evaluation: Evaluation
    capacity_bytes: int
    hbm_bytes: int
    outside_allocator_bytes: int
    host: Any
    assumed: list[str]
    provisional: list[str]
    binding: int = 0
    extra: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    """One-line warnings: the Hugging Face importer's, a fallen-back ``D``."""
    cluster_ref: dict | None = None
    """How the ``plan`` of ``--json`` names its cluster (``planner.schema.cluster_ref``)."""
    min_headroom: float = MIN_HEADROOM
    """The share of the usable capacity ``under_min_headroom`` compares with (``--min-headroom``;
    the verdict itself is against the usable capacity)."""

    @property
    def peak_bytes(self) -> int:
        return int(self.evaluation.peak_bytes)

    @property
    def fits_hbm(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def fits_host(self) -> bool:
        return bool(self.host.fits)

    @property
    def fits(self) -> bool:
        return self.fits_hbm and self.fits_host

    @property
    def headroom_fraction(self) -> float | None:
        """``1 − peak/capacity``: the share of the usable capacity the peak leaves free (< 0 over it;
        ``None`` when the runtime-fixed terms and the reserve leave no usable capacity at all)."""
        return 1.0 - self.peak_bytes / self.capacity_bytes if self.capacity_bytes > 0 else None

    @property
    def under_min_headroom(self) -> bool:
        """The peak fits the usable capacity but leaves less than ``min_headroom`` of it free: the
        verdict stays "fits" (the capacity is the physical limit), but ``search``, ``sweep``,
        ``min-gpus``, ``max-context`` and ``max-batch`` do not count such a plan as fitting at
        their default ``--min-headroom`` (the same comparison as theirs)."""
        return self.fits_hbm and not within_headroom(self.peak_bytes, self.capacity_bytes, self.min_headroom)

    @property
    def binding_phase(self) -> str:
        return self.evaluation.phases[self.binding].label

    def live_set_bytes(self, name: str) -> tuple[int, int]:
        """(bytes in the binding phase, max over phases) of one live set."""
        row = self.evaluation.live_set_bytes(name)
        return int(row[self.binding]), int(row.max())

    @property
    def binding_live_set(self) -> str:
        """The live set that pushed the binding phase to the peak: the one whose bytes there exceed
        its own minimum over phases by the most (its phase-specific part at the peak). Persistent
        state, the same in every phase, never pushes a phase above the others; ties go to the larger
        live set in the binding phase."""
        def pushed(n: str) -> tuple[int, int]:
            row = self.evaluation.live_set_bytes(n)
            return int(row[self.binding]) - int(row.min()), int(row[self.binding])
        return max(LIVE_SETS, key=pushed)

    @property
    def largest_live_set(self) -> str:
        """The live set with the most bytes in the binding phase."""
        return max(LIVE_SETS, key=lambda n: self.live_set_bytes(n)[0])

    def term_rows(self, phase_index: int | None = None) -> list[tuple[Any, int, int]]:
        """``(term, bytes in phase, max bytes over phases)`` for every term."""
        i = self.binding if phase_index is None else phase_index
        tb = self.evaluation.term_bytes
        return [(t, int(tb[j, i]), int(tb[j].max())) for j, t in enumerate(self.evaluation.terms)]

    @property
    def binding_terms(self) -> list[dict]:
        rows = sorted(self.term_rows(), key=lambda r: -r[1])[:3]
        return [{"name": t.name, "live_set": t.live_set, "bytes": b} for t, b, _ in rows]

    def phase_kind_table(self) -> dict[str, dict[str, tuple[int, str]]]:
        """live set → phase kind → (max bytes over phases of that kind, label of that phase)."""
        ev = self.evaluation
        out: dict[str, dict[str, tuple[int, str]]] = {}
        for ls in [*LIVE_SETS, "total"]:
            row = ev.by_phase if ls == "total" else ev.live_set_bytes(ls)
            out[ls] = {}
            for kind in PHASE_KINDS:
                idx = [i for i, p in enumerate(ev.phases) if p.kind == kind]
                j = max(idx, key=lambda i: int(row[i]))
                out[ls][kind] = (int(row[j]), ev.phases[j].label)
        return out

    def to_json(self) -> dict:
        """The ``--json`` object of DESIGN §10."""
        live = {}
        for ls in LIVE_SETS:
            at, mx = self.live_set_bytes(ls)
            terms = [{"name": t.name, "bytes": int(np.max(t.bytes)), "bytes_in_binding_phase": b,
                      "formula": t.formula, "phases": t.phases_text, "provisional": t.provisional}
                     for t, b, m in self.term_rows() if t.live_set == ls]
            live[ls] = {"bytes": at, "max_bytes": mx, "terms": terms}
        h = self.host
        return {
            "fits": self.fits, "fits_hbm": self.fits_hbm, "warnings": list(self.warnings), "peak_bytes": self.peak_bytes,
            "capacity_bytes": self.capacity_bytes, "headroom_bytes": self.capacity_bytes - self.peak_bytes,
            "headroom_fraction": self.headroom_fraction, "min_headroom": self.min_headroom,
            "under_min_headroom": self.under_min_headroom,
            "hbm_bytes": self.hbm_bytes, "outside_allocator_bytes": self.outside_allocator_bytes,
            "binding_phase": self.binding_phase, "binding_live_set": self.binding_live_set,
            "largest_live_set": self.largest_live_set,
            **self.extra.get("step", {}),
            "binding_terms": self.binding_terms, "assumed": self.assumed, "provisional": self.provisional,
            "live_sets": live,
            "host": {"bytes": int(h.bytes), "capacity_bytes": int(h.capacity_bytes), "fits": self.fits_host,
                     "ranks_per_node": h.ranks_per_node, "baseline_bytes": int(h.baseline_bytes),
                     "optimizer_bytes": int(h.optimizer_bytes), "sco_bytes": int(h.sco_bytes)},
            "derived": derived_symbols(self.ctx),
            "params": param_summary(self.planfile.model),
            "dispatch_bounds": self.extra.get("dispatch_bounds", {}),
            "routing": self.extra.get("routing", {}),
            "routing_sensitivity": self.extra.get("routing_sensitivity", {}),
            "plan": planfile_doc(self.planfile, self.cluster_ref),
        }


def param_summary(model) -> dict[str, Any]:
    """``Θ`` as used (``num_params``), with and without the MTP layers, and whether they are trained."""
    return {"num_params": model.param_counts()["total"], "with_mtp": model.param_counts(mtp=True)["total"],
            "without_mtp": model.param_counts(mtp=False)["total"], "mtp_layers": model.mtp_layers,
            "mtp_trained": model.mtp_trained}


def derived_symbols(ctx: Ctx) -> dict[str, Any]:
    """The resolved DESIGN §1 symbols worth printing."""
    keys = ["world_size", "num_layers", "num_boundaries", "tokens_per_rank", "num_params"]
    if ctx.stack == "composed":
        keys += ["seq_parallel", "expert_parallel", "vocab_parallel", "vocab_blocks", "token_budget",
                 "num_chunks", "chunk_tokens", "sco_host_bytes", "num_offloaded"]
    else:
        keys += ["tp", "cp", "dp_shard", "ep"]
    return {k: int(np.asarray(getattr(ctx, k))) for k in keys}


def check_planfile(pf: PlanFile) -> CheckReport:
    """Evaluate one plan file at every phase and return the verdict."""
    ctx = make_context(pf.model, pf.cluster, pf.workload, pf.plan)
    ev = evaluate(ctx)
    host = host_budget(ctx)
    provisional = sorted({f"{t.live_set}: {t.name}" for t, b in zip(ev.terms, ev.term_bytes)
                          if t.provisional and int(b.max()) > 0})
    return CheckReport(
        planfile=resolved_planfile(pf, ctx), ctx=ctx, evaluation=ev, capacity_bytes=capacity_bytes(ctx),
        hbm_bytes=ctx.cluster.topology.hbm_bytes, outside_allocator_bytes=outside_allocator_bytes(ctx),
        host=host, assumed=assumed_used(ctx), provisional=provisional, binding=int(ev.binding_index),
        extra={"dispatch_bounds": dispatch_bounds(ctx, ev), "step": step_summary(ctx),
               "routing": routing_basis(pf.model, pf.plan)},
        warnings=[n for n in (seq_parallel_note(pf.model, pf.workload, pf.plan),
                              released_context_note(pf.model, pf.workload)) if n],
    )


def step_summary(ctx: Ctx) -> dict[str, Any]:
    """Predicted step time and tokens per optimizer step (``None`` where the time model has a gap)."""
    from planner.timing.step import step_time

    st = step_time(ctx)
    total = float(np.asarray(st.total_s).reshape(-1)[0])
    per_rank = int(np.asarray(st.tokens_per_step).reshape(-1)[0])
    ok = bool(np.isfinite(total))
    first = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in st.components.items()}
    return {"step_s": total if ok else None, "tokens_per_step": per_rank * ctx.world_size,
            "tokens_per_step_per_rank": per_rank, "tokens_per_s_per_gpu": per_rank / total if ok else None,
            "step_components": first if ok else None, "step_gaps": list(st.gaps), "step_assumed": list(st.assumed)}


def dispatch_bounds(ctx: Ctx, ev: Evaluation) -> dict[str, int]:
    """The dispatch live set's maximum over phases under both bounds (``guarantee`` and
    ``expected``), so a verdict taken under one shows the other (DESIGN §3.2). The verdict's own
    bound is read from its evaluation ``ev``; only the other bound's dispatch terms are evaluated,
    once, in ``ev``'s phases."""
    import dataclasses

    from planner.budget import dispatch

    if not ctx.model.is_moe or ctx.dispatch == "ep":
        return {}  # standard EP has no launch-time bound: it is sized under the routing assumption
    out = {ctx.dispatch_bound: int(ev.live_set_bytes("dispatch").max())}
    other = "expected" if ctx.dispatch_bound == "guarantee" else "guarantee"
    try:
        terms = dispatch.terms(dataclasses.replace(ctx, dispatch_bound=other))
    except TooCostly:                 # the expected bound's plan is too costly at this E_p: not shown
        return out
    out[other] = max(int(sum((t.bytes_in(p) for t in terms), np.int64(0))) for p in ev.phases)
    return out


def check(*, min_headroom: float | None = None, **kwargs) -> CheckReport:
    """``planner check``: see ``build`` for the arguments; the report's ``warnings`` hold the
    Hugging Face importer's warnings and the note on a fallen-back ``D``; it also carries the
    routing sensitivity (``budget.sensitivity``). ``min_headroom`` (``--min-headroom``, checked as
    the other commands check it) sets what ``under_min_headroom`` compares with."""
    from planner.api.frontier import min_headroom_of

    headroom = min_headroom_of(min_headroom)
    notes: list[str] = []
    pf, ref = build(**kwargs, notes=notes)
    rep = check_planfile(pf)
    rep.min_headroom = headroom
    rep.warnings = notes + rep.warnings
    rep.cluster_ref = ref
    rep.extra["routing_sensitivity"] = routing_sensitivity(pf.model, pf.cluster, pf.workload, rep.ctx.plan,
                                                           resolved=True)
    return rep
