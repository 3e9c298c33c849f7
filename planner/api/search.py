"""``planner search``: the fastest fitting plans of both stacks, or the closest when none fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.api.build import build
from planner.api.check import CheckReport, check_planfile
from planner.api.frontier import min_headroom_of
from planner.budget.sensitivity import routing_sensitivity
from planner.plans.routing import routing_basis
from planner.errors import InvalidPlan, PlanError
from planner.schema import PlanFile, Workload
from planner.schema.cluster_ref import planfile_doc
from planner.schema.knobs import default
from planner.units import fmt_share, plural


STACKS = ("best", "composed", "fsdp2")
"""What ``search --out`` writes: ``best`` (the faster stack among those that fit), or one stack."""


@dataclass
class Closest:
    """The lowest-peak legal plan of a stack when none of its plans fits, and why it fails."""

    report: CheckReport
    min_headroom: float = 0.0
    """The share of the usable capacity the search kept free (``--min-headroom``)."""

    @property
    def plan(self):
        return self.report.planfile.plan

    def why(self) -> str:
        """One line: over HBM (in which phase, by which terms) or over host RAM (by which part)."""
        from planner.units import gib

        r = self.report
        if not r.fits_hbm:
            terms = ", ".join(f"{t['name']} ({t['live_set']}) {gib(t['bytes']):.1f} GiB" for t in r.binding_terms)
            return (f"over HBM: peak {gib(r.peak_bytes):.1f} GiB > {gib(r.capacity_bytes):.1f} GiB usable in "
                    f"{r.binding_phase}, live set {r.binding_live_set}; largest terms there: {terms}")
        h = r.host
        if r.fits_host:   # fits both: only the search's headroom rule rejects it
            return (f"under the {fmt_share(self.min_headroom)} headroom the search keeps (--min-headroom): peak "
                    f"{gib(r.peak_bytes):.1f} GiB of {gib(r.capacity_bytes):.1f} GiB usable in {r.binding_phase} "
                    f"leaves {gib(r.capacity_bytes - r.peak_bytes):.2f} GiB (planner check says it fits)")
        parts = {"optimizer state": int(h.optimizer_bytes), "SCO boundaries": int(h.sco_bytes),
                 "process baselines": int(h.baseline_bytes)}
        top = ", ".join(f"{k} {gib(v):.1f} GiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
        return (f"over host RAM: {gib(int(h.bytes)):.1f} GiB > {gib(int(h.capacity_bytes)):.1f} GiB usable per node "
                f"({plural(h.ranks_per_node, 'rank', grouped=False)}: {top})")

    def to_json(self) -> dict:
        r = self.report
        return {"plan": self.plan.model_dump(mode="json"), "peak_bytes": r.peak_bytes,
                "capacity_bytes": r.capacity_bytes, "fits_hbm": r.fits_hbm, "fits_host": r.fits_host,
                "host_bytes": int(r.host.bytes), "host_capacity_bytes": int(r.host.capacity_bytes),
                "binding_phase": r.binding_phase, "binding_live_set": r.binding_live_set,
                "binding_terms": r.binding_terms, "why": self.why()}


@dataclass
class SearchReport:
    """``planner search``: the top composed plans, the best FSDP2 baseline, tallies, timings, and the
    plan ``--out`` writes (``--stack``)."""

    model: Any
    cluster: Any
    workload: Workload
    world_size: int
    result: Any
    elapsed_s: float
    stack: str = "best"
    """What the user asked ``--out`` to write (``STACKS``)."""
    closest: dict = field(default_factory=dict)
    """Stack → ``Closest``, for each stack with no fitting plan."""
    cluster_ref: Any = None
    """How the plan file names the cluster (``cluster_reference``)."""
    routing_sensitivity: dict = field(default_factory=dict)
    """``{"composed": …, "baseline": …}``: the first-ranked plans' peaks and verdicts under
    balanced, the named skew and worst routing (``budget.sensitivity``)."""
    routing: str | None = None
    """The routing the user named (``None``: each plan's default, ``plans.routing.default_routing``)."""

    def routing_basis(self, plan) -> dict:
        """``{"routing", "default", "why"}`` of a candidate plan's verdict."""
        return routing_basis(self.model, plan.model_copy(update={"routing": self.routing}))

    @property
    def chosen_stack(self) -> str:
        """The stack of the plan ``--out`` writes: under ``best``, the faster of the fitting stacks in
        tokens/s/GPU (composed on a tie); when neither fits, the one whose closest plan is nearer fitting (the
        smaller of its HBM and host-RAM overshoot ratios, the larger taken per plan)."""
        if self.stack != "best":
            return self.stack
        r = self.result
        if r.top and r.baseline:
            return "fsdp2" if r.baseline.tokens_per_s_per_gpu > r.top[0].tokens_per_s_per_gpu else "composed"
        if r.top or r.baseline:
            return "composed" if r.top else "fsdp2"
        ratio = {k: max(c.report.peak_bytes / c.report.capacity_bytes,
                        int(c.report.host.bytes) / int(c.report.host.capacity_bytes)) for k, c in self.closest.items()}
        return min(ratio, key=ratio.get) if ratio else "composed"

    @property
    def chosen(self):
        """``(plan, fits)`` that ``--out`` writes, or ``None`` when there is none."""
        st = self.chosen_stack
        cand = (self.result.top[0] if self.result.top else None) if st == "composed" else self.result.baseline
        if cand is not None:
            return cand.plan, True
        c = self.closest.get(st)
        return (c.plan, False) if c is not None else None

    def planfile(self) -> PlanFile | None:
        """The chosen plan as a plan file that ``check --plan`` accepts unchanged."""
        ch = self.chosen
        if ch is None:
            return None
        # the routing the user named, or none: a default routing written into the file would read
        # as "given" and stay fixed when a later check changes the operator (README: routing)
        plan = ch[0].model_copy(update={"routing": self.routing})
        return PlanFile(model=self.model, cluster=self.cluster, workload=self.workload, plan=plan)

    def planfile_doc(self) -> dict | None:
        """What ``--out`` writes: the plan file with the cluster named by reference."""
        pf = self.planfile()
        return None if pf is None else planfile_doc(pf, self.cluster_ref)

    def to_json(self) -> dict:
        def cand(c):
            return None if c is None else {
                "step_s": c.step_s, "tokens_per_step": c.tokens_per_step,
                "tokens_per_step_per_rank": round(c.tokens_per_step_per_rank), "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "tflops_per_gpu": c.tflops_per_gpu,
                "peak_bytes": c.peak_bytes, "host_bytes": c.host_bytes, "binding_phase": c.binding_phase,
                "breakdown": c.breakdown, "components": c.components, "routing": self.routing_basis(c.plan),
                "plan": c.plan.model_dump(mode="json")}
        r = self.result
        ch = self.chosen
        return {"model": self.model.name, "world_size": self.world_size, "seq_len": self.workload.seq_len,
                "top": [cand(c) for c in r.top], "baseline": cand(r.baseline),
                "speedup_vs_baseline": r.speedup,
                "tally": {"evaluated": r.tally.evaluated, "fit": r.tally.fit, "rejected": dict(r.tally.reasons),
                          "text": r.tally.text()},
                "baseline_tally": {"evaluated": r.baseline_tally.evaluated, "fit": r.baseline_tally.fit,
                                   "rejected": dict(r.baseline_tally.reasons), "text": r.baseline_tally.text()},
                "gaps": r.gaps, "assumed": r.assumed, "elapsed_s": self.elapsed_s,
                "stack": self.stack, "chosen_stack": self.chosen_stack,
                "chosen_fits": None if ch is None else ch[1],
                "routing_sensitivity": self.routing_sensitivity,
                "closest": {k: c.to_json() for k, c in self.closest.items()}}


def search(*, model: str, cluster: str | None = None, gpus: int, seq_len: int, global_batch_tokens: int | None = None,
           routing: str | None = default("routing"), dispatch_bound: str = default("dispatch_bound"), dtype: str = default("dtype"), top: int = 5,
           stack: str = "best", cluster_overrides: dict | None = None, progress=None,
           min_headroom: float | None = None) -> SearchReport:
    """``planner search``: fastest fitting configurations and the fastest fitting FSDP2 baseline;
    for a stack with no fitting plan, its lowest-peak legal plan and why it fails."""
    import time

    if stack not in STACKS:
        raise InvalidPlan("--stack", stack, f"must be one of {', '.join(STACKS)}", "write e.g. --stack best")
    pf, ref = build(model=model, cluster=cluster, gpus=gpus, seq_len=seq_len,
                    global_batch_tokens=global_batch_tokens, cluster_overrides=cluster_overrides,
                    overrides={"routing": routing, "dispatch_bound": dispatch_bound, "dtype": dtype})
    from planner.search.rank import lowest_peak
    from planner.search.rank import search as run

    headroom = min_headroom_of(min_headroom)
    t0 = time.perf_counter()
    res = run(pf.model, pf.cluster, pf.workload, world_size=gpus, routing=routing, dispatch_bound=dispatch_bound,
              dtype=dtype, top=top, progress=progress, min_headroom=headroom)
    closest = {}
    for st, found in (("composed", res.top), ("fsdp2", res.baseline)):
        if found:
            continue
        try:
            plan, _, _ = lowest_peak(pf.model, pf.cluster, pf.workload, world_size=gpus, stack=st, routing=routing,
                                     dispatch_bound=dispatch_bound, dtype=dtype, host_fallback=True,
                                     min_headroom=headroom)
        except InvalidPlan as e:  # N past 2^58 B per rank at every D of this stack: no plan to offer
            if e.field != "workload.seq_len":
                raise
            continue
        try:
            closest[st] = Closest(check_planfile(pf.model_copy(update={"plan": plan})), headroom)
        except PlanError:  # a plan check refuses cannot be offered as the closest (nor written)
            continue
    _raise_if_only_gaps(res)
    sens = {name: routing_sensitivity(pf.model, pf.cluster, pf.workload, c.plan)
            for name, c in (("composed", res.top[0] if res.top else None), ("baseline", res.baseline)) if c}
    rep = SearchReport(pf.model, pf.cluster, pf.workload, gpus, res, time.perf_counter() - t0, stack, closest, ref)
    rep.routing_sensitivity = sens
    rep.routing = routing
    return rep


def _raise_if_only_gaps(res) -> None:
    """``ProfileGap`` (exit 2) when composed plans fit the memory but none could be timed: the answer
    is "the profile cannot time this", not "no plan fits"."""
    from planner.errors import ProfileGap
    from planner.search.evaluate import Rejection

    t = res.tally
    if res.top or not t.fit or t.reasons.get(Rejection.PROFILE_GAP.value, 0) < t.fit:
        return
    first = res.gaps[0] if res.gaps else "a time-model curve is missing; fix: run `planner calibrate`"
    if "; fix: " not in first:
        first += "; fix: run `planner calibrate` on this cluster"
    raise ProfileGap.summary(f"search: all {t.fit} composed candidates that fit the memory hit a time-model "
                             f"gap, so none can be ranked: {' '.join(first.split())}")
