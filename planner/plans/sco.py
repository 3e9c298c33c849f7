"""SCO selection: which checkpoint boundaries go to pinned host memory (DESIGN §3.2, §7).

Legend (DESIGN §1): ``L_b`` checkpoint boundaries (one per checkpointed region; the attention and
the MLP/MoE block of a layer are separate regions, so ``L_b = 2L``), ``N`` tokens per rank, ``H``
hidden width, ``b`` bytes per activation scalar, ``n_off`` boundaries offloaded. Boundary ``ℓ``
(1-based) is the input of region ``ℓ``; ``h_1`` is the embedding output.

The budget is counted in **physical pinned bytes**. SCO pins page-aligned memory it allocates
itself (``cudaHostRegister``), so one boundary takes ``roundup(N·H·b, 4 KiB)`` host bytes, not the
power of two PyTorch's pinned allocator would take. The walk is greedy in forward order: each
boundary that still fits goes to the host. All boundaries have the same size, so the boundaries
offloaded are ``1..n_off`` with

    n_off = min(L_b, floor(budget / roundup(N·H·b, 4 KiB)))

The selection depends only on the plan, so every rank makes the same choice (no rank can stall a
collective waiting for another's copy). Works on Python ints and numpy integer arrays.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.errors import InvalidPlan
from planner.units import PAGE_BYTES, round_up


def boundary_bytes(tokens_per_rank, hidden_size, act_bytes):
    """Bytes of one boundary on the device: ``N·H·b``.

    Raises:
        InvalidPlan: a non-positive size.
    """
    n = np.asarray(tokens_per_rank, dtype=np.int64) * int(hidden_size) * int(act_bytes)
    if np.any(n <= 0):
        raise InvalidPlan("tokens_per_rank·hidden_size·act_bytes", int(np.min(n)), "must be > 0",
                          "give a positive token count, hidden size and dtype")
    return n if np.ndim(n) else int(n)


def pinned_bytes_per_boundary(tokens_per_rank, hidden_size, act_bytes):
    """Physical pinned host bytes of one offloaded boundary: ``roundup(N·H·b, 4 KiB)``."""
    return round_up(boundary_bytes(tokens_per_rank, hidden_size, act_bytes), PAGE_BYTES)


def num_offloaded(tokens_per_rank, hidden_size, act_bytes, num_boundaries, host_budget_bytes):
    """``n_off = min(L_b, floor(budget / roundup(N·H·b, 4 KiB)))`` (ints or numpy arrays).

    Raises:
        InvalidPlan: a negative budget or a non-positive boundary size.
    """
    budget = np.asarray(host_budget_bytes, dtype=np.int64)
    if np.any(budget < 0):
        raise InvalidPlan("plan.composed.sco_host_bytes", int(np.min(budget)), "must be >= 0",
                          "give a non-negative SCO host budget")
    per = pinned_bytes_per_boundary(tokens_per_rank, hidden_size, act_bytes)
    n = np.minimum(np.asarray(num_boundaries, dtype=np.int64), budget // per)
    return n if np.ndim(n) else int(n)


def pinned_host_bytes(tokens_per_rank, hidden_size, act_bytes, num_boundaries, host_budget_bytes):
    """Physical pinned bytes SCO allocates: ``n_off · roundup(N·H·b, 4 KiB)`` (≤ the budget)."""
    n = num_offloaded(tokens_per_rank, hidden_size, act_bytes, num_boundaries, host_budget_bytes)
    return n * pinned_bytes_per_boundary(tokens_per_rank, hidden_size, act_bytes)


def offloaded_indices(num_boundaries: int, boundary_nbytes: int, host_budget_bytes: int) -> tuple[int, ...]:
    """The 1-based boundaries offloaded, for one scalar plan: ``(1, …, n_off)``.

    ``boundary_nbytes`` is ``N·H·b`` (device bytes); the walk charges its page-rounded size.
    """
    sizes = [int(boundary_nbytes)] * int(num_boundaries)
    return greedy_selection(sizes, int(host_budget_bytes))


def greedy_selection(sizes: Sequence[int], host_budget_bytes: int) -> tuple[int, ...]:
    """Walk boundaries in forward order and take each one whose pinned size still fits.

    The general form of the rule (boundaries of any sizes); with equal sizes it takes the prefix
    ``1..n_off`` of ``num_offloaded``. Returns 1-based indices.

    Raises:
        InvalidPlan: a negative budget or a non-positive size.
    """
    if host_budget_bytes < 0:
        raise InvalidPlan("plan.composed.sco_host_bytes", host_budget_bytes, "must be >= 0",
                          "give a non-negative SCO host budget")
    left, chosen = int(host_budget_bytes), []
    for i, size in enumerate(sizes, start=1):
        if size <= 0:
            raise InvalidPlan(f"boundary[{i}] bytes", size, "must be > 0", "check N, H and b")
        need = round_up(int(size), PAGE_BYTES)
        if need <= left:
            chosen.append(i)
            left -= need
    return tuple(chosen)
