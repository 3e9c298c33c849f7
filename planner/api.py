"""Pure functions behind the CLI: ``check``, ``max_context``, ``max_batch`` (DESIGN §10).

Each takes keyword arguments only and returns a report object; rendering lives in
``planner.report``. Errors are ``planner.errors.PlanError`` subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.budget.build import make_context
from planner.budget.context import Ctx
from planner.budget.host import host_budget
from planner.budget.peak import Evaluation, assumed_used, capacity_bytes, evaluate, outside_allocator_bytes
from planner.budget.resolve import resolve_plan, seq_parallel_note
from planner.budget.work_bounds import TooCostly
from planner.budget.terms import LIVE_SETS, PHASE_KINDS
from planner.errors import InvalidPlan
from planner.schema import PlanFile, Workload
from planner.schema.io import load_cluster, load_model_noted, load_planfile, validate
from planner.schema.plan import check_inert

COMPOSED_KEYS = {
    "dispatch", "vocab", "optimizer", "checkpoint", "seq_parallel", "expert_parallel", "vocab_parallel",
    "vocab_blocks", "token_budget", "max_chunks", "llep_alpha", "llep_min_tokens", "llep_lambda",
    "max_imports", "bucket_params", "staging_slots", "sco_host_bytes",
}
"""Overrides that land in ``plan.composed``."""
BASELINE_KEYS = {"tp", "cp", "dp_shard", "ep", "ac", "cpu_offload"}
"""Overrides that land in ``plan.baseline``."""
PLAN_KEYS = {"routing", "dispatch_bound", "dtype", "stack"}
"""Overrides that land in ``plan``."""


def build_planfile(*, model: str | None = None, plan_file: str | None = None, cluster: str | None = None,
                   gpus: int | None = None, seq_len: int | None = None,
                   global_batch_tokens: int | None = None, overrides: dict[str, Any] | None = None,
                   notes: list[str] | None = None) -> PlanFile:
    """Assemble an (unresolved) plan file from a plan file and/or a model plus flag overrides;
    ``notes`` receives the Hugging Face importer's warnings.

    Raises:
        InvalidPlan: neither a model nor a plan file, or ``--gpus``/``--seq-len`` missing.
    """
    ov = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(ov) - COMPOSED_KEYS - BASELINE_KEYS - PLAN_KEYS
    assert not unknown, unknown
    if plan_file:
        pf = load_planfile(plan_file)
        m = _model(model, notes) if model is not None else pf.model
        c = load_cluster(cluster) if cluster is not None else pf.cluster
        wl = pf.workload.model_dump()
        plan = pf.plan.model_dump()
        if ov.get("stack", plan["stack"]) != plan["stack"]:
            plan["composed" if plan["stack"] == "composed" else "baseline"] = {}
    else:
        if model is None:
            raise InvalidPlan("MODEL", None, "is required", "give a model name/file or --plan FILE")
        m, c = _model(model, notes), load_cluster("h200" if cluster is None else cluster)
        wl, plan = {}, {"composed": {}, "baseline": {}}
        if gpus is None:
            raise InvalidPlan("--gpus", None, "is required without --plan", "add e.g. --gpus 8")
        if seq_len is None:
            raise InvalidPlan("--seq-len", None, "is required without --plan", "add e.g. --seq-len 128k")
    ov = _stack_overrides(ov, ov.get("stack", plan.get("stack", "composed")))
    if gpus is not None:
        plan["world_size"] = gpus
    if seq_len is not None:
        wl["seq_len"] = seq_len
    if global_batch_tokens is not None:
        wl["global_batch_tokens"] = global_batch_tokens
    for k, v in ov.items():
        if k in PLAN_KEYS:
            plan[k] = v
        elif k in COMPOSED_KEYS:
            plan.setdefault("composed", {})[k] = v
        else:
            plan.setdefault("baseline", {})[k] = v
    if plan.get("stack", "composed") == "composed":
        check_inert(set(ov), plan.get("composed") or {}, _flag)
    return validate(PlanFile, {"model": m, "cluster": c, "workload": wl, "plan": plan}, "")


def _model(ref: str, notes: list[str] | None):
    spec, warnings = load_model_noted(ref)
    if notes is not None:
        notes.extend(warnings)
    return spec


def _flag(key: str) -> str:
    return "--sco-host-gib" if key == "sco_host_bytes" else "--" + key.replace("_", "-")


def _stack_overrides(ov: dict, stack: str) -> dict:
    """Reject overrides of the stack that is not evaluated (they would be silently ignored);
    ``expert_parallel`` means ``ep`` for the FSDP2 baseline.

    Raises:
        InvalidPlan: a baseline knob for the composed stack, or a composed knob for the baseline.
    """
    ov = dict(ov)
    if stack == "fsdp2":
        if "expert_parallel" in ov:
            ov.setdefault("ep", ov.pop("expert_parallel"))
        bad = sorted(set(ov) & COMPOSED_KEYS)
        if bad:
            raise InvalidPlan(_flag(bad[0]), ov[bad[0]], "applies to the composed stack, not the FSDP2 baseline",
                              f"drop {_flag(bad[0])}, or drop --baseline to evaluate the composed stack")
    else:
        bad = sorted(set(ov) & BASELINE_KEYS)
        if bad:
            raise InvalidPlan(_flag(bad[0]), ov[bad[0]], "applies to the FSDP2 baseline only",
                              f"add --baseline, or drop {_flag(bad[0])}")
    return ov


def resolved_planfile(pf: PlanFile, ctx: Ctx) -> PlanFile:
    """``pf`` with every default filled in, the SCO budget included, ready to paste."""
    plan = resolve_plan(pf.model, pf.workload, pf.plan)
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
    def binding_phase(self) -> str:
        return self.evaluation.phases[self.binding].label

    def live_set_bytes(self, name: str) -> tuple[int, int]:
        """(bytes in the binding phase, max over phases) of one live set."""
        row = self.evaluation.live_set_bytes(name)
        return int(row[self.binding]), int(row.max())

    @property
    def binding_live_set(self) -> str:
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
            "hbm_bytes": self.hbm_bytes, "outside_allocator_bytes": self.outside_allocator_bytes,
            "binding_phase": self.binding_phase, "binding_live_set": self.binding_live_set,
            "binding_terms": self.binding_terms, "assumed": self.assumed, "provisional": self.provisional,
            "live_sets": live,
            "host": {"bytes": int(h.bytes), "capacity_bytes": int(h.capacity_bytes), "fits": self.fits_host,
                     "ranks_per_node": h.ranks_per_node, "baseline_bytes": int(h.baseline_bytes),
                     "optimizer_bytes": int(h.optimizer_bytes), "sco_bytes": int(h.sco_bytes)},
            "derived": derived_symbols(self.ctx),
            "dispatch_bounds": self.extra.get("dispatch_bounds", {}),
            "plan": self.planfile.model_dump(mode="json"),
        }


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
        extra={"dispatch_bounds": dispatch_bounds(ctx, ev)},
        warnings=[n for n in (seq_parallel_note(pf.model, pf.workload, pf.plan),) if n],
    )


def dispatch_bounds(ctx: Ctx, ev: Evaluation) -> dict[str, int]:
    """The dispatch live set's maximum over phases under both bounds (``guarantee`` and
    ``expected``), so a verdict taken under one shows the other (DESIGN §3.2)."""
    import dataclasses

    from planner.budget import dispatch
    from planner.budget.peak import _rows

    if not ctx.model.is_moe or ctx.dispatch == "ep":
        return {}  # standard EP has no launch-time bound: it is sized under the routing assumption
    out = {ctx.dispatch_bound: int(ev.live_set_bytes("dispatch").max())}
    other = "expected" if ctx.dispatch_bound == "guarantee" else "guarantee"
    try:
        rows = [_rows(t, ev.phases) for t in dispatch.terms(dataclasses.replace(ctx, dispatch_bound=other))]
    except TooCostly:                 # the expected bound's plan is too costly at this E_p: not shown
        return out
    out[other] = int(np.sum(rows, axis=0).max()) if rows else 0
    return out


def check(**kwargs) -> CheckReport:
    """``planner check``: see ``build_planfile`` for the arguments; the report's ``warnings`` hold
    the Hugging Face importer's warnings and the note on a fallen-back ``D``."""
    notes: list[str] = []
    rep = check_planfile(build_planfile(**kwargs, notes=notes))
    rep.warnings = notes + rep.warnings
    return rep


@dataclass
class FrontierReport:
    """``planner max-context`` / ``max-batch``: the largest value that fits and the whole scan."""

    planfile: PlanFile
    axis: str
    scan: Any

    def to_json(self) -> dict:
        s = self.scan
        best = s.best
        out: dict[str, Any] = {"fits": best is not None, "first_fail": s.first_fail,
                               "capacity_bytes": s.capacity_bytes, "host_capacity_bytes": s.host_capacity_bytes}
        if self.axis == "seq_len":
            out["max_seq_len"] = best
        else:
            W = self.planfile.plan.world_size
            D = resolve_plan(self.planfile.model, self.planfile.workload, self.planfile.plan)
            deg = D.composed.seq_parallel if D.stack == "composed" else D.baseline.cp
            out["max_seqs_per_microbatch"] = best
            out["max_global_batch_tokens"] = (None if best is None
                                              else W // deg * best * self.planfile.workload.seq_len)
        out["grid"] = {"values": s.values.tolist(), "tokens_per_rank": s.tokens_per_rank.tolist(),
                       "peak_bytes": s.peak_bytes.tolist(), "host_bytes": s.host_bytes.tolist(),
                       "fits": s.fits.tolist()}
        out["plan"] = self.planfile.model_dump(mode="json")
        return out


def max_context(*, seq_step: int = 1024, max_seq_len: int = 16 * 2**20, **kwargs) -> FrontierReport:
    """``planner max-context``: scan ``S`` over the whole grid (DESIGN §3.4)."""
    from planner.budget.frontier import scan, seq_len_grid

    if kwargs.get("seq_len") is None and not kwargs.get("plan_file"):
        kwargs["seq_len"] = seq_step * (kwargs.get("gpus") or 1)
    pf = build_planfile(**kwargs)
    grid = seq_len_grid(pf, seq_step, max_seq_len)
    return FrontierReport(pf, "seq_len", scan(pf, "seq_len", grid))


def max_batch(*, max_tokens: int = 16 * 2**20, **kwargs) -> FrontierReport:
    """``planner max-batch``: scan sequences per micro-batch at fixed ``S`` (whole grid)."""
    from planner.budget.frontier import batch_grid, scan

    pf = build_planfile(**kwargs)
    return FrontierReport(pf, "seqs_per_microbatch", scan(pf, "seqs_per_microbatch", batch_grid(pf, max_tokens)))


@dataclass
class SearchReport:
    """``planner search``: the top composed plans, the best FSDP2 baseline, tallies, timings."""

    model: Any
    cluster: Any
    workload: Workload
    world_size: int
    result: Any
    elapsed_s: float
    closest: Any = None
    """``(plan, peak_bytes, capacity_bytes)`` of the lowest-peak composed plan when none fits."""

    def planfile(self, i: int = 0) -> PlanFile:
        """The i-th composed plan as a plan file that ``check`` accepts unchanged (the closest plan
        when none fits)."""
        plan = self.result.top[i].plan if self.result.top else self.closest[0]
        return PlanFile(model=self.model, cluster=self.cluster, workload=self.workload, plan=plan)

    def to_json(self) -> dict:
        def cand(c):
            return None if c is None else {
                "step_s": c.step_s, "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "tflops_per_gpu": c.tflops_per_gpu,
                "peak_bytes": c.peak_bytes, "host_bytes": c.host_bytes, "binding_phase": c.binding_phase,
                "breakdown": c.breakdown, "plan": c.plan.model_dump(mode="json")}
        r = self.result
        return {"model": self.model.name, "world_size": self.world_size, "seq_len": self.workload.seq_len,
                "top": [cand(c) for c in r.top], "baseline": cand(r.baseline),
                "speedup_vs_baseline": (r.baseline.step_s / r.top[0].step_s if r.top and r.baseline else None),
                "tally": {"evaluated": r.tally.evaluated, "fit": r.tally.fit, "rejected": dict(r.tally.reasons),
                          "text": r.tally.text()},
                "baseline_tally": {"evaluated": r.baseline_tally.evaluated, "fit": r.baseline_tally.fit,
                                   "rejected": dict(r.baseline_tally.reasons), "text": r.baseline_tally.text()},
                "gaps": r.gaps, "assumed": r.assumed, "elapsed_s": self.elapsed_s,
                "closest": None if self.closest is None else {
                    "plan": self.closest[0].model_dump(mode="json"), "peak_bytes": int(self.closest[1]),
                    "capacity_bytes": int(self.closest[2])}}


def search(*, model: str, cluster: str | None = None, gpus: int, seq_len: int, global_batch_tokens: int | None = None,
           routing: str = "balanced", dispatch_bound: str = "guarantee", dtype: str = "bf16", top: int = 5,
           progress=None) -> SearchReport:
    """``planner search``: fastest fitting configurations and the fastest fitting FSDP2 baseline."""
    import time

    pf = build_planfile(model=model, cluster=cluster, gpus=gpus, seq_len=seq_len,
                        global_batch_tokens=global_batch_tokens,
                        overrides={"routing": routing, "dispatch_bound": dispatch_bound, "dtype": dtype})
    from planner.search.rank import search as run

    t0 = time.perf_counter()
    res = run(pf.model, pf.cluster, pf.workload, world_size=gpus, routing=routing, dispatch_bound=dispatch_bound,
              dtype=dtype, top=top, progress=progress)
    closest = None
    if not res.top:
        from planner.budget.peak import capacity_bytes
        from planner.search.rank import lowest_peak

        try:
            plan, peak, _ = lowest_peak(pf.model, pf.cluster, pf.workload, world_size=gpus, stack="composed",
                                        routing=routing, dispatch_bound=dispatch_bound, dtype=dtype)
            closest = (plan, peak, capacity_bytes(make_context(pf.model, pf.cluster, pf.workload, plan)))
        except AssertionError:  # nothing fits even the host
            closest = None
    _raise_if_only_gaps(res)
    return SearchReport(pf.model, pf.cluster, pf.workload, gpus, res, time.perf_counter() - t0, closest)


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


@dataclass
class SweepRow:
    """One stack at one context length (``planner sweep``)."""

    seq_len: int
    stack: str
    fits: bool
    peak_bytes: int
    capacity_bytes: int
    live_set_max_bytes: dict
    """Live set → maximum bytes over phases."""
    binding_live_set: str
    tokens_per_s_per_gpu: float | None
    plan: Any


def sweep(*, model: str, cluster: str | None = None, gpus: int, seq_lens: list[int], routing: str = "balanced",
          dtype: str = "bf16", progress=None) -> list[SweepRow]:
    """``planner sweep``: best composed plan and best baseline at each context length, with the
    verdict and the peak of every live set of each."""
    from planner.search.sweep import best_plans

    for S in seq_lens:
        validate(Workload, {"seq_len": S}, "workload")
    pf = build_planfile(model=model, cluster=cluster, gpus=gpus, seq_len=seq_lens[0],
                        overrides={"routing": routing, "dtype": dtype})
    rows = []
    for pt in best_plans(pf.model, pf.cluster, world_size=gpus, seq_lens=seq_lens, routing=routing, dtype=dtype,
                         progress=progress):
        wl = Workload(seq_len=pt.seq_len)
        for plan, cand in ((pt.composed, pt.composed_candidate), (pt.baseline, pt.baseline_candidate)):
            rep = check_planfile(PlanFile(model=pf.model, cluster=pf.cluster, workload=wl, plan=plan))
            rows.append(SweepRow(pt.seq_len, plan.stack, rep.fits, rep.peak_bytes, rep.capacity_bytes,
                                 {ls: rep.live_set_bytes(ls)[1] for ls in LIVE_SETS}, rep.binding_live_set,
                                 cand.tokens_per_s_per_gpu if cand else None, rep.planfile.plan))
    return rows
