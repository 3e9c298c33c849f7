"""Ring-DTP: vocabulary-projection cross-entropy over a ring of vocabulary shards (DESIGN §7).

Legend (DESIGN §1 symbols; shape suffixes on every tensor):

    P        ranks in the vocabulary group        r  this rank's index in it
    N        tokens of this rank                  N_max  largest N in the group (all-reduced)
    H        hidden width                         V  vocabulary size
    V_r      rows of this rank's shard            V_max = ceil(V/P)  rows of the largest shard
    B_v      strips per shard                     V_b = ceil(V_max/B_v)  columns of one strip
    b        bytes per input scalar (fp32 4, bf16 2); accumulators are fp32
    x_NH     this rank's hidden states            t_N    its targets (int64)
    w_VpH    this rank's weight shard (V_r × H)   lse_N  log-sum-exp of the full logit row
    st_3n    online state (m, z, y_t) per token   p_nb   one fp32 strip of logits / their grads
    mz_2N    (m, z) saved for backward            ms_3n  backward state (m, scale/z, scale)
    gx_nH    gradient of a batch (fp32)           gw_VH  gradient of a shard (fp32)

Schedule (``planner.plans.ring``): rank ``r`` holds its own batch, targets and the vocabulary
interval ``[vocab_start, vocab_start + V_r)``. At step ``s = 0..P-1`` it meets the moving operand
of owner ``(r-s) mod P``; moving tensors go right and arrive from the left. When
``N_max <= ceil(V/P)`` the batch moves (padded to ``N_max`` rows, with its targets and state),
otherwise the weight shard moves (in a ``V_max``-row buffer).

Collectives per call:

- forward: 1 all-reduce(max) of 19 int64 (``N_max``, the targets' max and negated min, ``V`` when
  ``vocab_size`` is not given, and every rank's argument checks and fingerprint, so that every rank
  raises together: ``ring_dtp_checks``); ``P-1`` operand hops; activations branch: ``P`` state hops.
  One host sync (reading ``N_max`` and the checks).
- backward: ``P-1`` operand hops and ``P`` gradient hops (the last returns the gradient home).

Bytes one rank sends per hop (``RingPlan.hop_bytes``):

- activations: forward ``N_max·(H·b + 8)`` then ``12·N_max`` of state; backward
  ``N_max·(H·b + 8 + 12)`` (batch, targets, ``ms_3n``) then ``4·N_max·H`` of gradient.
- weights: forward ``V_max·H·b``; backward ``V_max·H·b`` then ``4·V_max·H`` of gradient.

Live buffers beyond the inputs (``x_NH``, ``t_N``, ``w_VpH``):

- forward: two moving-operand buffers (one when ``P = 2``, none when ``P = 1``), one fp32 strip
  ``N·V_b`` (plus its ``b``-byte matmul output while upcast), three ``st_3n`` states
  (accumulating, in flight, arriving), ``mz_2N`` saved for backward.
- backward: the same operand buffers plus ``ms_3n`` ``3·N_max`` (moving with the batch; this rank's
  ``3·N`` in the weights branch), one fp32 strip (plus a ``b``-byte downcast), two moving gradient
  buffers (fp32), and the fp32 accumulator of the gradient that stays: ``gw`` of the own shard
  (activations) or ``gx_NH`` (weights).

Overlap: hops are ``batch_isend_irecv`` works (``shim.send_recv``); under NCCL they run on the
communicator's stream and the compute stream waits only where it reads (``shim.wait_all``), so the
next operand hop overlaps the current strips. The state / gradient riding on the operand is sent as
soon as the meeting has produced it and is awaited only where the next meeting needs it: after
all its strips (forward state) or before the first accumulation into it (backward gradient, after
the strip's recompute and the stationary operand's GEMM). The shim's side streams are therefore
not needed (and on the CPU and in trace mode everything runs in order anyway); buffers are reused
only after the hop that used them has been awaited.

Exactness: the summation order differs from ``cross_entropy(x @ w.T, t)``, so losses and gradients
are compared norm-wise with a float64 reference (DESIGN §7). The backward forms the softmax as
``exp(logit − m)·(scale/z)``, not ``exp(logit − lse)``: ``lse = m + log z`` rounded at ``|m|``
would put an error of ``eps·|m|`` on every probability (6.5x the bound at ``|logit| ≈ 175``).
``torch.autograd.grad`` works (no reentrant checkpoint inside).
"""

from __future__ import annotations

import torch
from torch import nn

from planner.errors import InvalidPlan
from planner.plans.ring import MOVES, ring_plan, shard_bounds
from planner.runtime import shim
from planner.runtime import ring_dtp_checks as C
from planner.runtime import ring_dtp_passes as R
from planner.runtime import ring_dtp_state as S
from planner.runtime.validation import (check_alloc, check_choice, check_int_range, check_positive_ints,
                                        checked_device, floating_dtype)
from planner.schema.knobs import default as knob_default

FP32 = torch.float32
REDUCTIONS = C.REDUCTIONS


class _RingDTPCrossEntropy(torch.autograd.Function):
    """Autograd function: (x_NH, w_VpH, t_N) -> this rank's loss (fp32 scalar)."""

    @staticmethod
    def forward(ctx, x_NH, w_VpH, t_N, c: R.Cfg):
        fwd = R.forward_activations if c.plan.move == "activations" else R.forward_weights
        st_3N = fwd(c, x_NH, t_N, w_VpH)
        lse_N = st_3N[0] + torch.log(st_3N[1])
        valid_N = t_N != c.ignore_index
        loss = torch.where(valid_N, lse_N - st_3N[2], 0.0).sum()
        n_valid = valid_N.sum()
        if c.reduction == "mean":
            loss = loss / n_valid
        ctx.save_for_backward(x_NH, w_VpH, t_N, st_3N[:2].clone())     # m and z, not lse (grad_state)
        ctx.c = c
        return loss

    @staticmethod
    def backward(ctx, g):
        x_NH, w_VpH, t_N, mz_2N = ctx.saved_tensors
        c: R.Cfg = ctx.c
        valid_N = t_N != c.ignore_index
        g = g.to(FP32)
        per_tok = g / valid_N.sum() if c.reduction == "mean" else g
        act = c.plan.move == "activations"
        bwd = R.backward_activations if act else R.backward_weights
        gx, gw = bwd(c, x_NH, t_N, w_VpH,             # the pass frees the state before returning
                     S.grad_state(mz_2N, valid_N, per_tok, c.plan.n_max if act else x_NH.shape[0]))
        gx = gx.to(x_NH.dtype)                    # low precision: downcast, one at a time
        gw = gw.to(w_VpH.dtype)
        return gx, gw, None, None


def ring_dtp_cross_entropy(x_NH: torch.Tensor, targets_N: torch.Tensor, w_VpH: torch.Tensor, *,
                           group, vocab_start: int, vocab_blocks: int = knob_default("vocab_blocks"), ignore_index: int = -100,
                           reduction: str = "mean", mode: str | None = None,
                           vocab_size: int | None = None, n_max: int | None = None) -> torch.Tensor:
    """Cross-entropy of this rank's tokens against the full vocabulary, whose rows are sharded
    over the ``P`` ranks of ``group`` (Ring-DTP, DESIGN §7). Every rank calls it together.

    Args:
        x_NH: hidden states (N × H), fp32 or bf16; N may differ across ranks, N = 0 included.
        targets_N: target ids in ``[0, V)`` or ``ignore_index``.
        w_VpH: this rank's rows ``[vocab_start, vocab_start + V_r)`` of the head, same dtype as x
            (a non-contiguous view is copied once when the weights travel).
        group: the vocabulary process group (``None``: the default group).
        vocab_start: first row of the shard; must equal ``planner.plans.ring.shard_bounds``.
        vocab_blocks: ``B_v`` strips per shard, at most the plan schema's bound.
        reduction: ``"mean"`` over this rank's non-ignored tokens (NaN when there are none, as
            ``torch.nn.functional.cross_entropy``) or ``"sum"``.
        mode: force ``"activations"`` or ``"weights"``; ``None`` picks by ``N_max <= ceil(V/P)``.
        vocab_size: ``V`` when the caller knows it (else the largest ``vocab_start + V_r``;
            required in trace mode).
        n_max: the group's largest N, used only in trace mode (``shim.global_max(known=...)``).

    Returns:
        This rank's loss, an fp32 scalar. Backward gives ``x_NH`` the gradient of this rank's loss
        and ``w_VpH`` the gradient of the sum of every rank's loss.

    Raises (on every rank of the group together, before the ring: ``ring_dtp_checks.agree``):
        InvalidPlan: an argument of this rank (shapes, dtypes, reduction, mode, the integers, the
            shard bounds), an argument refused on another rank (naming it), or mode, H, dtype,
            vocab_blocks, ignore_index or vocab_size differing between ranks.
        ValueError: a target outside ``[0, V)`` that is not ``ignore_index``, on any rank of the
            group (checked outside trace mode only, at no extra collective and one host sync).
    """
    args = dict(vocab_start=vocab_start, vocab_blocks=vocab_blocks, ignore_index=ignore_index, mode=mode,
                vocab_size=vocab_size)
    err = C.local_error(x_NH=x_NH, targets_N=targets_N, w_VpH=w_VpH, reduction=reduction, n_max=n_max, **args)
    P, r = shim.group_size(group), shim.group_rank(group)
    if shim.is_tracing():                         # fake tensors, fake group: no values to exchange
        if err is not None:
            raise err
        V = vocab_size if vocab_size is not None else shim.global_max(vocab_start + w_VpH.shape[0], group)
        n = shim.global_max(x_NH.shape[0], group, known=n_max)
    else:
        V, n = C.agree(err, x_NH, targets_N, w_VpH, group=group, **args)
    plan = ring_plan(P, V, n, vocab_blocks, mode)
    rows = w_VpH.shape[0]
    if plan.shards[r] != (vocab_start, vocab_start + rows):     # checked by ``agree`` outside trace mode
        raise InvalidPlan("vocab_start", vocab_start,
                          f"with {rows} rows must give the shard {plan.shards[r]} of rank {r} (V={V}, P={P})",
                          "shard the head with planner.plans.ring.shard_bounds(V, P)")
    if plan.move == "weights" and P > 1 and not w_VpH.is_contiguous():
        w_VpH = w_VpH.contiguous()                # the shard travels: one V_r×H copy (a tied, transposed view)
    c = R.Cfg(plan, r, group, ignore_index, reduction)
    return _RingDTPCrossEntropy.apply(x_NH, w_VpH, targets_N.long(), c)


class RingDTPHead(nn.Module):
    """The output head of one rank of a Ring-DTP group: its shard of ``V`` rows and the loss.

    ``forward(x_NH, targets_N)`` returns this rank's loss (see ``ring_dtp_cross_entropy``).
    """

    def __init__(self, hidden_size: int, vocab_size: int, *, group=None, vocab_blocks: int = knob_default("vocab_blocks"),
                 ignore_index: int = -100, reduction: str = "mean", mode: str | None = None,
                 device=None, dtype=None) -> None:
        check_positive_ints(hidden_size=hidden_size, vocab_size=vocab_size)
        C.check_vocab_blocks(vocab_blocks)
        check_int_range("ignore_index", ignore_index, -(1 << 63), (1 << 63) - 1, fix="torch's default is -100")
        check_choice("reduction", reduction, REDUCTIONS)
        check_choice("mode", mode, MOVES, allow_none=True)
        device = checked_device("device", device, allow_none=True)
        dtype = floating_dtype("dtype", dtype, allow_none=True)
        super().__init__()
        self.group, self.vocab_size, self.vocab_blocks = group, vocab_size, vocab_blocks
        self.ignore_index, self.reduction, self.mode = ignore_index, reduction, mode
        self.vocab_start, stop = shard_bounds(vocab_size, shim.group_size(group))[shim.group_rank(group)]
        check_alloc(f"hidden_size ({hidden_size}) and vocab_size ({vocab_size}) (this rank's weight shard of "
                    f"{stop - self.vocab_start} rows)", (stop - self.vocab_start) * hidden_size, dtype, device)
        self.weight = nn.Parameter(torch.empty(stop - self.vocab_start, hidden_size, device=device,
                                               dtype=dtype))
        nn.init.normal_(self.weight, std=hidden_size ** -0.5)

    @torch.no_grad()
    def load_full_weight(self, w_VH: torch.Tensor) -> None:
        """Copy this rank's rows out of the full ``V × H`` head."""
        want = (self.vocab_size, self.weight.shape[1])
        if not isinstance(w_VH, torch.Tensor) or tuple(w_VH.shape) != want:
            raise InvalidPlan("w_VH", tuple(w_VH.shape) if isinstance(w_VH, torch.Tensor) else type(w_VH).__name__,
                              f"must be the full head of shape {want} (vocab_size × hidden_size)",
                              "pass the whole V × H weight; each rank keeps its own rows")
        self.weight.copy_(w_VH[self.vocab_start:self.vocab_start + self.weight.shape[0]])

    def forward(self, x_NH: torch.Tensor, targets_N: torch.Tensor, n_max: int | None = None):
        return ring_dtp_cross_entropy(x_NH, targets_N, self.weight, group=self.group,
                                      vocab_start=self.vocab_start, vocab_blocks=self.vocab_blocks,
                                      ignore_index=self.ignore_index, reduction=self.reduction,
                                      mode=self.mode, vocab_size=self.vocab_size, n_max=n_max)
