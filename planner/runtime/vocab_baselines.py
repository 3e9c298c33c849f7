"""The two heads Ring-DTP replaces (DESIGN §7): the dense head and vocab-parallel cross-entropy.

Legend (DESIGN §1): ``N`` tokens, ``H`` hidden width, ``V`` vocabulary, ``P`` ranks of the
vocabulary group, ``V_r`` rows of this rank's shard, ``b`` bytes per input scalar.
``x_NH`` hidden states, ``t_N`` targets, ``w_VH`` the full head, ``w_VpH`` one shard,
``logits_NV`` / ``p_NVp`` logits (fp32), ``lse_N`` log-sum-exp.

**Dense head** (``dense_cross_entropy``): the reference schedule of
``reference/paper-figures.md``, literally ``cross_entropy(x @ w.T, t)`` (the product upcast to
fp32 first for bf16 inputs). No collectives. Live buffers: the ``N×V`` logits (fp32; plus its
``b``-byte matmul output while upcast), the ``N×V`` fp32 log-softmax saved for backward; in backward
the log-softmax, its gradient and the gradient of the logits (three ``N×V`` fp32 tensors), then
the logits gradient with ``dx`` (``N×H``) and ``dw`` (``V×H``).

**Vocab-parallel** (``vocab_parallel_cross_entropy``): Megatron-style; every rank of the group
holds the *same* batch and the rows ``[vocab_start, vocab_start + V_r)``.

- forward: 3 all-reduces of ``N`` fp32 each (max, sum of exponentials, target logit).
- backward: 1 all-reduce of ``dx`` (``N·H`` fp32 — the input gradient of the column-parallel
  product).
- live buffers: one ``N×V_r`` fp32 strip turned into the softmax in place and saved; in backward it
  becomes the logit gradient in place, then ``dx`` (fp32 ``N×H``) and ``dw`` (``V_r×H``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import InvalidPlan
from planner.runtime import shim
from planner.runtime import ring_dtp_state as S

FP32 = torch.float32


def dense_cross_entropy(x_NH: torch.Tensor, targets_N: torch.Tensor, w_VH: torch.Tensor, *,
                        ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy through a full head with materialised logits: ``cross_entropy(x @ w.T, t)``.

    Shapes: ``x_NH`` (N×H), ``targets_N`` (N), ``w_VH`` (V×H); returns an fp32 scalar.
    """
    logits_NV = x_NH @ w_VH.t()
    if logits_NV.dtype != FP32:
        logits_NV = logits_NV.float()
    return F.cross_entropy(logits_NV, targets_N, ignore_index=ignore_index, reduction=reduction)


class DenseHead(nn.Module):
    """A full ``V × H`` head whose ``forward(x_NH, targets_N)`` is ``dense_cross_entropy``."""

    def __init__(self, hidden_size: int, vocab_size: int, *, ignore_index: int = -100,
                 reduction: str = "mean", device=None, dtype=None) -> None:
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=hidden_size ** -0.5)

    def forward(self, x_NH: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
        return dense_cross_entropy(x_NH, targets_N, self.weight, ignore_index=self.ignore_index,
                                   reduction=self.reduction)


@dataclass(frozen=True)
class _VPCfg:
    group: object
    lo: int
    hi: int
    ignore_index: int
    reduction: str


class _VocabParallelCE(torch.autograd.Function):
    """(x_NH replicated, w_VpH shard, t_N replicated) -> the batch's loss, the same on every rank."""

    @staticmethod
    def forward(ctx, x_NH, w_VpH, t_N, c: _VPCfg):
        p_NVp = S.strip_logits(x_NH, w_VpH)
        idx_N1, hit_N = S.local_targets(t_N, c.lo, c.hi, c.ignore_index)
        y_N = p_NVp.gather(1, idx_N1).squeeze(1).masked_fill_(~hit_N, 0.0)
        m_N = p_NVp.amax(1)
        shim.all_reduce(m_N, "max", group=c.group)
        p_NVp.sub_(m_N.unsqueeze(1)).exp_()
        z_N = p_NVp.sum(1)
        shim.all_reduce(z_N, "sum", group=c.group)
        shim.all_reduce(y_N, "sum", group=c.group)
        p_NVp.div_(z_N.unsqueeze(1))              # the softmax, saved for backward
        valid_N = t_N != c.ignore_index
        loss = torch.where(valid_N, m_N + torch.log(z_N) - y_N, 0.0).sum()
        if c.reduction == "mean":
            loss = loss / valid_N.sum()
        ctx.save_for_backward(x_NH, w_VpH, t_N, p_NVp)
        ctx.c = c
        return loss

    @staticmethod
    def backward(ctx, g):
        x_NH, w_VpH, t_N, p_NVp = ctx.saved_tensors
        c: _VPCfg = ctx.c
        valid_N = t_N != c.ignore_index
        g = g.to(FP32)
        scale_N = torch.where(valid_N, g / valid_N.sum() if c.reduction == "mean" else g, 0.0)
        idx_N1, hit_N = S.local_targets(t_N, c.lo, c.hi, c.ignore_index)
        p_NVp.scatter_add_(1, idx_N1, hit_N.to(FP32).neg_().unsqueeze(1))   # in place, Megatron-style
        p_NVp.mul_(scale_N.unsqueeze(1))
        g_NVp = p_NVp if x_NH.dtype == FP32 else p_NVp.to(x_NH.dtype)
        gx_NH = torch.mm(g_NVp, w_VpH).float()
        gw_VpH = torch.mm(g_NVp.t(), x_NH)
        del g_NVp, p_NVp
        shim.all_reduce(gx_NH, "sum", group=c.group)
        return gx_NH.to(x_NH.dtype), gw_VpH, None, None


def vocab_parallel_cross_entropy(x_NH: torch.Tensor, targets_N: torch.Tensor, w_VpH: torch.Tensor, *,
                                 group, vocab_start: int, ignore_index: int = -100,
                                 reduction: str = "mean") -> torch.Tensor:
    """Megatron-style vocab-parallel cross-entropy: the same ``x_NH``/``targets_N`` on every rank of
    ``group``; this rank holds rows ``[vocab_start, vocab_start + V_r)`` of the head.

    Returns the loss of the whole batch (fp32 scalar, equal on every rank). Backward gives ``x_NH``
    the full input gradient (all-reduced) and ``w_VpH`` its shard's gradient.

    Raises:
        InvalidPlan: shapes or dtypes do not match.
    """
    if x_NH.dim() != 2 or w_VpH.dim() != 2 or x_NH.shape[1] != w_VpH.shape[1]:
        raise InvalidPlan("x_NH/w_VpH", (tuple(x_NH.shape), tuple(w_VpH.shape)),
                          "must be N×H and V_r×H with the same H", "flatten the batch to N×H")
    if x_NH.dtype != w_VpH.dtype:
        raise InvalidPlan("dtype", (x_NH.dtype, w_VpH.dtype), "must be the same", "cast to one dtype")
    if reduction not in ("mean", "sum"):
        raise InvalidPlan("reduction", reduction, "must be 'mean' or 'sum'", "pick one")
    c = _VPCfg(group, vocab_start, vocab_start + w_VpH.shape[0], ignore_index, reduction)
    return _VocabParallelCE.apply(x_NH, w_VpH, targets_N.long(), c)


class VocabParallelHead(nn.Module):
    """One rank's shard of a vocab-parallel head (Megatron TP); ``forward(x_NH, targets_N)``."""

    def __init__(self, hidden_size: int, vocab_size: int, *, group=None, ignore_index: int = -100,
                 reduction: str = "mean", device=None, dtype=None) -> None:
        super().__init__()
        from planner.plans.ring import shard_bounds

        self.group, self.ignore_index, self.reduction = group, ignore_index, reduction
        self.vocab_start, stop = shard_bounds(vocab_size, shim.group_size(group))[shim.group_rank(group)]
        self.weight = nn.Parameter(torch.empty(stop - self.vocab_start, hidden_size, device=device,
                                               dtype=dtype))
        nn.init.normal_(self.weight, std=hidden_size ** -0.5)

    def forward(self, x_NH: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(x_NH, targets_N, self.weight, group=self.group,
                                            vocab_start=self.vocab_start,
                                            ignore_index=self.ignore_index, reduction=self.reduction)
