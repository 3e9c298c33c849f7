"""Live set ``dispatch``: router logits and the expert-dispatch buffers of ``moe`` regions (§3.2).

Counts are the operators' tensor inventories (``planner.budget.dispatch_inventory``, read off
``planner/runtime/{expert_parallel,llep,pipelined_llep}.py``), evaluated in two ways:

- **expected** (``dispatch_bound = expected``): the integer plan of ``planner.plans`` evaluated on
  the named routing profile's synthetic routing (every rank the same profile), maximised over
  ranks; the binding rank's buffers become the terms.
- **guarantee** (PipelinedLLEP, ``dispatch_bound = guarantee``): the same inventory with
  per-chunk rows ``E_p·k·c_eff`` received and ``k·c_eff`` sent per chunk, GEMM blocks of
  ``max(m, ceil(E_p·k·c_eff/E))`` rows, a residue of
  ``min(E_p·k·N_max, max(ceil(max(α,λ)·k·N_max) + (E/E_p)·(m-1), U))`` rows and ``n_import_max``
  imported experts. ``U`` bounds a rank whose LLEP plan leaves excess unplaced because the import
  slots ran out (``planner.plans.llep.unplaced_bound_routes``), so the guarantee holds for every
  routing; ``E_p·k·N_max`` (all routes of the group) caps it, ``α = inf`` included.
  LLEP's received rows have the same cap; standard EP has no launch-time bound and is sized under
  the routing assumption (``worst``: ``E_p·N·min(k, E/E_p)`` rows to one rank). Per chunk, a
  destination receives ``Q_i ≤ min(E_p·k·c_eff, ceil(L/K) + E_p·(n + n_import_max))`` rows
  (``plans.dispatch.chunk_recv_bound``, ``L`` its layer load bound).
- **guarantee, source residue** (``dispatch_residue = source``, the default): no residue; one
  chunk's buffers at ``L = L_0 = ceil(max(α,λ)·k·N_max) + (E/E_p)(m−1)`` (the plan raises the chunk
  count where LLEP leaves a rank above ``L_0``), the imports and the source-side ``k·N`` route
  indices: the same bytes for every routing (``dispatch_inventory.pipelined_source``).

Phases (``moe`` regions): inside a checkpointed region (``per_layer``/``sco``, FSDP2 ``ac=full``)
``forward[r]`` holds the non-saving forward and ``backward[r]`` the recompute, then the backward.
Left to ``boundaries``: the region's input and output in forward, the boundary gradients in
backward, and (``checkpoint = none``) earlier regions' saved activations.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.budget import dispatch_inventory as inv
from planner.context.ctx import Ctx
from planner.context.derive import chunk_symbols
from planner.budget.dispatch_buffers import OUTPUT
from planner.budget.dispatch_edges import UNCHUNKED, books_own_grads, books_region_io, inventory_flags
from planner.budget.terms import Term
from planner.budget.work_bounds import check_expected_work
from planner.plans import chunking, dispatch as plans_dispatch, llep, routing

SOURCE = "DESIGN §3.2 Dispatch; planner/runtime dispatch operators (dispatch_inventory)"
SOURCE_OP = "pipelined_llep_source"
"""Inventory name of PipelinedLLEP with ``dispatch_residue = source`` (``pipelined_llep`` is the
destination-residue variant)."""


def plan_operator(op: str) -> tuple[str, str]:
    """``(operator, residue)`` of ``planner.plans.dispatch.plan_layer`` for an inventory name."""
    if op == SOURCE_OP:
        return "pipelined_llep", plans_dispatch.SOURCE
    return op, plans_dispatch.DESTINATION


# ---- one rank's sizes under a plan --------------------------------------------------------------
def rank_sizes(plan: plans_dispatch.DispatchPlan, d: int) -> dict:
    """Per-chunk rows of rank ``d``: sent ``C``, received ``Q``, largest GEMM block ``r``."""
    send = plan.send_KWW
    C = send[:, d, :].sum(1).tolist()
    Q = send[:, :, d].sum(1).tolist()
    slot_rows = plan.chunk_KWWS[:, :, d, :].sum(1)            # [K, S]
    if plan.block_rows:
        slot_rows = np.minimum(slot_rows, plan.block_rows)
    return dict(N=int(plan.tokens_W[d]), C=C, Q=Q, r=slot_rows.max(1).tolist(),
                X=len(plan.assignment.imports[d]), X_e=len(plan.assignment.exports[d]))


def moments(op: str, shape: inv.Shape, sz: dict, n_local: int, *, standalone: bool,
            own_grads: bool = False, region_io: bool = False) -> dict:
    """The inventory timelines of ``op`` for one rank (see ``dispatch_inventory``; ``own_grads``:
    standard EP and LLEP only, ``region_io`` also PipelinedLLEP's destination variant,
    ``inventory_flags``)."""
    s = inv.Shape(sz["N"], shape.H, shape.I, shape.E, shape.k, shape.b)
    if op == SOURCE_OP:
        return inv.pipelined_source(s, sz["C"], sz["Q"], sz["r"], sz["X"], sz["X_e"],
                                    standalone=standalone)
    if op == "pipelined_llep":
        resid = np.cumsum(sz["Q"]).tolist()
        return inv.pipelined(s, sz["C"], sz["Q"], sz["r"], resid, sz["X"], sz["X_e"],
                             standalone=standalone, region_io=region_io)
    return inv.unchunked(s, sum(sz["Q"]), sz["r"][0], sz["X"], sz["X_e"], n_local,
                         standalone=standalone, own_grads=own_grads, region_io=region_io)


def peak(moment_list: list[dict]) -> tuple[int, dict]:
    """(bytes, moment) of the largest moment (scalar counts)."""
    best = max(moment_list, key=lambda m: int(inv.total_bytes(m)))
    return int(inv.total_bytes(best)), best


def phase_moments(mom: dict, regime: str, keep_output: bool = False) -> dict[str, list[dict]]:
    """Moments per phase kind: ``standalone`` (one step of the bare operator), ``checkpointed``
    (inside a non-reentrant region checkpoint) or ``saved`` (no checkpointing). The forward's
    output accumulator belongs to ``boundaries`` unless ``keep_output`` (``books_region_io``);
    then a ``saved`` forward also holds the region's residual add after the operator
    (``region_end``: LLEP, standard EP)."""
    def drop_out(ms):
        if keep_output:
            return ms
        return [{k: v for k, v in m.items() if k[0] != OUTPUT} for m in ms]

    if regime == "standalone":
        return {"forward": mom["forward"], "backward": mom["backward"]}
    if regime == "checkpointed":
        return {"forward": drop_out(mom["forward_nosave"]), "backward": mom["forward"] + mom["backward"]}
    fwd = mom["forward"] + (mom.get("region_end", []) if keep_output else [])
    return {"forward": drop_out(fwd), "backward": mom["backward"], "saved": [mom["saved_end"]]}


# ---- expected: the plan on the profile --------------------------------------------------------
@lru_cache(maxsize=4096)
def expected(op: str, profile: str, N: int, H: int, I: int, E: int, k: int, b: int, E_p: int,
             c: int, K_max: int, alpha: float, m: int, lam: float, n_imp: int, regime: str,
             standalone: bool = False, num_chunks: int | None = None, rank: int | None = None,
             own_grads: bool = False, region_io: bool = False) -> dict:
    """Binding moment per phase, maximised over the ranks of the plan on ``profile`` (``rank``: of
    that expert-group rank alone, the one ``planner validate`` runs; ``own_grads``, ``region_io``:
    ``inventory_flags``);
    ``num_chunks`` is PipelinedLLEP's ``K`` (``Ctx.num_chunks``; ``None``: from ``N``, ``c``,
    ``K_max``, as the operator computes it)."""
    counts = routing.profile_counts(profile, N, E, k, E_p)
    operator, residue = plan_operator(op)
    plan = plans_dispatch.plan_layer(counts, top_k=k, operator=operator, token_budget=c,
                                     max_chunks=K_max, alpha=alpha, min_tokens=m, lam=lam,
                                     max_imports=n_imp, residue=residue, num_chunks=num_chunks)
    shape = inv.Shape(N, H, I, E, k, b)
    out: dict = {}
    for d in (plan.rank_classes() if rank is None else [rank]):
        ph = phase_moments(moments(op, shape, rank_sizes(plan, d), E // E_p, standalone=standalone,
                                   own_grads=own_grads, region_io=region_io), regime, region_io)
        for kind, ms in ph.items():
            pk, mo = peak(ms)
            if kind not in out or pk > out[kind][0]:
                out[kind] = (pk, mo, d)
    return out


# ---- guarantee: bounds substituted ---------------------------------------------------------------
def guarantee_sizes(ctx_like: dict, residue: str = plans_dispatch.DESTINATION) -> dict:
    """Bounded sizes (numpy-friendly) of PipelinedLLEP / LLEP for ``guarantee_moments``: a chunk
    and, when ``K >= 2``, the next ones (prefetch; a middle chunk), all at the per-chunk bounds.
    ``K`` and ``c_eff`` are ``ctx_like["K"]`` / ``["c_eff"]`` (``terms`` passes the context's);
    a caller without a context (one operator shape) leaves them out and gets ``chunk_symbols``.

    Rows received per chunk: ``Q_i ≤ min(E_p·k·c_eff, ceil(L/K) + E_p·(n + n_import_max))``
    (``plans.dispatch.chunk_recv_bound``: strided chunks put at most ``ceil(ℓ/K)`` of each
    source×slot segment in one chunk), with ``L`` the rank's layer load bound: the residue bound
    (``U`` included) for the destination variant, ``L_0`` (no ``U``: the source variant raises its
    chunk count instead, ``plans.dispatch.source_chunks``) for the source variant."""
    g = ctx_like
    N, k, E, E_p, m = g["N"], g["k"], g["E"], g["E_p"], g["m"]
    K, c_eff = (g["K"], g["c_eff"]) if "K" in g else chunk_symbols(N, g["c"], g["K_max"])
    resid = llep.residue_bound_routes(k, N, E, E_p, g["alpha"], g["lam"], m, g["n_imp"])
    n = E // np.asarray(E_p)
    load = (plans_dispatch.balanced_load_bound(k, N, E, E_p, g["alpha"], g["lam"], m)
            if residue == plans_dispatch.SOURCE else resid)
    q = np.minimum(E_p * k * c_eff,
                   plans_dispatch.chunk_recv_bound(load, K, E_p, n + np.asarray(g["n_imp"])))
    r = np.minimum(q, chunking.expert_block_rows(k, c_eff, E_p, E, m))
    x_e = np.minimum(n * (np.asarray(E_p) - 1), (np.asarray(E_p) - 1) * g["n_imp"])
    more = np.asarray(K) >= 2
    if residue == plans_dispatch.SOURCE:          # K' >= 2 chunks where a rank can exceed L_0
        more = more | (np.asarray(resid) > np.asarray(load))
    # three representative chunks: the first, a middle one (the input gradient of the later
    # chunks accumulated beside its own scatter) and the last (zeros where K is smaller)
    many = more & (np.asarray(K) >= 3) if residue != plans_dispatch.SOURCE else more
    return dict(N=N, C=[k * c_eff, k * c_eff * more, k * c_eff * many], Q=[q, q * more, q * many],
                r=[r, r * more, r * many], resid=[resid] * 3, tok=[k * np.asarray(N)] * 3,
                X=g["n_imp"], X_e=x_e)


def guarantee_moments(op: str, shape: inv.Shape, g: dict, *, standalone: bool, own_grads: bool = False,
                      region_io: bool = False) -> dict:
    """Inventory timelines at the bounds (representative chunks; arrays broadcast)."""
    sz = guarantee_sizes(g, plan_operator(op)[1])
    s = inv.Shape(g["N"], shape.H, shape.I, shape.E, shape.k, shape.b)
    if op == SOURCE_OP:
        return inv.pipelined_source(s, sz["C"], sz["Q"], sz["r"], sz["X"], sz["X_e"],
                                    standalone=standalone)
    if op == "pipelined_llep":
        return inv.pipelined(s, sz["C"], sz["Q"], sz["r"], sz["resid"], sz["X"], sz["X_e"],
                             standalone=standalone, tokc=sz["tok"], region_io=region_io)
    return inv.unchunked(s, sz["resid"][0], sz["resid"][0], sz["X"], sz["X_e"],
                         shape.E // np.asarray(g["E_p"]), standalone=standalone, own_grads=own_grads,
                         region_io=region_io)


def vector_peak(moment_list: list[dict]) -> tuple[np.ndarray, dict]:
    """Per candidate: bytes of the largest moment, and its components (numpy arrays)."""
    keys = sorted({key for m in moment_list for key in m})
    tot = np.stack(np.broadcast_arrays(*[np.asarray(inv.total_bytes(m)) for m in moment_list]))
    arg = tot.argmax(0)
    comps = {}
    for key in keys:
        vals = np.stack(np.broadcast_arrays(*[np.asarray(m.get(key, 0), dtype=np.int64)
                                              for m in moment_list], tot[0]))[:-1]
        comps[key] = np.take_along_axis(vals, arg[None], 0)[0]
    return tot.max(0), comps


def unique_rows(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of equal-length columns and each row's index among them (like
    ``np.unique(axis=0, return_inverse=True)``, by mixed-radix codes of per-column uniques: the
    search passes ~10^5 rows of a few distinct values)."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        _, inv_c = np.unique(c, return_inverse=True)
        code = code * (int(inv_c.max()) + 1 if inv_c.size else 1) + inv_c.reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return np.stack([c[first] for c in cols], 1), inverse.reshape(-1)


# ---- terms(ctx) ---------------------------------------------------------------------------------
OPERATOR_NAMES = {"ep": "standard EP", "llep": "LLEP", "pipelined_llep": "PipelinedLLEP",
                  SOURCE_OP: "PipelinedLLEP (source-side)"}
KNOBS = ("tokens_per_rank", "expert_parallel", "token_budget", "max_chunks", "llep_alpha",
         "llep_min_tokens", "llep_lambda", "max_imports", "num_chunks", "chunk_tokens")
"""The ``Ctx`` fields the dispatch terms read per candidate (``K``, ``c_eff`` as derived once, in
``planner.context.derive``)."""


LEFT_OUT = ("left out: every dispatch buffer at zero, a lower bound of the peak that needs no plan "
            "(planner.budget.frontier's pre-scan)")
"""How the terms are sized under ``Ctx.dispatch_left_out``."""


def regime(ctx: Ctx) -> str:
    """``checkpointed`` when the MoE region runs inside a non-reentrant checkpoint, else ``saved``."""
    if ctx.stack == "fsdp2":
        # op-level SAC keeps none of the grouped MLP's rows (GPU allocator history, FSDP2 Qwen3 W8
        # selective forward[1]: the peak is the grouped MLP's allocation, as under full AC)
        return "saved" if ctx.ac == "none" else "checkpointed"
    return "saved" if ctx.checkpoint == "none" else "checkpointed"


def profile_of(ctx: Ctx) -> str:
    """The routing profile the plan is evaluated on (``worst`` → every token to one rank)."""
    return routing.profile_name(ctx.routing, ctx.routing_hot_share, ctx.routing_hot_experts)


def _knob_arrays(ctx: Ctx, op: str):
    vals = {name: getattr(ctx, name) for name in KNOBS}
    if ctx.stack == "fsdp2":
        vals["expert_parallel"] = ctx.ep
        # the baseline's MoE block keeps its sequence shard under tp (planner/runtime/fsdp2_layout.py)
        vals["tokens_per_rank"] = -(-np.asarray(ctx.tokens_per_rank) // np.asarray(ctx.tp))
        # its standard EP is unchunked: one chunk of all its tokens
        vals["num_chunks"], vals["chunk_tokens"] = 1, vals["tokens_per_rank"]
    arrs = np.broadcast_arrays(*[np.asarray(vals[n], dtype=np.float64) for n in KNOBS])
    return arrs[0].shape, {n: a for n, a in zip(KNOBS, arrs)}


def _expected_components(ctx: Ctx, op: str, reg: str) -> dict:
    shape, arrs = _knob_arrays(ctx, op)
    uniq, inv_idx = unique_rows([arrs[n].reshape(-1) for n in KNOBS])
    col = {n: np.asarray([row[i] for row in uniq]) for i, n in enumerate(KNOBS)}
    K = col["num_chunks"] if op == "pipelined_llep" else 1
    check_expected_work(col["expert_parallel"], K, ctx.num_experts, col["max_imports"],
                        op if ctx.stack == "composed" else "fsdp2_ep", profile_of(ctx))
    prof = profile_of(ctx)
    per_phase: dict = {}
    for u, row in enumerate(uniq):
        kw = dict(zip(KNOBS, row))
        res = expected(op, prof, int(kw["tokens_per_rank"]), ctx.hidden_size, ctx.expert_ffn,
                       ctx.num_experts, ctx.top_k, ctx.act_bytes, int(kw["expert_parallel"]),
                       int(kw["token_budget"]), int(kw["max_chunks"]), float(kw["llep_alpha"]),
                       int(kw["llep_min_tokens"]), float(kw["llep_lambda"]), int(kw["max_imports"]),
                       reg, num_chunks=int(kw["num_chunks"]) if op in ("pipelined_llep", SOURCE_OP) else None,
                       rank=ctx.dispatch_rank, **inventory_flags(ctx))
        for kind, (_, mom, _) in res.items():
            comp = per_phase.setdefault(kind, {})
            for key, c in mom.items():
                comp.setdefault(key, np.zeros(len(uniq), np.int64))[u] = int(c)
    out = {}
    for kind, comp in per_phase.items():
        out[kind] = {key: (v[inv_idx.reshape(-1)].reshape(shape) if shape else int(v[0]))
                     for key, v in comp.items()}
    return out


def worst_ep_moments(shape: inv.Shape, E_p, *, standalone: bool, own_grads: bool = False,
                     region_io: bool = False) -> dict:
    """Standard EP under ``worst``: ``Q = E_p·N·min(k, E/E_p)`` rows to one rank, at most
    ``E_p·N`` of them to one expert (tokens pick distinct experts; DESIGN §3.2)."""
    N, E_p = np.asarray(shape.N), np.asarray(E_p)
    q = E_p * N * np.minimum(shape.k, shape.E // E_p)
    return inv.unchunked(shape, q, np.minimum(q, E_p * N), 0, 0, shape.E // E_p,
                         standalone=standalone, own_grads=own_grads, region_io=region_io)


def _worst_ep(ctx: Ctx, reg: str) -> dict:
    N = np.asarray(ctx.tokens_per_rank)
    s = inv.Shape(-(-N // np.asarray(ctx.tp)) if ctx.stack == "fsdp2" else N, ctx.hidden_size, ctx.expert_ffn, ctx.num_experts,
                  ctx.top_k, ctx.act_bytes)
    mom = worst_ep_moments(s, ctx.ep if ctx.stack == "fsdp2" else ctx.expert_parallel,
                           standalone=False, **inventory_flags(ctx))
    return {kind: vector_peak(ms)[1]
            for kind, ms in phase_moments(mom, reg, books_region_io(ctx)).items()}


def _guarantee_components(ctx: Ctx, op: str, reg: str) -> dict:
    shape, arrs = _knob_arrays(ctx, op)
    # The bound depends on the knobs alone: evaluate each distinct knob row once (the search
    # repeats them across thousands of candidates), then spread back.
    uniq, inv_idx = unique_rows([arrs[n].reshape(-1) for n in KNOBS])
    u = {n: uniq[:, i] for i, n in enumerate(KNOBS)}
    g = dict(N=u["tokens_per_rank"].astype(np.int64), k=ctx.top_k, E=ctx.num_experts,
             E_p=u["expert_parallel"].astype(np.int64), c=u["token_budget"].astype(np.int64),
             K_max=u["max_chunks"].astype(np.int64), alpha=u["llep_alpha"],
             lam=u["llep_lambda"], m=u["llep_min_tokens"].astype(np.int64),
             n_imp=u["max_imports"].astype(np.int64), K=u["num_chunks"].astype(np.int64),
             c_eff=u["chunk_tokens"].astype(np.int64))
    s = inv.Shape(g["N"], ctx.hidden_size, ctx.expert_ffn, ctx.num_experts, ctx.top_k, ctx.act_bytes)
    mom = guarantee_moments(op, s, g, standalone=False, **inventory_flags(ctx))
    out = {}
    for kind, ms in phase_moments(mom, reg, books_region_io(ctx)).items():
        comps = vector_peak(ms)[1]
        out[kind] = {key: np.broadcast_to(v, (len(uniq),))[inv_idx.reshape(-1)].reshape(shape)
                     for key, v in comps.items()}
    return out


def terms(ctx: Ctx) -> list[Term]:
    """Dispatch terms of one rank (resident in forward/backward of ``moe`` regions)."""
    if not ctx.model.is_moe or "moe" not in set(ctx.regions):
        return []
    op, reg, comps, how = components(ctx)
    out = []
    for kind in ("forward", "backward"):
        for (buf, eb), count in sorted(comps.get(kind, {}).items()):
            if not np.any(np.asarray(count)):
                continue
            out.append(Term(f"{OPERATOR_NAMES[op]}: {buf.name}", "dispatch", count, eb,
                            buf.formula, (kind,), regions=("moe",),
                            source=f"{SOURCE}; {how}; {reg} region"))
    return out


def components(ctx: Ctx) -> tuple[str, str, dict, str]:
    """``(operator, regime, {phase kind: {(buffer, elem_bytes): count}}, how the plan is sized)``
    of the binding moments: ``forward`` and ``backward`` (the region's own phases) and, in the
    ``saved`` regime, ``saved`` (what the operator keeps of its region for the backward:
    ``dispatch_inventory``'s ``saved_end``)."""
    op = "ep" if ctx.stack == "fsdp2" else ctx.dispatch
    if op == "pipelined_llep" and getattr(ctx, "dispatch_residue", "source") == plans_dispatch.SOURCE:
        op = SOURCE_OP
    reg = regime(ctx)
    bound = ctx.dispatch_bound
    if ctx.dispatch_left_out:
        comps, how = {}, LEFT_OUT
    elif op == "ep" and ctx.routing == "worst":
        comps, how = _worst_ep(ctx, reg), "worst: E_p·N·min(k, E/E_p) rows to one rank"
    elif bound == "guarantee" and op == SOURCE_OP:
        comps, how = _guarantee_components(ctx, op, reg), (
            "guarantee (source residue, routing-independent): Q_i ≤ min(E_p·k·c_eff, ceil(L_0/K) + "
            "E_p·(E/E_p + n_import_max)) with L_0 = ceil(max(α,λ)·k·N_max) + (E/E_p)(m−1) (more chunks "
            "where LLEP leaves unplaced excess), C_i ≤ k·c_eff, no residue across chunks, k·N route "
            "indices on the source, X ≤ n_import_max")
    elif bound == "guarantee" and op != "ep":
        comps, how = _guarantee_components(ctx, op, reg), (
            "guarantee: Q_i ≤ min(E_p·k·c_eff, ceil(ΣQ/K) + E_p·(E/E_p + n_import_max)), C_i ≤ k·c_eff, "
            "Σ Q ≤ min(E_p·k·N_max, max(ceil(max(α,λ)·k·N_max) + (E/E_p)(m−1), U)) with U the rows of a "
            "rank left with unplaced excess when its import slots run out (planner.plans.llep), "
            "X ≤ n_import_max")
    else:
        comps, how = _expected_components(ctx, op, reg), (
            f"expected: the {OPERATOR_NAMES[op]} plan on routing {profile_of(ctx)}, "
            + ("binding rank" if ctx.dispatch_rank is None else f"expert-group rank {ctx.dispatch_rank}"))
    if books_region_io(ctx):
        how += ("; the region output and the dispatcher's input gradient made at the operator's end, "
                "counted here" + ("" if reg != "saved" or op not in UNCHUNKED else
                                  ", and the region's residual sum beside them and every saved buffer"))
    if books_own_grads(ctx):
        how += "; the region's own expert gradients (freed lifetime) counted here from the grouped MLP's backward"
    return op, reg, comps, how
