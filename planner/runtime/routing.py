"""Routing on the torch side: a top-k router, route weights, route-count matrices (DESIGN §3.2, §7).

Legend:
    x_NH        tokens of this rank (``N`` tokens, hidden ``H``)
    w_EH        router weight (one row per routed expert)
    logits_NE   router logits, ``probs_NE`` their fp32 softmax
    ids_Nk      expert ids of each token's ``k`` routes (int64)
    weights_Nk  route weights (fp32): the softmax probabilities of the chosen experts, renormalised

Live buffers of ``TopKRouter`` (per rank): the bf16 logits ``N·E`` (freed after the fp32 cast),
the fp32 softmax ``N·E`` (kept for backward), the top-k values ``N·k`` fp32 and ids ``N·k`` int64,
and the weights ``N·k`` fp32. Synthetic profiles (``planner.plans.routing``) replace the top-k
choice, not the weights: ``route(x, ids=...)`` gathers the router's probabilities at the given
ids, so the router still gets a gradient.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from planner.plans import routing as plans_routing
from planner.runtime import shim


class TopKRouter(torch.nn.Module):
    """Softmax top-k router over ``E`` experts (weights renormalised over the chosen ``k``)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, *, dtype=torch.bfloat16,
                 device=None) -> None:
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.w_EH = torch.nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype, device=device))
        torch.nn.init.normal_(self.w_EH, std=hidden_size ** -0.5)

    def probs(self, x_NH: torch.Tensor) -> torch.Tensor:
        """``probs_NE``: fp32 softmax of the logits ``x·wᵀ``."""
        return torch.softmax(F.linear(x_NH, self.w_EH).float(), dim=-1)

    def forward(self, x_NH: torch.Tensor, ids_Nk: torch.Tensor | None = None):
        """``(ids_Nk, weights_Nk)``; with ``ids_Nk`` given, only the weights come from the router."""
        return route(self.probs(x_NH), self.top_k, ids_Nk)


def route(probs_NE: torch.Tensor, top_k: int, ids_Nk: torch.Tensor | None = None):
    """Top-k choice (or the given ``ids_Nk``) and renormalised fp32 weights."""
    if ids_Nk is None:
        vals_Nk, ids_Nk = torch.topk(probs_NE, top_k, dim=-1)
    else:
        vals_Nk = probs_NE.gather(1, ids_Nk)
    weights_Nk = vals_Nk / vals_Nk.sum(-1, keepdim=True)
    return ids_Nk, weights_Nk


def profile_ids(profile: str, num_tokens: int, num_experts: int, top_k: int, expert_parallel: int,
                device=None) -> torch.Tensor:
    """``ids_Nk`` of a named routing profile (``planner.plans.routing``) as an int64 tensor."""
    ids = plans_routing.expert_ids(profile, num_tokens, num_experts, top_k, expert_parallel)
    return torch.from_numpy(ids).to(device)


def local_counts(ids_Nk: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Routes of this rank to each expert (``[E]`` int64, on the ids' device).

    Raises:
        ValueError: an id outside ``[0, E)`` (found by ``bincount`` itself: no extra kernel).
    """
    try:
        counts = torch.bincount(ids_Nk.reshape(-1), minlength=num_experts)
    except RuntimeError as e:
        what = "found a negative id" if "non-negative" in str(e) else str(e)
        raise ValueError(f"ids_Nk must lie in [0, {num_experts}): {what}") from None
    if counts.shape[0] > num_experts:
        raise ValueError(f"ids_Nk must lie in [0, {num_experts}): found {counts.shape[0] - 1}")
    return counts


def gather_counts(ids_Nk: torch.Tensor, num_experts: int, group=None) -> np.ndarray:
    """``counts_WE`` of the expert-parallel group (an all-gather of ``E`` integers per rank)."""
    mine = local_counts(ids_Nk, num_experts)
    world = shim.group_size(group)
    if world == 1:
        return mine.cpu().numpy()[None].astype(np.int64)
    dev = mine.device
    if shim.dist.get_backend(group) == "nccl" and dev.type != "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
    out = torch.empty(world * num_experts, dtype=torch.int64, device=dev)
    shim.all_gather(out, mine.to(dev), group=group)
    return out.cpu().numpy().reshape(world, num_experts).astype(np.int64)


def count_matrix(ids_per_rank, num_experts: int) -> np.ndarray:
    """``counts_WE`` from every rank's ids (tensors or arrays), via ``planner.plans.routing``."""
    arrs = [i.detach().cpu().numpy() if isinstance(i, torch.Tensor) else np.asarray(i)
            for i in ids_per_rank]
    return plans_routing.counts_from_ids(arrs, num_experts)
