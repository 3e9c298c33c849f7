"""Pure functions behind the CLI: ``check``, ``max_context``, ``max_batch`` (DESIGN §10).

Each takes keyword arguments only and returns a report object; rendering lives in
``planner.report``. Errors are ``planner.errors.PlanError`` subclasses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.budget.build import make_context
from planner.budget.context import Ctx
from planner.budget.host import host_budget
from planner.budget.peak import Evaluation, assumed_used, capacity_bytes, evaluate, outside_allocator_bytes
from planner.budget.resolve import resolve_plan, seq_parallel_note
from planner.budget.sensitivity import routing_sensitivity
from planner.budget.work_bounds import TooCostly
from planner.budget.terms import LIVE_SETS, PHASE_KINDS
from planner.errors import InvalidPlan, PlanError
from planner.schema.cluster_ref import planfile_doc
from planner.schema import PlanFile, Workload
from planner.schema.io import load_cluster, load_model_noted, validate
from planner.schema.plan import check_inert

COMPOSED_KEYS = {
    "dispatch", "dispatch_residue", "vocab", "optimizer", "checkpoint", "seq_parallel", "expert_parallel", "vocab_parallel",
    "vocab_blocks", "token_budget", "max_chunks", "llep_alpha", "llep_min_tokens", "llep_lambda",
    "max_imports", "bucket_params", "staging_slots", "sco_host_bytes",
}
"""Overrides that land in ``plan.composed``."""
BASELINE_KEYS = {"tp", "cp", "dp_shard", "ep", "ac", "cpu_offload", "dp_replicate", "cp_rotate", "head",
                 "head_chunk_tokens", "grad_lifetime"}
"""Overrides that land in ``plan.baseline``."""
PLAN_KEYS = {"routing", "dispatch_bound", "dtype", "stack"}
"""Overrides that land in ``plan``."""


def build_planfile(**kwargs) -> PlanFile:
    """Assemble an (unresolved) plan file: see ``build`` for the arguments."""
    return build(**kwargs)[0]


def build(*, model: str | None = None, plan_file: str | None = None, cluster: str | None = None,
          gpus: int | None = None, seq_len: int | None = None, global_batch_tokens: int | None = None,
          seqs_per_microbatch: int | None = None, overrides: dict[str, Any] | None = None,
          cluster_overrides: dict[str, int] | None = None,
          mtp_trained: bool | None = None,
          notes: list[str] | None = None) -> tuple[PlanFile, dict | None]:
    """An (unresolved) plan file from a plan file and/or a model plus flag overrides, and the
    reference that names its cluster in a written plan file (``None`` for an old plan file that
    embeds its profile and no ``--cluster``). ``cluster_overrides`` are topology fields
    (``planner.schema.cluster_ref.TOPOLOGY_FLAGS``) replacing the profile's. ``notes`` receives the Hugging Face importer's
    warnings.

    Raises:
        InvalidPlan: neither a model nor a plan file, or ``--gpus``/``--seq-len`` missing.
    """
    from planner.schema.cluster_ref import apply_topology, cluster_reference, read_plan_document

    ov = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(ov) - COMPOSED_KEYS - BASELINE_KEYS - PLAN_KEYS
    assert not unknown, unknown
    cov = dict(cluster_overrides or {})
    if model is not None:
        _refuse_folder(model)
    if plan_file:
        pf, file_ref, file_base = read_plan_document(plan_file)
        m = _model(model, notes) if model else pf.model
        if cluster is not None:
            base = load_cluster(cluster)
            ref = cluster_reference(cluster, base, cov)
        elif file_ref is not None:
            base, cov = file_base, {**file_ref.get("topology", {}), **cov}
            ref = cluster_reference(file_ref["profile"], base, cov)
        else:
            base, ref = pf.cluster, None
        c = apply_topology(base, cov)
        wl = pf.workload.model_dump()
        plan = pf.plan.model_dump()
        if ov.get("stack", plan["stack"]) != plan["stack"]:
            plan["composed" if plan["stack"] == "composed" else "baseline"] = {}
    else:
        if model is None:
            raise InvalidPlan("MODEL", None, "is required", "give a model name/file or --plan FILE")
        from planner.schema.cluster_ref import DEFAULT_CLUSTER

        m, base = _model(model, notes), load_cluster(DEFAULT_CLUSTER if cluster is None else cluster)
        c, ref = apply_topology(base, cov), cluster_reference(cluster, base, cov)
        wl, plan = {}, {"composed": {}, "baseline": {}}
        if gpus is None:
            raise InvalidPlan("--gpus", None, "is required without --plan", "add e.g. --gpus 8")
        if seq_len is None:
            raise InvalidPlan("--seq-len", None, "is required without --plan", "add e.g. --seq-len 128k")
    ov = _stack_overrides(ov, ov.get("stack", plan.get("stack", "composed")))
    if mtp_trained is not None:
        if not m.mtp_layers:
            raise InvalidPlan("--mtp-trained" if mtp_trained else "--no-mtp-trained", m.name,
                              "applies to a model with MTP layers (this one has none)", "drop the flag")
        m = m.model_copy(update={"mtp_trained": mtp_trained})
    if gpus is not None:
        plan["world_size"] = gpus
    if seq_len is not None:
        wl["seq_len"] = seq_len
    if global_batch_tokens is not None:
        wl["global_batch_tokens"] = global_batch_tokens
    if seqs_per_microbatch is not None:
        wl["seqs_per_microbatch"] = seqs_per_microbatch
    for k, v in ov.items():
        if k in PLAN_KEYS:
            plan[k] = v
        elif k in COMPOSED_KEYS:
            plan.setdefault("composed", {})[k] = v
        else:
            plan.setdefault("baseline", {})[k] = v
    if plan.get("stack", "composed") == "composed":
        check_inert(set(ov), plan.get("composed") or {}, _flag)
    return validate(PlanFile, {"model": m, "cluster": c, "workload": wl, "plan": plan}, ""), ref


def refuse_planner_file(data: dict, path: str) -> None:
    """``import-hf`` given one of the planner's own files: say what the file is and how to use it.

    Raises:
        InvalidPlan: ``data`` is a planner model profile, plan file or cluster profile.
    """
    if {"plan", "workload"} & set(data) and "num_layers" not in data:
        raise InvalidPlan("CONFIG", path, "is a planner plan file, not a Hugging Face config",
                          f"use it as it is: planner check --plan {path}")
    if "topology" in data and "memory" in data:
        raise InvalidPlan("CONFIG", path, "is a planner cluster profile, not a Hugging Face config",
                          f"use it as it is: planner check MODEL --cluster {path}")
    if "num_layers" in data and "hidden_size" in data and "name" in data:
        raise InvalidPlan("CONFIG", path, "is already a planner model profile, not a Hugging Face config",
                          f"use it as it is: planner check {path} --gpus W --seq-len S")


def _refuse_folder(model: str) -> None:
    """A Hugging Face model folder given as MODEL: name the file to pass."""
    from pathlib import Path

    p = Path(model)
    try:
        folder = p.is_dir() and (os.sep in model or (p / "config.json").is_file())
    except OSError:
        return
    if folder:
        fix = (f"pass {p / 'config.json'}" if (p / "config.json").is_file()
               else "pass the folder's config.json (a Hugging Face config) or a model YAML")
        raise InvalidPlan("MODEL", model, "is a folder, not a model file", fix)


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
    cluster_ref: dict | None = None
    """How the ``plan`` of ``--json`` names its cluster (``planner.schema.cluster_ref``)."""

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
        extra={"dispatch_bounds": dispatch_bounds(ctx, ev), "step": step_summary(ctx)},
        warnings=[n for n in (seq_parallel_note(pf.model, pf.workload, pf.plan),) if n],
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
    """``planner check``: see ``build`` for the arguments; the report's ``warnings`` hold the
    Hugging Face importer's warnings and the note on a fallen-back ``D``; it also carries the
    routing sensitivity (``budget.sensitivity``)."""
    notes: list[str] = []
    pf, ref = build(**kwargs, notes=notes)
    rep = check_planfile(pf)
    rep.warnings = notes + rep.warnings
    rep.cluster_ref = ref
    rep.extra["routing_sensitivity"] = routing_sensitivity(pf.model, pf.cluster, pf.workload, pf.plan)
    return rep


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
            W = self.planfile.plan.world_size
            D = resolve_plan(self.planfile.model, self.planfile.workload, self.planfile.plan)
            deg = D.composed.seq_parallel if D.stack == "composed" else D.baseline.cp
            out["max_seqs_per_microbatch"] = best
            out["max_global_batch_tokens"] = (None if best is None
                                              else W // deg * best * self.planfile.workload.seq_len)
        out["grid"] = {"values": s.values.tolist(), "tokens_per_rank": s.tokens_per_rank.tolist(),
                       "peak_bytes": s.peak_bytes.tolist(), "host_bytes": s.host_bytes.tolist(),
                       "fits": s.fits.tolist()}
        out["plan"] = planfile_doc(self.planfile, self.cluster_ref)
        return out


DEFAULT_SEQ_STEP_PER_RANK = 1024
"""``max-context`` grid step without ``--seq-step``: ``S`` grows by ``1024·D`` (1024 tokens per rank)."""


def max_context(*, seq_step: int | None = None, max_seq_len: int = 16 * 2**20, min_headroom: float | None = None,
                **kwargs) -> FrontierReport:
    """``planner max-context``: scan ``S`` over the whole grid (DESIGN §3.4). ``seq_step`` and
    ``max_seq_len`` are both total context ``S``; the step is rounded up to a multiple of the
    sequence-sharding degree ``D`` (``cp`` for the baseline), default ``1024·D``."""
    from planner.budget.frontier import scan, seq_len_grid

    if kwargs.get("seq_len") is None and not kwargs.get("plan_file"):
        kwargs["seq_len"] = (seq_step or DEFAULT_SEQ_STEP_PER_RANK) * (kwargs.get("gpus") or 1)
    pf, ref = build(**kwargs)
    plan = resolve_plan(pf.model, pf.workload, pf.plan)
    D = plan.composed.seq_parallel if plan.stack == "composed" else plan.baseline.cp
    per_rank = DEFAULT_SEQ_STEP_PER_RANK if seq_step is None else -(-seq_step // D)
    grid = seq_len_grid(pf, per_rank, max_seq_len)
    return FrontierReport(pf, "seq_len", scan(pf, "seq_len", grid, **_headroom(min_headroom)), ref)


def _headroom(min_headroom: float | None) -> dict:
    """``--min-headroom`` for the frontier scans (``None``: the default of ``budget.frontier``)."""
    if min_headroom is None:
        return {}
    if not 0.0 <= min_headroom < 1.0:
        raise InvalidPlan("--min-headroom", min_headroom, "must be in [0, 1)", "use e.g. 0.03")
    return {"min_headroom": float(min_headroom)}


def max_batch(*, max_tokens: int = 16 * 2**20, min_headroom: float | None = None, **kwargs) -> FrontierReport:
    """``planner max-batch``: scan sequences per micro-batch at fixed ``S`` (whole grid)."""
    from planner.budget.frontier import batch_grid, scan

    pf, ref = build(**kwargs)
    return FrontierReport(pf, "seqs_per_microbatch", scan(pf, "seqs_per_microbatch", batch_grid(pf, max_tokens),
                                                          **_headroom(min_headroom)), ref)


STACKS = ("best", "composed", "fsdp2")
"""What ``search --out`` writes: ``best`` (the faster stack among those that fit), or one stack."""


@dataclass
class Closest:
    """The lowest-peak legal plan of a stack when none of its plans fits, and why it fails."""

    report: CheckReport

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
        parts = {"optimizer state": int(h.optimizer_bytes), "SCO boundaries": int(h.sco_bytes),
                 "process baselines": int(h.baseline_bytes)}
        top = ", ".join(f"{k} {gib(v):.1f} GiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
        return (f"over host RAM: {gib(int(h.bytes)):.1f} GiB > {gib(int(h.capacity_bytes)):.1f} GiB usable per node "
                f"({h.ranks_per_node} ranks: {top})")

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

    @property
    def chosen_stack(self) -> str:
        """The stack of the plan ``--out`` writes: under ``best``, the faster of the fitting stacks
        (composed on a tie); when neither fits, the one whose closest plan is nearer fitting (the
        smaller of its HBM and host-RAM overshoot ratios, the larger taken per plan)."""
        if self.stack != "best":
            return self.stack
        r = self.result
        if r.top and r.baseline:
            return "fsdp2" if r.baseline.step_s < r.top[0].step_s else "composed"
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
        return PlanFile(model=self.model, cluster=self.cluster, workload=self.workload, plan=ch[0])

    def planfile_doc(self) -> dict | None:
        """What ``--out`` writes: the plan file with the cluster named by reference."""
        pf = self.planfile()
        return None if pf is None else planfile_doc(pf, self.cluster_ref)

    def to_json(self) -> dict:
        def cand(c):
            return None if c is None else {
                "step_s": c.step_s, "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "tflops_per_gpu": c.tflops_per_gpu,
                "peak_bytes": c.peak_bytes, "host_bytes": c.host_bytes, "binding_phase": c.binding_phase,
                "breakdown": c.breakdown, "components": c.components, "plan": c.plan.model_dump(mode="json")}
        r = self.result
        ch = self.chosen
        return {"model": self.model.name, "world_size": self.world_size, "seq_len": self.workload.seq_len,
                "top": [cand(c) for c in r.top], "baseline": cand(r.baseline),
                "speedup_vs_baseline": (r.baseline.step_s / r.top[0].step_s if r.top and r.baseline else None),
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
           routing: str = "balanced", dispatch_bound: str = "guarantee", dtype: str = "bf16", top: int = 5,
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

    t0 = time.perf_counter()
    res = run(pf.model, pf.cluster, pf.workload, world_size=gpus, routing=routing, dispatch_bound=dispatch_bound,
              dtype=dtype, top=top, progress=progress, **_headroom(min_headroom))
    closest = {}
    for st, found in (("composed", res.top), ("fsdp2", res.baseline)):
        if found:
            continue
        plan, _, _ = lowest_peak(pf.model, pf.cluster, pf.workload, world_size=gpus, stack=st, routing=routing,
                                 dispatch_bound=dispatch_bound, dtype=dtype, host_fallback=True)
        try:
            closest[st] = Closest(check_planfile(pf.model_copy(update={"plan": plan})))
        except PlanError:  # a plan check refuses cannot be offered as the closest (nor written)
            continue
    _raise_if_only_gaps(res)
    sens = {name: routing_sensitivity(pf.model, pf.cluster, pf.workload, c.plan)
            for name, c in (("composed", res.top[0] if res.top else None), ("baseline", res.baseline)) if c}
    rep = SearchReport(pf.model, pf.cluster, pf.workload, gpus, res, time.perf_counter() - t0, stack, closest, ref)
    rep.routing_sensitivity = sens
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
    routing_sensitivity: dict = field(default_factory=dict)
    """``{routing: {"peak_bytes", "fits_hbm"}}`` under balanced, the named skew and worst routing
    (``budget.sensitivity``); empty for a dense model, which has no dispatch."""


def sweep(*, model: str, cluster: str | None = None, gpus: int, seq_lens: list[int], routing: str = "balanced",
          dtype: str = "bf16", global_batch_tokens: int | None = None, cluster_overrides: dict | None = None,
          progress=None, min_headroom: float | None = None) -> list[SweepRow]:
    """``planner sweep``: best composed plan and best baseline at each context length, with the
    verdict and the peak of every live set of each. ``global_batch_tokens`` is the same at every
    length (the tokens per optimizer step; the rest of each length's micro-steps is accumulation)."""
    from planner.search.sweep import best_plans

    for S in seq_lens:
        validate(Workload, {"seq_len": S, "global_batch_tokens": global_batch_tokens}, "workload")
    pf = build_planfile(model=model, cluster=cluster, gpus=gpus, seq_len=seq_lens[0],
                        global_batch_tokens=global_batch_tokens, cluster_overrides=cluster_overrides,
                        overrides={"routing": routing, "dtype": dtype})
    rows = []
    _headroom(min_headroom)
    for pt in best_plans(pf.model, pf.cluster, world_size=gpus, seq_lens=seq_lens, routing=routing, dtype=dtype,
                         global_batch_tokens=global_batch_tokens, progress=progress, min_headroom=min_headroom):
        wl = Workload(seq_len=pt.seq_len, global_batch_tokens=global_batch_tokens)
        for plan, cand in ((pt.composed, pt.composed_candidate), (pt.baseline, pt.baseline_candidate)):
            rep = check_planfile(PlanFile(model=pf.model, cluster=pf.cluster, workload=wl, plan=plan))
            sens = routing_sensitivity(pf.model, pf.cluster, wl, plan) if pf.model.is_moe else {}
            rows.append(SweepRow(pt.seq_len, plan.stack, rep.fits, rep.peak_bytes, rep.capacity_bytes,
                                 {ls: rep.live_set_bytes(ls)[1] for ls in LIVE_SETS}, rep.binding_live_set,
                                 cand.tokens_per_s_per_gpu if cand else None, rep.planfile.plan, sens))
    return rows


MIN_GPUS_MAX = 4096
"""Largest ``W`` that ``min-gpus`` tries by default."""


@dataclass
class MinGpusReport:
    """``planner min-gpus``: the smallest power-of-two ``W`` at which each stack has a plan that fits."""

    model: Any
    workload: Workload
    composed: int | None
    baseline: int | None
    tried: list[dict]
    """Per ``W`` tried: ``{world_size, composed_fit, baseline_fit, composed_lowest_peak_bytes, ...}``."""

    def to_json(self) -> dict:
        return {"model": self.model.name, "seq_len": self.workload.seq_len, "min_gpus": self.composed,
                "baseline_min_gpus": self.baseline, "tried": self.tried}


def min_gpus(*, model: str, seq_len: int, cluster: str | None = None, cluster_overrides: dict | None = None,
             routing: str = "balanced", dispatch_bound: str = "guarantee", dtype: str = "bf16",
             max_gpus: int = MIN_GPUS_MAX, progress=None) -> MinGpusReport:
    """Smallest ``W = 2^k ≤ max_gpus`` for which some legal composed plan fits (HBM and host RAM),
    and the same for the FSDP2 baseline, by the memory model alone (the search's candidate space,
    no time model). Powers of two: the legal degrees (``D``, ``E_p``, ``P``, ``tp``, ``cp``) divide
    ``W`` and the heads and experts, which are powers of two in every shipped model."""
    from planner.search.rank import lowest_peak

    if not 1 <= max_gpus <= 2**20:
        raise InvalidPlan("--max-gpus", max_gpus, "must be in 1..1048576", "give e.g. --max-gpus 4096")
    pf, _ = build(model=model, cluster=cluster, gpus=1, seq_len=seq_len, cluster_overrides=cluster_overrides,
                  overrides={"routing": routing, "dispatch_bound": dispatch_bound, "dtype": dtype})
    found: dict[str, int | None] = {"composed": None, "fsdp2": None}
    tried = []
    ws = [1 << k for k in range(max_gpus.bit_length()) if 1 << k <= max_gpus]
    for j, W in enumerate(ws):
        row: dict[str, Any] = {"world_size": W}
        for st in ("composed", "fsdp2"):
            if found[st] is not None:
                continue
            try:
                _, peak, n_fit = lowest_peak(pf.model, pf.cluster, pf.workload, world_size=W, stack=st,
                                             routing=routing, dispatch_bound=dispatch_bound, dtype=dtype,
                                             host_fallback=True)
            except AssertionError:  # no legal candidate at this W
                peak, n_fit = None, 0
            row[f"{st}_fit"], row[f"{st}_lowest_peak_bytes"] = n_fit, peak
            if n_fit:
                found[st] = W
        tried.append(row)
        if progress:
            progress(j + 1, len(ws))
        if all(v is not None for v in found.values()):
            break
    return MinGpusReport(pf.model, pf.workload, found["composed"], found["fsdp2"], tried)
