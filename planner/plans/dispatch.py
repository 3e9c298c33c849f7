"""The per-layer dispatch plan that standard EP, LLEP and PipelinedLLEP execute (DESIGN §7).

Computed once per layer per step from the all-gathered route counts (small integers), reused in
the recompute, and shared with the planner's ``expected`` dispatch terms.

Legend:
    W = E_p        ranks of the expert-parallel group; ``s`` a source, ``d`` a destination
    S              expert slots per rank: its ``n = E/E_p`` own experts, then its imports
    K              chunks (1 for standard EP and LLEP)
    counts_WE      routes from source ``s`` to expert ``e``
    seg_WWS        routes from source ``s`` to slot ``(d, slot)``
    chunk_KWWS     the same, per chunk ``i``

A source orders its routes by destination, then by slot (its *send order*); chunk ``i`` takes
positions of that order by ``planner.plans.chunking``. Inside a source's routes to expert ``e``
(in token order), the first ones go to the first holder of ``e`` (the owner), the next to the
next holder, following the global order ``(source rank, token)`` that cuts each expert's routes
into its holders' shares. A destination receives, per chunk, one block per source, each ordered
by slot.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from planner.plans import chunking
from planner.plans import llep as llep_plan
from planner.plans.llep import Assignment, assign, standard_assignment
from planner.units import ceil_div
from planner.schema.knobs import default as knob_default


@dataclass(frozen=True)
class DispatchPlan:
    """Split sizes, chunk membership and transfers of one layer (see module legend)."""

    assignment: Assignment
    counts_WE: np.ndarray
    top_k: int
    num_chunks: int
    membership: str
    slot_experts_WS: np.ndarray
    """Expert id held in each slot of each rank (-1: unused)."""
    seg_WWS: np.ndarray
    chunk_KWWS: np.ndarray
    send_start_WWS: np.ndarray
    """Start of each ``(s, d, slot)`` segment in source ``s``'s send order."""
    block_rows: int | None = None
    """Rows per expert GEMM block (PipelinedLLEP; ``None``: a slot runs whole)."""
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- sizes ---------------------------------------------------------------------------------
    @property
    def num_ranks(self) -> int:
        return self.counts_WE.shape[0]

    @property
    def num_slots(self) -> int:
        return self.slot_experts_WS.shape[1]

    @property
    def tokens_W(self) -> np.ndarray:
        """Tokens of each rank (routes / k)."""
        return self.counts_WE.sum(1) // max(self.top_k, 1)

    @property
    def send_KWW(self) -> np.ndarray:
        """``[i, s, d]`` routes source ``s`` sends to ``d`` in chunk ``i``."""
        return self.chunk_KWWS.sum(-1)

    def recv_total_W(self) -> np.ndarray:
        """Routes each rank computes in the layer (what it receives over every chunk)."""
        return self.seg_WWS.sum((0, 2))

    def num_imports_W(self) -> np.ndarray:
        if "imports_W" not in self._cache:
            self._cache["imports_W"] = np.array([len(x) for x in self.assignment.imports], dtype=np.int64)
        return self._cache["imports_W"]

    def num_exports_W(self) -> np.ndarray:
        if "exports_W" not in self._cache:
            self._cache["exports_W"] = np.array([len(x) for x in self.assignment.exports], dtype=np.int64)
        return self._cache["exports_W"]

    # ---- one source: the pieces that build its send order ---------------------------------------
    def source_pieces(self, s: int) -> np.ndarray:
        """``[P, 3]`` rows ``(start in expert-sorted order, start in send order, length)``.

        The expert-sorted order is a stable sort of the source's flat routes (token-major, then
        pick) by expert id; each piece is the part of one expert's routes sent to one holder.
        """
        key = ("pieces", s)
        if key in self._cache:
            return self._cache[key]
        a = self.assignment
        counts = self.counts_WE
        e_off = np.concatenate([[0], np.cumsum(counts[s])[:-1]])
        rows = []
        for e, hs in enumerate(a.holders):
            src_lo = int(counts[:s, e].sum())
            src_hi = src_lo + int(counts[s, e])
            lo = 0
            done = 0
            for r, c in hs:
                ov = max(0, min(src_hi, lo + c) - max(src_lo, lo))
                if ov:
                    slot = int(np.nonzero(self.slot_experts_WS[r] == e)[0][0])
                    rows.append((int(e_off[e]) + done, int(self.send_start_WWS[s, r, slot]), ov))
                    done += ov
                lo += c
        out = np.array(rows, dtype=np.int64).reshape(-1, 3)
        self._cache[key] = out
        return out

    # ---- one destination: the layout of a received chunk --------------------------------------
    def recv_layout(self, d: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows_WS, offsets_WS)``: rows from source ``s`` for slot ``slot`` in chunk ``chunk``
        and where they start in the received buffer (source-major, then slot)."""
        rows = self.chunk_KWWS[chunk, :, d, :]
        offs = np.concatenate([[0], np.cumsum(rows.reshape(-1))[:-1]]).reshape(rows.shape)
        return rows, offs

    # ---- classes of ranks with the same memory -------------------------------------------------
    def signature(self, r: int) -> str:
        """Hash of everything that sizes rank ``r``'s buffers (for tracing one rank per class)."""
        h = hashlib.sha1()
        for arr in (self.tokens_W[r:r + 1], self.chunk_KWWS[:, r], self.chunk_KWWS[:, :, r],
                    self.num_imports_W()[r:r + 1], self.num_exports_W()[r:r + 1]):
            h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
        return h.hexdigest()

    def rank_classes(self) -> list[int]:
        """One representative rank per signature."""
        seen: dict[str, int] = {}
        for r in range(self.num_ranks):
            seen.setdefault(self.signature(r), r)
        return sorted(seen.values())

    def max_send_ratio(self) -> float:
        """Max over chunks of ``max_{s,d} send / mean_{s,d} send`` (1.0 = perfectly even)."""
        send = self.send_KWW.astype(np.float64)
        mean = send.mean(axis=(1, 2))
        ok = mean > 0
        if not ok.any():
            return 1.0
        return float((send.max(axis=(1, 2))[ok] / mean[ok]).max())


def build(counts_WE, assignment: Assignment, *, top_k: int, num_chunks: int = 1,
          membership: str = chunking.STRIDED, block_rows: int | None = None) -> DispatchPlan:
    """Lay out ``assignment`` for the sources' ``counts_WE`` and cut it into ``num_chunks``."""
    counts = np.asarray(counts_WE, dtype=np.int64)
    W, E = counts.shape
    n = E // W
    n_slots = n + max((len(x) for x in assignment.imports), default=0)
    slots = np.full((W, n_slots), -1, dtype=np.int64)
    for r in range(W):
        slots[r, :n] = np.arange(r * n, (r + 1) * n)
        slots[r, n:n + len(assignment.imports[r])] = assignment.imports[r]
    slot_of = {}                                         # (rank, expert) -> slot
    for r in range(W):
        for sl, e in enumerate(slots[r].tolist()):
            if e >= 0:
                slot_of[(r, e)] = sl
    seg = np.zeros((W, W, n_slots), dtype=np.int64)
    src_cum = np.concatenate([np.zeros((1, E), np.int64), np.cumsum(counts, 0)])  # [W+1, E]
    for e, hs in enumerate(assignment.holders):
        lo = 0
        for r, c in hs:
            ov = np.maximum(np.minimum(src_cum[1:, e], lo + c) - np.maximum(src_cum[:-1, e], lo), 0)
            seg[:, r, slot_of[(r, e)]] += ov
            lo += c
    flat = seg.reshape(W, -1)
    start = (np.cumsum(flat, 1) - flat).reshape(seg.shape)
    chunk = np.zeros((num_chunks, W, W, n_slots), dtype=np.int64)
    for s in range(W):
        chunk[:, s] = chunking.count_in_chunks(start[s], start[s] + seg[s], int(flat[s].sum()),
                                               num_chunks, membership)
    return DispatchPlan(assignment, counts, int(top_k), int(num_chunks), membership, slots, seg,
                        chunk, start, block_rows)


SOURCE, DESTINATION = "source", "destination"
RESIDUES = (SOURCE, DESTINATION)
"""PipelinedLLEP's residue: kept on the sending rank (token indices, re-dispatched in backward)
or on the receiving rank (every chunk's received rows, until the layer's backward)."""


def balanced_load_bound(top_k, n_max, num_experts, num_ranks, alpha, lam, min_tokens):
    """``L_0 = min(E_p·k·N_max, ceil(max(α,λ)·k·N_max) + (E/E_p)·(m−1))``: the most routes one
    rank computes under an LLEP plan that places every excess (``planner.plans.llep``)."""
    return llep_plan.residue_bound_routes(top_k, n_max, num_experts, num_ranks, alpha, lam, min_tokens)


def chunk_recv_bound(load_bound, num_chunks_, num_ranks, num_slots):
    """Rows one destination receives in one strided chunk when it computes at most ``load_bound``
    routes in the layer: each of its ``E_p·S`` segments (source × slot) of ``ℓ`` routes puts at
    most ``ceil(ℓ/K)`` in a chunk, so ``Q_i ≤ ceil(load_bound/K) + E_p·S``. Works on numpy arrays."""
    return ceil_div(load_bound, num_chunks_) + np.asarray(num_ranks) * num_slots


def source_chunks(plan_counts_load_W, num_chunks_: int, load_bound: int) -> int:
    """``K'`` of the source-side variant: ``K``, raised to ``ceil(K·max_d load_d / L_0)`` when a
    destination computes more than ``L_0`` routes (an LLEP plan left unplaced excess because the
    import slots ran out). Then ``Q_i ≤ ceil(L_0/K) + E_p·S`` on every rank, whatever the router
    does: the memory stays bounded and the extra chunks cost time only."""
    top = int(np.max(plan_counts_load_W, initial=0))
    if top <= load_bound or load_bound <= 0:
        return int(num_chunks_)
    return int(max(num_chunks_, ceil_div(num_chunks_ * top, load_bound)))


def plan_layer(counts_WE, *, top_k: int, operator: str, token_budget: int = knob_default("token_budget"),
               max_chunks: int = knob_default("max_chunks"), alpha: float = knob_default("llep_alpha"),
               min_tokens: int = knob_default("llep_min_tokens"), lam: float = knob_default("llep_lambda"),
               max_imports: int = knob_default("max_imports"), membership: str = chunking.STRIDED,
               num_chunks: int | None = None, block_rows: int | None = None,
               residue: str = DESTINATION) -> DispatchPlan:
    """The plan of one layer for ``operator`` in {``ep``, ``llep``, ``pipelined_llep``}.

    ``K`` is ``min(ceil(N_max/c), K_max)`` for PipelinedLLEP (``num_chunks`` overrides it, e.g.
    with the value the runtime all-reduced) and 1 otherwise. PipelinedLLEP's expert GEMMs run in
    blocks of ``block_rows`` (default ``chunking.expert_block_rows``). ``residue = source``
    (PipelinedLLEP's source-side variant) raises ``K`` to ``source_chunks`` where the LLEP plan
    leaves a rank above ``L_0`` (``block_rows`` stays that of ``K``).
    """
    counts = np.asarray(counts_WE, dtype=np.int64)
    W = counts.shape[0]
    load = counts.sum(0)
    if operator == "ep":
        a = standard_assignment(load, W)
    else:
        a = assign(load, W, alpha=alpha, min_tokens=min_tokens, lam=lam, max_imports=max_imports)
    if operator == "pipelined_llep":
        n_max = int(counts.sum(1).max()) // max(top_k, 1)
        k = num_chunks if num_chunks is not None else chunking.num_chunks(n_max, token_budget, max_chunks)
        if block_rows is None:
            block_rows = chunking.expert_block_rows(top_k, chunking.chunk_tokens(n_max, k), W,
                                                    counts.shape[1], min_tokens)
    else:
        assert operator in ("ep", "llep"), operator
        k, block_rows = 1, None
    assert residue in RESIDUES, residue
    if operator == "pipelined_llep" and residue == SOURCE:
        bound = balanced_load_bound(top_k, n_max, counts.shape[1], W, alpha, lam, min_tokens)
        k = source_chunks(np.asarray(a.load), int(k), int(bound))
    return build(counts, a, top_k=top_k, num_chunks=int(k), membership=membership,
                 block_rows=block_rows)
