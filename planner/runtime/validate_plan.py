"""The planner's side of ``planner validate``: the truncated plan and its per-phase prediction.

``truncate`` derives the truncated plan file **once** (depth ``L → N``; widths, sequence, degrees
and every knob kept); the runtime builds its step from it and ``predict`` evaluates the budget on
the very same plan file, so the two sides can only differ in what they count.

``predict`` evaluates every phase of DESIGN §3.1 (``full_phases``), the gradient lifetime included
(``Ctx.grad_lifetime``), plus the step time at ``M = 1`` micro-step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from planner.api import derived_symbols
from planner.budget.build import make_context
from planner.context.ctx import Ctx
from planner.budget.peak import Evaluation, capacity_bytes, evaluate
from planner.budget.terms import LIVE_SETS
from planner.errors import InvalidPlan
from planner.schema import ModelSpec, PlanFile
from planner.schema.knobs import default as knob_default

GRAD_LIFETIMES = ("freed", "accumulate")
"""``freed``: ``zero_grad(set_to_none=True)`` between steps; ``accumulate``: gradients kept across
micro-steps (gradient accumulation)."""


@dataclass
class Truncation:
    """The plan file both sides use, and what truncation changed (in words)."""

    planfile: PlanFile
    changes: list[str]


def truncate(pf: PlanFile, layers: int | None) -> Truncation:
    """``pf`` with its model cut to ``layers`` decoder layers (``None``: unchanged).

    Dense and local (sliding-window) layer indices beyond the cut are dropped; widths, ``N``, the
    degrees and every knob stay. A fixed SCO host budget stays too, so the boundaries SCO offloads
    are re-derived for ``2·layers`` boundaries.

    Raises:
        InvalidPlan: ``layers`` < 1 or more than the model has.
    """
    m = pf.model
    if layers is None or layers == m.num_layers:
        return Truncation(pf, [])
    if not 1 <= layers <= m.num_layers:
        raise InvalidPlan("--layers", layers, f"must be in [1, {m.num_layers}] (model.num_layers)",
                          f"give --layers between 1 and {m.num_layers}")
    data = m.model_dump()
    data.update(num_layers=layers, dense_layers=[i for i in m.dense_layers if i < layers],
                local_layers=[i for i in m.local_layers if i < layers])
    mt = ModelSpec.model_validate(data)
    before, after = m.param_counts()["total"], mt.param_counts()["total"]
    changes = [f"model.num_layers {m.num_layers} → {layers} (L_b {2 * m.num_layers} → {2 * layers})",
               f"parameters Θ {before / 1e9:.3f}B → {after / 1e9:.3f}B"]
    if tuple(mt.dense_layers) != tuple(m.dense_layers):
        changes.append(f"model.dense_layers {list(m.dense_layers)} → {list(mt.dense_layers)}")
    if tuple(mt.local_layers) != tuple(m.local_layers):
        changes.append(f"model.local_layers: {len(m.local_layers)} → {len(mt.local_layers)} sliding-window layers")
    changes.append("kept: hidden widths, heads, experts, vocabulary, S, N, W and every degree and knob")
    return Truncation(pf.model_copy(update={"model": mt}), changes)


@dataclass
class Prediction:
    """The budget of one rank in every phase, for one gradient lifetime."""

    ctx: Ctx
    evaluation: Evaluation
    capacity_bytes: int
    step_s: float | None
    """Predicted seconds of one step at one micro-step (``None`` where the profile has a gap)."""
    step_components: dict | None = None
    """That step's components in seconds (``StepTime.components``; ``None`` without timing)."""
    step_phases: dict | None = None
    """The same seconds by phase kind (``StepTime.phases``; ``None`` without timing)."""

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.evaluation.phases]

    def phase_bytes(self, label: str, exclude: tuple[str, ...] = ()) -> int:
        """The phase total, less the live sets in ``exclude`` (a trace cannot see ``workspace``)."""
        return (int(self.evaluation.by_phase[self.labels.index(label)])
                - sum(self.live_set_bytes(label, ls) for ls in exclude))

    def live_set_bytes(self, label: str, live_set: str) -> int:
        return int(self.evaluation.live_set_bytes(live_set)[self.labels.index(label)])

    def step_start_workspace_bytes(self) -> int:
        """The ``workspace`` bytes held in every phase (the cuBLAS workspaces): allocated at the
        step's start, from the step before."""
        return int(self.evaluation.live_set_bytes("workspace").min())

    def term_bytes(self, label: str, names: tuple[str, ...], live_set: str | None = None) -> int:
        """Sum of the named terms (of ``live_set``, if given) in phase ``label``."""
        i = self.labels.index(label)
        ev = self.evaluation
        return int(sum(int(ev.term_bytes[j, i]) for j, t in enumerate(ev.terms)
                       if t.name in names and (live_set is None or t.live_set == live_set)))

    def by_live_set(self, label: str) -> dict[str, int]:
        return {ls: self.live_set_bytes(label, ls) for ls in LIVE_SETS}

    @property
    def peak_bytes(self) -> int:
        return int(self.evaluation.peak_bytes)

    @property
    def binding_phase(self) -> str:
        return self.labels[int(self.evaluation.binding_index)]


def context(pf: PlanFile, grad_lifetime: str, dispatch_bound: str | None = None) -> Ctx:
    """The context ``predict`` evaluates (before a rank is chosen): ``pf`` under ``grad_lifetime``
    and ``dispatch_bound`` (default the plan's own)."""
    if grad_lifetime not in GRAD_LIFETIMES:
        raise InvalidPlan("--grad-lifetime", grad_lifetime, f"must be one of {', '.join(GRAD_LIFETIMES)}",
                          "use --grad-lifetime freed or accumulate")
    plan = pf.plan if dispatch_bound is None else pf.plan.model_copy(update={"dispatch_bound": dispatch_bound})
    return dataclasses.replace(make_context(pf.model, pf.cluster, pf.workload, plan), grad_lifetime=grad_lifetime)


def predict(pf: PlanFile, grad_lifetime: str = knob_default("grad_lifetime"), *, timing: bool = True,
            dispatch_bound: str | None = None, rank: int | None = None) -> Prediction:
    """Evaluate ``pf`` at every phase under ``grad_lifetime`` (and ``dispatch_bound``, default the
    plan's own). ``rank``: the global rank a run measures; the expected dispatch buffers are then
    that rank's (its expert-group rank's plan, ``expert_group_rank``) rather than the largest over
    ranks, which the verdict takes: one rank's step is compared with that rank's formula."""
    ctx = context(pf, grad_lifetime, dispatch_bound)
    if rank is not None and ctx.model.is_moe:
        ctx = dataclasses.replace(ctx, dispatch_rank=expert_group_rank(ctx, rank))
    step_s = components = phases = None
    if timing:
        from planner.timing.step import step_time

        st = step_time(ctx, micro_steps_override=1)
        v = float(np.asarray(st.total_s).reshape(-1)[0])
        step_s = None if not np.isfinite(v) else v
        components = {k: float(np.asarray(c).reshape(-1)[0]) for k, c in st.components.items()}
        phases = {k: float(np.asarray(c).reshape(-1)[0]) for k, c in st.phases.items()}
    return Prediction(ctx, evaluate(ctx), capacity_bytes(ctx), step_s, components, phases)


def expert_group_rank(ctx: Ctx, rank: int) -> int:
    """Global ``rank``'s index in its expert-parallel group: consecutive blocks of ``E_p`` ranks in
    the composed layout (``planner.runtime.mop_groups``), and in the FSDP2 layout ``ep`` consecutive
    in the data-parallel shard after ``tp`` (``planner.runtime.fsdp2_layout.build_meshes``)."""
    if ctx.stack == "fsdp2":
        return rank // int(ctx.tp) % int(ctx.ep)
    return rank % int(ctx.expert_parallel)


def binding_rank(ctx: Ctx) -> tuple[int, str]:
    """The rank whose class binds, and why (``--rank`` default).

    Rank 0 holds the largest vocabulary shard (``ceil(V/P)`` rows) and, under balanced routing,
    every rank runs the same dispatch plan; under a skewed routing the binding rank of the
    dispatch plan (``planner.budget.dispatch.expected``) is taken.
    """
    if not ctx.model.is_moe or ctx.routing == "balanced" or ctx.stack != "composed":
        return 0, "rank 0: the largest vocabulary shard; every rank has the same dispatch plan"
    from planner.budget import dispatch

    res = dispatch.expected(ctx.dispatch, dispatch.profile_of(ctx), int(ctx.tokens_per_rank), ctx.hidden_size,
                            ctx.expert_ffn, ctx.num_experts, ctx.top_k, ctx.act_bytes, int(ctx.expert_parallel),
                            int(ctx.token_budget), int(ctx.max_chunks), float(ctx.llep_alpha),
                            int(ctx.llep_min_tokens), float(ctx.llep_lambda), int(ctx.max_imports),
                            dispatch.regime(ctx), **dispatch.inventory_flags(ctx))
    pk, _, d = max(res.values(), key=lambda v: v[0])
    return int(d), f"rank {d}: the binding rank of the dispatch plan on routing {ctx.routing_text}"


def symbols(ctx: Ctx) -> dict:
    """The resolved symbols worth printing."""
    out = derived_symbols(ctx)
    out["grad_lifetime"] = ctx.grad_lifetime
    return out
