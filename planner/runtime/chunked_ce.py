"""Chunked linear cross-entropy: the fused head long-context FSDP2 users enable (Liger-style).

Legend (DESIGN §1): ``N`` tokens, ``H`` hidden width, ``V`` vocabulary, ``C`` tokens per chunk
(``chunk_tokens``), ``b`` bytes per input scalar. ``x_NH`` hidden states, ``t_N`` targets,
``w_VH`` the head, ``z_CV`` one chunk's logits (fp32), ``lse_C`` its log-sum-exp.

The full ``N×V`` logits never exist. The forward walks the tokens in chunks of ``C``; for each
chunk it computes the logits, the loss, and at once the chunk's logit gradient
``softmax − onehot`` (scaled for the reduction), then ``gx`` for the chunk's rows and the chunk's
contribution to ``gw`` (accumulated in fp32). The backward only multiplies the stored gradients
by the incoming scalar. No collectives.

Live buffers (counted in ``planner.budget.fsdp2_vocab``):

- saved from forward to backward: ``gx_NH`` (``N·H·b``) and ``gw_VH`` (fp32 accumulator
  ``V·H·4``, cast to ``b`` at the end of the forward);
- per chunk: ``z_CV`` fp32 (turned into the softmax and then the gradient in place: the
  log-sum-exp is computed in place too, as ``torch.logsumexp`` would hold a second ``C×V`` fp32
  temporary), its ``b``-byte copy for the
  GEMMs [b<4], the ``b``-byte matmul output before the upcast [b<4], the chunk's ``gw``
  product ``V·H·b`` [b<4] before it is added into the accumulator.
"""

from __future__ import annotations

import torch
from torch import nn

from planner.errors import InvalidPlan

FP32 = torch.float32


def _validate(x_NH, t_N, w_VH, chunk_tokens: int, reduction: str) -> None:
    if x_NH.dim() != 2 or w_VH.dim() != 2 or x_NH.shape[1] != w_VH.shape[1]:
        raise InvalidPlan("x_NH / w_VH", f"{tuple(x_NH.shape)} / {tuple(w_VH.shape)}",
                          "must be N×H and V×H with the same H", "pass 2-D hidden states and head")
    if t_N.shape != (x_NH.shape[0],):
        raise InvalidPlan("targets_N", tuple(t_N.shape), f"must be ({x_NH.shape[0]},)", "one target per token")
    if not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise InvalidPlan("chunk_tokens", chunk_tokens, "must be a positive int", "use e.g. 4096")
    if reduction not in ("mean", "sum"):
        raise InvalidPlan("reduction", reduction, "must be mean or sum", "use mean")


class _ChunkedLinearCE(torch.autograd.Function):
    """(x_NH, w_VH, t_N) -> loss; the gradients are computed chunk by chunk in the forward."""

    @staticmethod
    def forward(ctx, x_NH, w_VH, t_N, chunk_tokens: int, ignore_index: int, reduction: str, divisor):
        N = x_NH.shape[0]
        acc = torch.promote_types(x_NH.dtype, FP32)   # fp32 for bf16/fp32 inputs (float64 in tests)
        valid_N = t_N != ignore_index
        denom = divisor if divisor is not None else (valid_N.sum().clamp_min(1) if reduction == "mean" else 1)
        needs = bool(ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        gx_NH = torch.empty_like(x_NH) if needs else None
        gw_VH = torch.zeros(w_VH.shape, dtype=acc, device=w_VH.device) if needs else None
        loss = torch.zeros((), dtype=acc, device=x_NH.device)
        for lo in range(0, N, chunk_tokens):
            hi = min(N, lo + chunk_tokens)
            x_CH, t_C, v_C = x_NH[lo:hi], t_N[lo:hi], valid_N[lo:hi]
            z_CV = torch.mm(x_CH, w_VH.t())
            if z_CV.dtype != acc:
                z_CV = z_CV.to(acc)
            idx_C1 = torch.where(v_C, t_C, 0).unsqueeze(1)
            y_C = z_CV.gather(1, idx_C1).squeeze(1)
            # log-sum-exp in place (``torch.logsumexp`` would allocate a C×V temporary for z − max)
            m_C1 = z_CV.amax(1, keepdim=True)
            s_C1 = z_CV.sub_(m_C1).exp_().sum(1, keepdim=True)        # z_CV = exp(z − max)
            lse_C = (s_C1.log() + m_C1).squeeze(1)
            loss += torch.where(v_C, lse_C - y_C, 0.0).sum()
            if not needs:
                continue
            z_CV.div_(s_C1)                                            # softmax, in place
            z_CV.scatter_add_(1, idx_C1, v_C.to(acc).neg().unsqueeze(1))
            z_CV.mul_((v_C.to(acc) / denom).unsqueeze(1))            # d loss / d z for the chunk
            g_CV = z_CV if x_NH.dtype == acc else z_CV.to(x_NH.dtype)
            del z_CV
            torch.mm(g_CV, w_VH, out=gx_NH[lo:hi])
            gw_VH.add_(torch.mm(g_CV.t(), x_CH))
            del g_CV
        loss = loss / denom
        if needs:
            ctx.save_for_backward(gx_NH, gw_VH.to(w_VH.dtype) if w_VH.dtype != acc else gw_VH)
        return loss

    @staticmethod
    def backward(ctx, g):
        gx_NH, gw_VH = ctx.saved_tensors
        # In place (the saved gradients are used once; ``g`` is 1 under ``loss.backward()``).
        gx_NH.mul_(g.to(gx_NH.dtype))
        gw_VH.mul_(g.to(gw_VH.dtype))
        return gx_NH, gw_VH, None, None, None, None, None


def chunked_linear_cross_entropy(x_NH: torch.Tensor, targets_N: torch.Tensor, w_VH: torch.Tensor, *,
                                 chunk_tokens: int = 4096, ignore_index: int = -100,
                                 reduction: str = "mean", divisor=None) -> torch.Tensor:
    """Cross-entropy of ``x_NH @ w_VH.T`` against ``targets_N`` without materialising the logits.

    ``divisor`` (optional) replaces the mean's token count (e.g. the global token count under data
    parallelism, with ``reduction="sum"`` semantics divided by it). Returns an fp32 scalar.
    """
    _validate(x_NH, targets_N, w_VH, chunk_tokens, reduction)
    return _ChunkedLinearCE.apply(x_NH, w_VH, targets_N, chunk_tokens, ignore_index, reduction, divisor)


class ChunkedCEHead(nn.Module):
    """A ``V × H`` head (``nn.Linear`` without bias) whose loss is ``chunked_linear_cross_entropy``."""

    def __init__(self, linear: nn.Linear, *, chunk_tokens: int = 4096, ignore_index: int = -100) -> None:
        super().__init__()
        self.linear, self.chunk_tokens, self.ignore_index = linear, chunk_tokens, ignore_index

    def forward(self, x_NH: torch.Tensor, targets_N: torch.Tensor, divisor=None) -> torch.Tensor:
        return chunked_linear_cross_entropy(x_NH, targets_N, self.linear.weight, chunk_tokens=self.chunk_tokens,
                                            ignore_index=self.ignore_index,
                                            reduction="mean", divisor=divisor)
