"""Least-loaded expert assignment (LLEP) as an integer plan (DESIGN §7; LLEP, arXiv 2601.17111).

Legend:
    E, E_p, n   routed experts, expert-parallel degree, experts per rank ``n = E/E_p``
    load_E      routes to each expert, summed over every source rank (``T = Σ load_E``)
    α, m, λ     capacity factor, minimum routes per spilled GEMM, imbalance threshold
    cap         ``ceil(α·T/E_p)``: routes a rank computes before its experts spill
    n_imp       ``n_import_max``: most foreign experts one rank may import per layer

Rules (all integer, deterministic, the same on every rank):

1. LLEP is skipped (every expert stays with its owner) when the most loaded rank is below
   ``λ × mean``, i.e. ``max·E_p < λ·T``. A rank then computes fewer than ``λ·T/E_p`` routes.
2. Otherwise every owner keeps its experts, smallest first, up to ``cap``; what is left of an
   expert is its excess.
3. Excesses of at least ``m`` routes spill, largest first, to the least-loaded other rank (ties to
   the lowest rank) that is below ``cap`` and has a free import slot (or already imports the
   expert). A piece is ``min(excess, room)``; when the room is below ``m`` the piece is ``m``, so
   no spilled GEMM is smaller than ``m`` and a target ends below ``cap + m``. What is left below
   ``m`` stays with the owner (at most ``m-1`` per expert).

With ``α >= 1`` some rank is always below ``cap`` while routes remain, so the only way an excess of
``m`` or more stays with its owner is that every rank below ``cap`` has used its ``n_imp`` import
slots. ``unplaced`` counts such routes; when it is 0 every rank computes at most
``max(cap + n·(m-1), λ·T/E_p) <= max(α, λ)·k·N_max + n·(m-1)`` routes (the residue bound of
DESIGN §3.2). ``unplaced`` is 0 whenever ``n_imp`` is at least the number of experts that spill.

**Unplaced routes** (``residue_bound_routes`` with ``max_imports``). Take an owner ``r`` left with
an excess, the first such expert ``e_1`` of ``r`` (initial excess ``x_1``), and ``B`` the other ranks
below ``cap`` at that moment, ``β = |B|``. A rank of ``B`` only ever received *final* pieces (any
other piece lifts its target to ``cap``), one per expert, and all its ``n_imp`` slots are used; its
experts spilled before ``e_1``, so each had an excess ``>= x_1 >= m``. Excesses sum to at most
``T - cap <= T·(1 - 1/E_p)`` (``α >= 1``), hence

- ``β·n_imp + 1 <= X = min(E - n, floor(T·(1 - 1/E_p)/m))`` (experts that can spill), so
  ``β <= b = min(E_p - 1, floor((X - 1)/n_imp))`` (``E_p - 1`` when ``n_imp = 0``);
- ``x_1 <= T·(1 - 1/E_p)/(β·n_imp + 1)``, and ``r``'s stuck experts (at most ``n``, each at most
  ``x_1``) give ``load_r <= f_2(β) = cap + n·(m-1) + n·T·(1 - 1/E_p)/(β·n_imp + 1)``;
- every rank outside ``B ∪ {r}`` holds at least ``cap >= T/E_p`` (and ``B`` only shrinks), so
  ``load_r <= f_1(β) = T·(1 + β)/E_p``.

``U = max over 0 <= β <= b of min(f_1, f_2)`` at ``T = E_p·k·N_max`` and ``cap <= α·k·N_max + 1``
(both sides are nondecreasing in ``T``; only ``f_2`` depends on ``α``, increasingly, so the bound is
monotone in ``α``). ``f_1`` rises and ``f_2`` falls with ``β``: the maximum sits at their crossing,
found by bisection. ``E_p·k·N_max`` (all routes) caps the whole bound, ``α = inf`` included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.errors import InvalidPlan
from planner.schema.knobs import default as knob_default


@dataclass(frozen=True)
class Assignment:
    """Which ranks compute which routes of every expert."""

    num_ranks: int
    """``E_p``."""
    active: bool
    """Whether LLEP moved anything (False: standard EP, or skipped below ``λ``)."""
    cap: int
    """Per-rank capacity in routes (0 when LLEP did not run)."""
    holders: tuple[tuple[tuple[int, int], ...], ...]
    """Per expert, ``((rank, routes), …)``: the owner first (when it keeps any), then importers
    in the order they were filled. The routes of each expert sum to its load."""
    imports: tuple[tuple[int, ...], ...]
    """Per rank, the foreign experts it imports, in import-slot order."""
    load: np.ndarray
    """``[E_p]`` routes each rank computes."""
    unplaced: int
    """Routes of excesses ``>= m`` left on their owners because no import slot was free."""

    @property
    def num_experts(self) -> int:
        return len(self.holders)

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.num_ranks

    def owner(self, expert: int) -> int:
        return expert // self.experts_per_rank

    @property
    def exports(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per owner rank, ``((expert, importer rank), …)``: the weights it sends each layer."""
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.num_ranks)]
        per = self.experts_per_rank
        for e, hs in enumerate(self.holders):
            own = e // per
            if len(hs) > 1 or hs and hs[0][0] != own:
                out[own].extend((e, r) for r, _ in hs if r != own)
        return tuple(tuple(x) for x in out)


@dataclass(frozen=True)
class LlepKnobs:
    """The LLEP assignment's knobs (DESIGN §1), defaults from the registry; hashable, so it keys
    the timing memo."""

    alpha: float = knob_default("llep_alpha")
    """``α``: capacity factor."""
    min_tokens: int = knob_default("llep_min_tokens")
    """``m``: minimum tokens per spilled GEMM."""
    lam: float = knob_default("llep_lambda")
    """``λ``: imbalance below which LLEP is skipped."""
    max_imports: int = knob_default("max_imports")
    """``n_import_max``: most foreign experts one rank imports per layer."""


def check_knobs(num_experts: int, num_ranks: int, alpha: float, min_tokens: int, lam: float,
                max_imports: int) -> None:
    """Raise ``InvalidPlan`` for knobs the assignment cannot honour."""
    if num_ranks < 1 or num_experts % num_ranks:
        raise InvalidPlan("plan.composed.expert_parallel", num_ranks,
                          f"must divide model.num_experts ({num_experts})", "choose a divisor of E")
    if alpha < 1:
        raise InvalidPlan("plan.composed.llep_alpha", alpha, "must be >= 1 (the ranks' capacity "
                          "must hold every route)", "use --llep-alpha 1.0")
    if min_tokens < 1:
        raise InvalidPlan("plan.composed.llep_min_tokens", min_tokens, "must be >= 1", "use 1024")
    if lam < 1:
        raise InvalidPlan("plan.composed.llep_lambda", lam, "must be >= 1", "use 1.3")
    if max_imports < 0:
        raise InvalidPlan("plan.composed.max_imports", max_imports, "must be >= 0", "use 4")


def import_bound(num_experts: int, num_ranks: int) -> int:
    """Most foreign experts one rank can import in a layer: ``E − E/E_p`` (those it does not own)."""
    return num_experts - num_experts // num_ranks


def resolve_max_imports(max_imports: int, num_experts: int, num_ranks: int, default: int, *,
                        field: str = "plan.composed.max_imports", flag: str = "--max-imports") -> int:
    """``n_import_max`` for a plan: at most ``E − E/E_p`` (``import_bound``). The schema's default is
    lowered to the bound on a model with few experts per group; a larger value given by the user is
    refused (it would only inflate the dispatch guarantee). ``E_p = 1`` imports nothing and is left
    as it is. ``field`` and ``flag`` name the value in the error (the operators pass their argument).

    Raises:
        InvalidPlan: ``max_imports`` above ``E − E/E_p``, and not the default.
    """
    if num_ranks <= 1 or num_experts == 0:
        return max_imports
    bound = import_bound(num_experts, num_ranks)
    if max_imports <= bound:
        return max_imports
    if max_imports == default:
        return bound
    raise InvalidPlan(field, max_imports,
                      f"must be <= E − E/E_p = {bound} (the experts a rank does not own: "
                      f"{num_experts} − {num_experts}/{num_ranks})", f"give {flag} {bound} or less")


def standard_assignment(load_E, num_ranks: int) -> Assignment:
    """Every expert computed by its owner (standard EP)."""
    load = np.asarray(load_E, dtype=np.int64)
    n = len(load) // num_ranks
    holders = tuple(((e // n, int(c)),) if c else () for e, c in enumerate(load.tolist()))
    return Assignment(num_ranks, False, 0, holders, tuple(() for _ in range(num_ranks)),
                      load.reshape(num_ranks, n).sum(1), 0)


def assign(load_E, num_ranks: int, *, alpha: float = knob_default("llep_alpha"),
           min_tokens: int = knob_default("llep_min_tokens"), lam: float = knob_default("llep_lambda"),
           max_imports: int = knob_default("max_imports")) -> Assignment:
    """The least-loaded assignment of the module docstring.

    Args:
        load_E: routes per expert over every source (length ``E``).
        num_ranks: ``E_p``.
    Raises:
        InvalidPlan: see ``check_knobs``.
    """
    load = np.asarray(load_E, dtype=np.int64)
    num_experts = len(load)
    check_knobs(num_experts, num_ranks, alpha, min_tokens, lam, max_imports)
    n = num_experts // num_ranks
    native = load.reshape(num_ranks, n).sum(1)
    total = int(load.sum())
    if num_ranks == 1 or total == 0 or int(native.max()) * num_ranks < lam * total:
        return standard_assignment(load, num_ranks)
    # A cap at or above T changes nothing (every owner keeps all); capping it there keeps α = inf
    # (no cap) an integer plan.
    cap = total if alpha * total >= total * num_ranks else int(math.ceil(alpha * total / num_ranks))
    a = np.zeros(num_ranks, dtype=np.int64)
    hold: list[dict[int, int]] = [dict() for _ in range(num_experts)]
    excess = np.zeros(num_experts, dtype=np.int64)
    for r in range(num_ranks):                       # 2. owners keep, smallest first, up to cap
        mine = list(range(r * n, (r + 1) * n))
        for e in sorted(mine, key=lambda e: (int(load[e]), e)):
            keep = min(int(load[e]), max(cap - int(a[r]), 0))
            if keep:
                hold[e][r] = keep
                a[r] += keep
            excess[e] = load[e] - keep
    imports: list[list[int]] = [[] for _ in range(num_ranks)]
    unplaced = 0
    order = sorted((e for e in range(num_experts) if excess[e] > 0),
                   key=lambda e: (-int(excess[e]), e))
    for e in order:                                  # 3. spill, largest first
        owner, left = e // n, int(excess[e])
        while left >= min_tokens:
            cands = [t for t in range(num_ranks) if t != owner and a[t] < cap
                     and (len(imports[t]) < max_imports or e in imports[t])]
            if not cands:
                break
            t = min(cands, key=lambda t: (int(a[t]), t))
            room = cap - int(a[t])
            piece = left if left <= room else (room if room >= min_tokens else min_tokens)
            if e not in imports[t]:
                imports[t].append(e)
            hold[e][t] = hold[e].get(t, 0) + piece
            a[t] += piece
            left -= piece
        if left:
            hold[e][owner] = hold[e].get(owner, 0) + left
            a[owner] += left
            if left >= min_tokens:
                unplaced += left
    holders = []
    for e in range(num_experts):
        owner = e // n
        items = [(owner, hold[e][owner])] if owner in hold[e] else []
        items += [(r, c) for r, c in hold[e].items() if r != owner]   # insertion = fill order
        holders.append(tuple(items))
    assert int(a.sum()) == total
    return Assignment(num_ranks, True, cap, tuple(holders), tuple(tuple(x) for x in imports),
                      a, unplaced)


def residue_bound_routes(top_k, n_max, num_experts, num_ranks, alpha, lam, min_tokens, max_imports=None):
    """Most routes one rank computes in a layer under the LLEP plan, for every routing (module
    docstring). Works on numpy arrays; ``alpha``/``lam`` may be ``inf``.

    ``min(E_p·k·N_max, max(ceil(max(α,λ)·k·N_max) + (E/E_p)·(m-1), U))``: ``E_p·k·N_max`` bounds
    the routes of the whole expert-parallel group, ``U`` the owner of unplaced routes (module
    docstring; ``U = 0`` when no expert can spill). ``max_imports = None`` gives the bound for plans
    that place every excess (``Assignment.unplaced == 0``) only.
    """
    k, N = np.asarray(top_k, dtype=np.int64), np.asarray(n_max, dtype=np.int64)
    E, Ep = np.asarray(num_experts, dtype=np.int64), np.asarray(num_ranks, dtype=np.int64)
    m = np.asarray(min_tokens, dtype=np.int64)
    n = E // Ep
    total = Ep * k * N                                    # every route of the group: T <= E_p·k·N_max
    top = np.minimum(np.maximum(alpha, lam) * (k * N).astype(np.float64), total.astype(np.float64))
    bound = np.ceil(top).astype(np.int64) + n * (m - 1)
    if max_imports is not None:
        bound = np.maximum(bound, unplaced_bound_routes(total, n, E, Ep, alpha, m, max_imports))
    out = np.minimum(bound, total)
    return int(out) if out.ndim == 0 else out


_BISECT_STEPS = 22
"""Bisection steps over ``β <= E_p - 1 < 2^20`` (schema bound on degrees), plus one spare."""


def unplaced_bound_routes(total, n, E, Ep, alpha, m, max_imports):
    """``U`` of the module docstring: most routes an owner left with unplaced excess computes
    (``total`` = ``E_p·k·N_max``, ``n`` = ``E/E_p``, ``α >= 1``). Works on numpy arrays; 0 where no
    expert can spill (``E_p = 1`` or ``T·(1 - 1/E_p) < m``)."""
    T = np.asarray(total, dtype=np.float64)
    Ep_f = np.asarray(Ep, dtype=np.float64)
    n_imp = np.asarray(max_imports, dtype=np.int64)
    spare = T * (1.0 - 1.0 / Ep_f)                                   # >= T - cap, as cap >= T/E_p
    X = np.minimum(np.asarray(E) - np.asarray(n), np.floor(spare / np.asarray(m)).astype(np.int64))
    b = np.where(n_imp >= 1, np.minimum(np.asarray(Ep) - 1, (X - 1) // np.maximum(n_imp, 1)),
                 np.asarray(Ep) - 1)
    b = np.maximum(b, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        cap_hi = np.minimum(np.asarray(alpha, dtype=np.float64) * T / Ep_f, T) + 1.0   # α = inf: T
    n_f, m_f, imp_f = (np.asarray(v, dtype=np.float64) for v in (n, m, n_imp))

    def f1(beta):
        return T * (1.0 + beta) / Ep_f

    def f2(beta):
        return cap_hi + n_f * (m_f - 1.0) + n_f * spare / (beta * imp_f + 1.0)

    lo, hi = np.zeros_like(b), b.copy()                  # largest β <= b with f1(β) <= f2(β)
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi + 1) // 2
        ok = f1(mid) <= f2(mid)
        step = lo < hi
        lo = np.where(step & ok, mid, lo)
        hi = np.where(step & ~ok, mid - 1, hi)
    nxt = np.minimum(lo + 1, b)
    best = np.maximum(np.minimum(f1(lo), f2(lo)), np.minimum(f1(nxt), f2(nxt)))
    U = np.ceil(best * (1.0 + 1e-12)).astype(np.int64) + 1          # float rounding guard
    return np.where(X >= 1, np.minimum(U, np.asarray(total)), 0)
