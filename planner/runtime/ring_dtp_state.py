"""Strip kernels and the online log-sum-exp state of Ring-DTP (helpers of ``ring_dtp.py``).

Legend: ``n`` rows of the batch a meeting sees (``N`` or ``N_max``), ``V_b`` columns of one strip,
``H`` hidden width; ``x_nH`` a batch, ``w_bH`` one strip of a weight shard, ``t_n`` targets,
``p_nb`` a strip of logits / probabilities / logit gradients (always fp32), ``st_3n`` the per-token
state ``(m, z, y_t)`` stacked as rows: running max, running sum of ``exp(logit - m)``, and the
target logit (0 until the strip holding the target is met).

Every strip kernel allocates one fp32 ``n × V_b`` strip and works on it in place; with
low-precision inputs the matmul's ``n × V_b`` output in the input dtype lives next to it while it
is upcast (and its fp32 gradient next to the downcast copy in backward).
"""

from __future__ import annotations

import torch

from planner.runtime import shim

FP32 = torch.float32


def new_state(n: int, like: torch.Tensor) -> torch.Tensor:
    """Empty online log-sum-exp state ``st_3n``: ``m = -inf``, ``z = 0``, ``y = 0`` (fp32)."""
    st = torch.zeros(3, n, dtype=FP32, device=like.device)
    st[0].fill_(float("-inf"))
    return st


def padded(t: torch.Tensor, rows: int, fill: float | int = 0) -> torch.Tensor:
    """``t`` itself when it already has ``rows`` rows (and is contiguous), else a padded copy."""
    if t.shape[0] == rows and t.is_contiguous():
        return t
    out = t.new_full((rows, *t.shape[1:]), fill)
    out[: t.shape[0]].copy_(t)
    return out


def local_targets(t_n: torch.Tensor, lo: int, hi: int, ignore_index: int):
    """Column of each target inside the strip ``[lo, hi)`` (clamped) and whether it is there."""
    hit_n = (t_n >= lo) & (t_n < hi) & (t_n != ignore_index)
    idx_n1 = (t_n - lo).clamp_(0, max(hi - lo - 1, 0)).unsqueeze(1)
    return idx_n1, hit_n


def strip_logits(x_nH: torch.Tensor, w_bH: torch.Tensor) -> torch.Tensor:
    """``x_nH @ w_bH.T`` as an fp32 ``n × V_b`` strip (low-precision products upcast)."""
    z = torch.mm(x_nH, w_bH.t())
    return z if z.dtype == FP32 else z.float()


def merge_lse(st_3n: torch.Tensor, m_n: torch.Tensor, z_n: torch.Tensor, y_n: torch.Tensor) -> None:
    """Fold partial statistics ``(m, z, y)`` into ``st_3n`` in place (online log-sum-exp)."""
    m_new = torch.maximum(st_3n[0], m_n)
    st_3n[1].mul_(torch.exp(st_3n[0] - m_new)).add_(z_n * torch.exp(m_n - m_new))
    st_3n[0].copy_(m_new)
    st_3n[2].add_(y_n)


def fold_strip(st_3n, x_nH, w_bH, t_n, lo: int, hi: int, ignore_index: int) -> None:
    """Fold the strip ``x_nH @ w_bH.T`` (vocabulary rows ``[lo, hi)``) into ``st_3n``."""
    p_nb = strip_logits(x_nH, w_bH)
    idx_n1, hit_n = local_targets(t_n, lo, hi, ignore_index)
    y_n = p_nb.gather(1, idx_n1).squeeze(1).masked_fill_(~hit_n, 0.0)
    m_n = p_nb.amax(1)
    p_nb.sub_(m_n.unsqueeze(1)).exp_()
    z_n = p_nb.sum(1)
    del p_nb
    merge_lse(st_3n, m_n, z_n, y_n)


def grad_state(mz_2N: torch.Tensor, valid_N: torch.Tensor, per_tok: torch.Tensor, rows: int) -> torch.Tensor:
    """Backward state ``ms_3n`` of ``rows >= N`` rows (fp32): the row max ``m``, ``scale/z`` and the
    per-token ``scale`` (``per_tok`` on valid tokens, else 0); padding rows are 0 (no gradient).

    The softmax is ``exp(logit - m)/z``, never ``exp(logit - lse)``: ``lse = m + log z`` rounded at
    the magnitude of ``m`` would err by ``eps·|m|`` on every probability (DESIGN §7)."""
    N = mz_2N.shape[1]
    ms_3n = mz_2N.new_zeros(3, rows)
    ms_3n[0, :N] = mz_2N[0]
    torch.where(valid_N, per_tok, per_tok.new_zeros(()), out=ms_3n[2, :N])
    torch.div(ms_3n[2, :N], mz_2N[1], out=ms_3n[1, :N])
    return ms_3n


def grad_strip(x_nH, w_bH, t_n, lo: int, hi: int, ms_3n, ignore_index: int) -> torch.Tensor:
    """Gradient of the loss w.r.t. the strip's logits: ``scale·(softmax − onehot)`` with
    ``scale·softmax = exp(logit − m)·(scale/z)`` (``ms_3n``, ``grad_state``), in the input dtype
    (fp32 work strip, downcast at the end for low-precision inputs)."""
    p_nb = strip_logits(x_nH, w_bH)
    p_nb.sub_(ms_3n[0].unsqueeze(1)).exp_().mul_(ms_3n[1].unsqueeze(1))
    idx_n1, hit_n = local_targets(t_n, lo, hi, ignore_index)
    p_nb.scatter_add_(1, idx_n1, hit_n.to(FP32).mul_(ms_3n[2]).neg_().unsqueeze(1))
    if x_nH.dtype == FP32:
        return p_nb
    g = p_nb.to(x_nH.dtype)
    del p_nb
    return g


def accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with an fp32 accumulator (in place for fp32 operands; a low-precision
    product is formed in the input dtype and added)."""
    if a.dtype == acc.dtype and b.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(torch.mm(a, b))


class Ring:
    """Posts one rank's hops: every tensor goes right and arrives from the left (plan.ring)."""

    def __init__(self, plan, rank: int, group) -> None:
        self.plan, self.rank, self.group = plan, rank, group

    def hop(self, sends, recvs) -> list:
        """Post the sends to the right and the receives from the left; returns the works."""
        right, left = self.plan.send_to(self.rank), self.plan.recv_from(self.rank)
        return shim.send_recv([(t, right) for t in sends], [(t, left) for t in recvs], group=self.group)
