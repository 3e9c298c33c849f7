"""Vocab-parallel cross-entropy where every rank owns distinct tokens (the MoP layout, DESIGN §2).

Legend: ``P`` ranks of the vocabulary group, ``N`` tokens of each, ``x_NH`` this rank's hidden
states, ``x_PNH`` the group's, ``w_VpH`` this rank's rows of the head.

Megatron's vocab-parallel CE (``vocab_baselines``) needs the same batch on every rank, so the group
first all-gathers its tokens (``P·N·H`` elements received, ``P·N`` targets) and every rank runs it
on all ``P·N`` tokens. The loss is the group's mean (equal on every rank). Backward: the CE's
all-reduced input gradient is the same on every rank; each rank keeps its own ``N`` rows, times
``P``, and the weight gradient is scaled by ``P`` as well, so the gradients are those of the sum
of the ``P`` ranks' own mean losses, as with Ring-DTP. Requires the same ``N`` on every rank.
"""

from __future__ import annotations

import torch

from planner.runtime import shim
from planner.runtime.vocab_baselines import VocabParallelHead, vocab_parallel_cross_entropy


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_NH, group):
        P = shim.group_size(group)
        ctx.group, ctx.n, ctx.P = group, x_NH.shape[0], P
        out = x_NH.new_empty(P * x_NH.shape[0], *x_NH.shape[1:])
        shim.all_gather(out, x_NH.contiguous(), group)
        return out

    @staticmethod
    def backward(ctx, g_PNH):
        r = shim.group_rank(ctx.group)
        return g_PNH[r * ctx.n:(r + 1) * ctx.n] * ctx.P, None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, scale):
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


class GatheredVocabParallelHead(VocabParallelHead):
    """``forward(x_NH, targets_N)`` → the group's mean loss (module docstring)."""

    def forward(self, x_NH: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
        P = shim.group_size(self.group)
        x_PNH = _GatherRows.apply(x_NH, self.group)
        t_PN = targets_N.new_empty(P * targets_N.shape[0])
        shim.all_gather(t_PN, targets_N.contiguous(), self.group)
        w = _ScaleGrad.apply(self.weight, float(P)) if P > 1 else self.weight
        return vocab_parallel_cross_entropy(x_PNH, t_PN, w, group=self.group, vocab_start=self.vocab_start,
                                            ignore_index=self.ignore_index, reduction=self.reduction)
