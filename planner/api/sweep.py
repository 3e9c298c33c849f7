"""``planner sweep`` (best plans per context length) and ``planner min-gpus`` (smallest ``W``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.api.build import build, build_planfile
from planner.api.check import check_planfile
from planner.api.frontier import min_headroom_of
from planner.budget.sensitivity import routing_sensitivity
from planner.budget.terms import LIVE_SETS
from planner.errors import Infeasible, InvalidPlan
from planner.plans.routing import routing_basis
from planner.schema import PlanFile, Workload
from planner.schema.io import validate
from planner.schema.knobs import default


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
    routing_basis: dict = field(default_factory=dict)
    """``{"routing", "default", "why"}``: the routing of the verdict and why (``plans.routing``)."""


def sweep(*, model: str, cluster: str | None = None, gpus: int, seq_lens: list[int], routing: str | None = default("routing"),
          dtype: str = default("dtype"), global_batch_tokens: int | None = None, cluster_overrides: dict | None = None,
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
    min_headroom = min_headroom_of(min_headroom)
    for pt in best_plans(pf.model, pf.cluster, world_size=gpus, seq_lens=seq_lens, routing=routing, dtype=dtype,
                         global_batch_tokens=global_batch_tokens, progress=progress, min_headroom=min_headroom):
        wl = Workload(seq_len=pt.seq_len, global_batch_tokens=global_batch_tokens)
        for plan, cand in ((pt.composed, pt.composed_candidate), (pt.baseline, pt.baseline_candidate)):
            rep = check_planfile(PlanFile(model=pf.model, cluster=pf.cluster, workload=wl, plan=plan))
            sens = (routing_sensitivity(pf.model, pf.cluster, wl, rep.ctx.plan, resolved=True)
                    if pf.model.is_moe else {})
            rows.append(SweepRow(pt.seq_len, plan.stack, rep.fits, rep.peak_bytes, rep.capacity_bytes,
                                 {ls: rep.live_set_bytes(ls)[1] for ls in LIVE_SETS}, rep.binding_live_set,
                                 cand.tokens_per_s_per_gpu if cand else None, rep.planfile.plan, sens,
                                 routing_basis(pf.model, plan.model_copy(update={"routing": routing}))))
    return rows


MIN_GPUS_MAX = 4096
"""Largest ``W`` that ``min-gpus`` tries by default."""


@dataclass
class MinGpusReport:
    """``planner min-gpus``: the smallest ``W`` of ``world_sizes`` at which each stack has a plan that fits."""

    model: Any
    workload: Workload
    composed: int | None
    baseline: int | None
    tried: list[dict]
    """Per ``W`` tried: ``{world_size, composed_fit, fsdp2_fit, composed_lowest_peak_bytes, ...}``; the
    counts are of the candidates that leave ``min_headroom`` free."""
    min_headroom: float
    """The share of the usable capacity a fitting plan leaves free (``--min-headroom``)."""

    def to_json(self) -> dict:
        return {"model": self.model.name, "seq_len": self.workload.seq_len, "min_gpus": self.composed,
                "baseline_min_gpus": self.baseline, "min_headroom": self.min_headroom, "tried": self.tried}


def world_sizes(max_gpus: int, gpus_per_node: int) -> list[int]:
    """The ``W`` that ``min-gpus`` tries, increasing: powers of two below ``gpus_per_node`` (part of
    one node), then ``gpus_per_node·2^j`` (whole nodes), all ``≤ max_gpus``. A plan file refuses any
    other ``W`` above one node (``PlanFile`` whole-node check); with a power-of-two
    ``gpus_per_node`` these are the powers of two."""
    part = [1 << k for k in range(gpus_per_node.bit_length()) if 1 << k < gpus_per_node]
    whole = [gpus_per_node << j for j in range(max(max_gpus // gpus_per_node, 0).bit_length())]
    return [W for W in part + whole if W <= max_gpus]


def min_gpus(*, model: str, seq_len: int, cluster: str | None = None, cluster_overrides: dict | None = None,
             routing: str | None = default("routing"), dispatch_bound: str = default("dispatch_bound"), dtype: str = default("dtype"),
             max_gpus: int = MIN_GPUS_MAX, min_headroom: float | None = None, progress=None) -> MinGpusReport:
    """Smallest ``W ≤ max_gpus`` of ``world_sizes`` for which some legal composed plan fits (HBM
    with ``min_headroom`` of the usable capacity free, as ``search`` keeps it, and host RAM), and
    the same for the FSDP2 baseline, by the memory model alone (the search's candidate space, no
    time model). Powers of two (times ``gpus_per_node`` past one node): the
    legal degrees (``D``, ``E_p``, ``P``, ``tp``, ``cp``) divide ``W`` and the heads and experts,
    which are powers of two in every shipped model; every ``W`` tried fills whole nodes or part of
    one, so ``planner search --gpus W`` accepts the answer."""
    from planner.search.rank import lowest_peak

    if not 1 <= max_gpus <= 2**20:
        raise InvalidPlan("--max-gpus", max_gpus, "must be in 1..1048576", "give e.g. --max-gpus 4096")
    headroom = min_headroom_of(min_headroom)
    pf, _ = build(model=model, cluster=cluster, gpus=1, seq_len=seq_len, cluster_overrides=cluster_overrides,
                  overrides={"routing": routing, "dispatch_bound": dispatch_bound, "dtype": dtype})
    found: dict[str, int | None] = {"composed": None, "fsdp2": None}
    tried = []
    ws = world_sizes(max_gpus, pf.cluster.topology.gpus_per_node)
    for j, W in enumerate(ws):
        row: dict[str, Any] = {"world_size": W}
        for st in ("composed", "fsdp2"):
            if found[st] is not None:
                continue
            try:
                _, peak, n_fit = lowest_peak(pf.model, pf.cluster, pf.workload, world_size=W, stack=st,
                                             routing=routing, dispatch_bound=dispatch_bound, dtype=dtype,
                                             host_fallback=True, min_headroom=headroom)
            except Infeasible:  # no legal candidate at this W
                peak, n_fit = None, 0
            row[f"{st}_fit"], row[f"{st}_lowest_peak_bytes"] = n_fit, peak
            if n_fit:
                found[st] = W
        tried.append(row)
        if progress:
            progress(j + 1, len(ws))
        if all(v is not None for v in found.values()):
            break
    return MinGpusReport(pf.model, pf.workload, found["composed"], found["fsdp2"], tried, headroom)
