"""PipelinedLLEP's expert node: every slot of one received chunk, as one autograd Function.

Legend (as ``planner.runtime.expert_mlp``): ``Q`` rows received in the chunk, ``r`` rows of one
GEMM block, ``x_QH`` / ``w_Q`` the received rows and fp32 route weights, ``y_QH = mlp(x)·w``.

- The route weight is applied here, at the destination, so the router gradient needs no stored
  expert output: backward recomputes ``o = h·Wd`` block by block and forms ``Σ gy·o``.
- Its backward repeats, operation for operation, what autograd does for ``mlp`` followed by the
  route-weight product, so one chunk with unsplit slots is bitwise equal to LLEP.
- Expert-weight gradients accumulate **in place** into one stacked tensor per weight
  (``param.grad``; one import-gradient buffer for imported experts): no chunk allocates a
  full-size weight gradient.
- Every rank's stacked ``param.grad`` exists after backward, zeros when none of its experts
  received a route (as ``GroupedMLP`` gives for standard EP and LLEP, so AdamW updates every
  replica alike): backward allocates them on entry (``ExpertShard.ensure_grads``), and the
  shard's weights are optional inputs (``w_up``, ``w_down``; no gradient returned through them)
  so that the node's output requires grad, and its backward runs, even when neither the rows nor
  the route weights do.
- Inside the reentrant checkpoint's inner recompute (``recompute=True``) it computes only the
  gate|up output ``gu_QJ`` for backward and returns a zero-stride placeholder: the reentrant
  checkpoint never reads the recomputed output's values.
- Each slot runs in GEMM blocks of at most ``block_rows`` rows (rows are independent; only the
  weight-gradient sums see the blocks), which bounds the per-block intermediates.

Per block, forward: ``x, gu, silu(g), h, o`` then ``o·w``; backward: ``x, silu(g), h, o, gy, gy·o``,
``go``, ``gh``, ``silu'``, ``cat`` and ``dx`` (``planner.budget.dispatch_inventory``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from planner.runtime.expert_mlp import SlotWeights, mlp, mlp_backward


def slot_index(layout, device, block_rows: int | None = None):
    """``(idx_Q, [(slot, start, rows), …])``: every slot's received rows, slot-major, as one int64
    tensor (route-scale, rebuilt from the plan's pieces at every use, never cached), and the GEMM
    blocks: each slot's rows cut into blocks of at most ``block_rows``."""
    parts, blocks, at = [], [], 0
    for slot, pieces in layout:
        rows = sum(r for _, r in pieces)
        parts += [np.arange(off, off + r, dtype=np.int64) for off, r in pieces]
        step = rows if not block_rows else block_rows
        blocks += [(slot, at + b0, min(step, rows - b0)) for b0 in range(0, rows, step)]
        at += rows
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return torch.as_tensor(idx).to(device), blocks


def _forward_block(x_QH, w_Q, y_QH, idx_r, w_up, w_down) -> None:
    o_rH = mlp(x_QH.index_select(0, idx_r), w_up, w_down)
    y_QH.index_copy_(0, idx_r, o_rH * w_Q.index_select(0, idx_r).to(o_rH.dtype)[:, None])


def _backward_block(x_QH, w_Q, gu_rJ, gy_QH, gx_QH, gw_Q, idx_r, w_up, w_down, g_up, g_down):
    i = w_down.shape[0]
    x_rH = x_QH.index_select(0, idx_r)
    act_rI = F.silu(gu_rJ[:, :i])
    h_rI = act_rI * gu_rJ[:, i:]
    o_rH = torch.mm(h_rI, w_down)
    gy_rH = gy_QH.index_select(0, idx_r)
    w_r1 = w_Q.index_select(0, idx_r).to(o_rH.dtype)[:, None]
    gw_r1 = (gy_rH * o_rH).sum(1, keepdim=True)
    del o_rH
    go_rH = gy_rH * w_r1
    del gy_rH, w_r1
    acts, hs, gos = [act_rI], [h_rI], [go_rH]
    del act_rI, h_rI, go_rH
    gx_QH.index_copy_(0, idx_r, mlp_backward(x_rH, gu_rJ, acts, hs, gos, w_up, w_down, g_up, g_down))
    gw_Q.index_copy_(0, idx_r, gw_r1.to(gw_Q.dtype)[:, 0])


class ExpertChunk(torch.autograd.Function):
    """``y_QH`` of one chunk (module docstring). ``layout``: ``[(slot, [(offset, rows), …]), …]``,
    the pieces of the received buffer of each non-empty slot, in slot order. ``w_up``/``w_down``:
    the shard's own stacked weights (read through ``weights``; passed only to tie the output to
    them in the graph)."""

    @staticmethod
    def forward(ctx, x_QH, w_Q, w_up_imp, w_down_imp, token, layout, weights: SlotWeights,
                block_rows, recompute: bool, w_up=None, w_down=None):
        i = weights.shard.expert_ffn
        q = x_QH.shape[0]
        ctx.layout, ctx.weights, ctx.block_rows = layout, weights, block_rows
        idx_Q, blocks = slot_index(layout, x_QH.device, block_rows)
        if recompute:
            gu_QJ = x_QH.new_empty(q, 2 * i)
            for slot, at, rows in blocks:
                torch.mm(x_QH.index_select(0, idx_Q[at:at + rows]), weights.up(slot, w_up_imp),
                         out=gu_QJ[at:at + rows])
            ctx.save_for_backward(x_QH, w_Q, w_up_imp, w_down_imp, gu_QJ)
            return x_QH.new_zeros(()).expand(q, x_QH.shape[1])
        y_QH = x_QH.new_empty(x_QH.shape)
        for slot, at, rows in blocks:
            _forward_block(x_QH, w_Q, y_QH, idx_Q[at:at + rows], weights.up(slot, w_up_imp),
                           weights.down(slot, w_down_imp))
        ctx.save_for_backward(x_QH, w_Q, w_up_imp, w_down_imp, None)
        return y_QH

    @staticmethod
    def backward(ctx, gy_QH):
        x_QH, w_Q, w_up_imp, w_down_imp, gu_QJ = ctx.saved_tensors
        assert gu_QJ is not None, "ExpertChunk backward needs the reentrant checkpoint's recompute"
        weights: SlotWeights = ctx.weights
        weights.shard.ensure_grads()              # zeros on a rank whose experts got no routes
        gx_QH = torch.empty_like(x_QH)
        gw_Q = torch.empty_like(w_Q)
        idx_Q, blocks = slot_index(ctx.layout, x_QH.device, ctx.block_rows)
        for slot, at, rows in blocks:
            g_up, g_down = weights.grads(slot, w_up_imp, w_down_imp)
            _backward_block(x_QH, w_Q, gu_QJ[at:at + rows], gy_QH, gx_QH, gw_Q, idx_Q[at:at + rows],
                            weights.up(slot, w_up_imp), weights.down(slot, w_down_imp), g_up, g_down)
        token_grad = x_QH.new_zeros(0) if ctx.needs_input_grad[4] else None
        extra = (None,) * (len(ctx.needs_input_grad) - 9)      # w_up, w_down: accumulated in place
        return (gx_QH, gw_Q, None, None, token_grad, None, None, None, None, *extra)
