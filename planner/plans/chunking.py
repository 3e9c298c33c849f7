"""PipelinedLLEP chunking: chunk count, effective chunk size and chunk membership (DESIGN §1, §7).

Legend:
    N, N_max   tokens on a rank, and its all-reduced maximum over the expert-parallel group
    c          per-source token budget per dispatch chunk (``token_budget``)
    K, K_max   ``K = min(ceil(N_max/c), K_max)`` chunks per layer, the same on every rank
    c_eff      ``ceil(N_max/K)``: tokens per source per chunk, at most
    R          routes a source sends in one layer (``k·N``), in destination order
    p          a position in that destination-ordered route list, ``0 <= p < R``

Chunk ``i`` of a source is the strided positions ``{i, i+K, i+2K, …}`` of its destination-ordered
routes (``strided``), or the contiguous block ``[i·ceil(R/K), (i+1)·ceil(R/K))`` (``contiguous``,
kept for comparison). Either way a chunk holds at most ``ceil(R/K) <= k·c_eff`` routes, so one
destination receives at most ``E_p·k·c_eff`` routes per chunk whatever the router does.

Every function works on Python ints and, where it makes sense, on numpy integer arrays (the search
evaluates many candidates at once).
"""

from __future__ import annotations

import numpy as np

from planner.units import ceil_div

STRIDED = "strided"
CONTIGUOUS = "contiguous"
MEMBERSHIPS = (STRIDED, CONTIGUOUS)


def num_chunks(n_max, token_budget, max_chunks):
    """``K = min(ceil(N_max/c), K_max)``, and at least 1 (a rank group with no tokens runs one).

    Args:
        n_max: ``N_max``, tokens per rank (all-reduced maximum); int or numpy array.
        token_budget: ``c`` (> 0).
        max_chunks: ``K_max`` (> 0).
    """
    k = np.minimum(ceil_div(n_max, token_budget), max_chunks)
    k = np.maximum(k, 1)
    return int(k) if np.ndim(k) == 0 else k


def chunk_tokens(n_max, num_chunks_):
    """``c_eff = ceil(N_max/K)``: the most tokens one source puts in one chunk."""
    c = ceil_div(n_max, num_chunks_)
    return int(c) if np.ndim(c) == 0 else c


def strided_members(num_routes: int, num_chunks_: int, chunk: int) -> np.ndarray:
    """Positions of chunk ``chunk`` under strided membership: ``{chunk, chunk+K, …} ∩ [0, R)``."""
    return np.arange(chunk, num_routes, num_chunks_, dtype=np.int64)


def contiguous_members(num_routes: int, num_chunks_: int, chunk: int) -> np.ndarray:
    """Positions of chunk ``chunk`` under contiguous membership: ``[i·ceil(R/K), (i+1)·ceil(R/K))``."""
    step = ceil_div(num_routes, num_chunks_)
    return np.arange(min(chunk * step, num_routes), min((chunk + 1) * step, num_routes), dtype=np.int64)


def members(num_routes: int, num_chunks_: int, chunk: int, membership: str = STRIDED) -> np.ndarray:
    """Positions of one chunk under ``membership`` (``strided`` or ``contiguous``)."""
    if membership == STRIDED:
        return strided_members(num_routes, num_chunks_, chunk)
    assert membership == CONTIGUOUS, membership
    return contiguous_members(num_routes, num_chunks_, chunk)


def _strided_upto(x, chunk, k):
    """How many ``p`` in ``[0, x)`` have ``p ≡ chunk (mod K)``."""
    return np.maximum(ceil_div(np.asarray(x) - chunk, k), 0)


def count_in_chunks(starts, stops, num_routes, num_chunks_: int, membership: str = STRIDED) -> np.ndarray:
    """Routes of each segment ``[starts, stops)`` that fall in each chunk.

    Args:
        starts, stops: integer arrays of the same shape: segments of the destination-ordered route
            list of one source (``0 <= start <= stop <= R``).
        num_routes: ``R`` of that source (used by ``contiguous``).
    Returns:
        ``int64`` array of shape ``(K, *starts.shape)``.
    """
    starts = np.asarray(starts, dtype=np.int64)
    stops = np.asarray(stops, dtype=np.int64)
    out = np.empty((num_chunks_, *starts.shape), dtype=np.int64)
    if membership == STRIDED:
        for i in range(num_chunks_):
            out[i] = _strided_upto(stops, i, num_chunks_) - _strided_upto(starts, i, num_chunks_)
        return out
    assert membership == CONTIGUOUS, membership
    step = max(ceil_div(int(num_routes), num_chunks_), 1)
    for i in range(num_chunks_):
        lo, hi = i * step, (i + 1) * step
        out[i] = np.maximum(np.minimum(stops, hi) - np.maximum(starts, lo), 0)
    return out


def expert_block_rows(top_k, c_eff, expert_parallel, num_experts, min_tokens):
    """Rows one expert GEMM of PipelinedLLEP takes at a time: ``max(m, ceil(E_p·k·c_eff/E))``.

    ``E_p·k·c_eff/E`` is one expert's share of a chunk under balanced routing; a slot holding more
    rows in a chunk (skewed routing, imports) runs in blocks of this size, so the per-expert
    intermediates stay bounded whatever the router does. Works on numpy arrays.
    """
    share = ceil_div(np.asarray(expert_parallel) * top_k * np.asarray(c_eff), num_experts)
    r = np.maximum(share, min_tokens)
    return int(r) if np.ndim(r) == 0 else r
