"""Data movement shared by standard EP, LLEP and PipelinedLLEP (DESIGN §7), through the shim.

Legend:
    ids_Nk, weights_Nk   expert ids and fp32 route weights of this rank's ``N`` tokens
    perm_R               this rank's flat route indices (``token·k + pick``) in send order
    tok_R                ``perm_R // k``: the token of each sent route
    x_RH, w_R            rows and route weights in send or receive order
    w_up_XHJ, w_down_XIH imported expert weights (``X`` imports)

- ``send_order``: route-scale permutation built on the device from the ids and the plan's few
  pieces (a stable sort by expert id, then each piece shifted to its place in send order).
- ``AllToAll``: ``all_to_all_single`` with uneven splits; backward is the reverse all-to-all.
- ``Prefetch`` + ``Dispatch``: PipelinedLLEP's dispatch. ``Prefetch`` gathers a chunk's rows and
  issues its all-to-alls (asynchronously under NCCL) without autograd; ``Dispatch`` is the autograd
  node, created just before the chunk computes, so that backward finishes one chunk (down to the
  input gradient) before it starts the previous one. Its backward is the reverse all-to-all and
  the gather's ``index_add`` into ``N×H`` (and ``N·k`` for the weights).
- ``ImportWeights``: LLEP's weight transfer, point-to-point (``batch_isend_irecv``), once per
  layer. Backward returns each imported expert's gradient to its owner exactly once; the owner
  sums the returned pieces in importer order and adds them to its own. ``inplace=True``
  (PipelinedLLEP) reads the importer's gradients from the in-place buffer of ``ExpertChunk`` and
  adds into ``param.grad``; it is triggered by a 0-element token every chunk consumes
  (``Depend`` makes LLEP's output consume it, so that exporters without imports run it too).
- ``CombineAdd``: PipelinedLLEP's combine all-to-all summed into the output in place, saving
  only the chunk's token ids.

Bytes moved per rank and layer: dispatch and combine ``k·N`` rows of ``H·b`` each (plus ``k·N``
fp32 route weights for PipelinedLLEP); weight transfer ``3·H·I·b`` per exported/imported expert,
and the same back in backward.
"""

from __future__ import annotations

import numpy as np
import torch

from planner.runtime import shim
from planner.runtime.expert_mlp import grad_dtype


fake_fill = None
"""``fill(out)`` or None: while set (``planner.runtime.emulated_fill.FilledAllToAll``), an all-to-all
on the fake process group writes its output with ``fill`` instead of leaving it unwritten."""


def a2a(out, inp, out_splits, in_splits, group=None, async_op: bool = False):
    """``shim.all_to_all_single``; under the fake process group (emulation, traces), which can't
    fill a non-empty output from an empty input, such a call is skipped (communication is a
    no-op there anyway), or its output written by ``fake_fill`` where that is set."""
    if fake_fill is not None and _is_fake(group):
        fake_fill(out)
        return None
    if inp.shape[0] == 0 and out.shape[0] > 0 and _is_fake(group):
        return None
    return shim.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)


def send_order(ids_Nk: torch.Tensor, pieces_P3: np.ndarray) -> torch.Tensor:
    """``perm_R``: flat route indices in send order (see ``DispatchPlan.source_pieces``)."""
    flat_R = ids_Nk.reshape(-1)
    num_routes = flat_R.shape[0]
    if num_routes == 0:
        return flat_R.new_empty(0)
    dev = flat_R.device
    sorted_R = torch.sort(flat_R, stable=True).indices
    starts_P = torch.as_tensor(np.ascontiguousarray(pieces_P3[:, 0]), dtype=torch.int64).to(dev)
    shift_P = torch.as_tensor(pieces_P3[:, 1] - pieces_P3[:, 0], dtype=torch.int64).to(dev)
    pos_R = torch.arange(num_routes, device=dev)
    dest_R = pos_R + shift_P[torch.searchsorted(starts_P, pos_R, right=True) - 1]
    del pos_R
    return torch.empty_like(sorted_R).index_copy_(0, dest_R, sorted_R)


class Permute(torch.autograd.Function):
    """Rows ``x[perm]`` of a permutation ``perm`` (``inv`` its inverse), with the backward
    ``grad[inv]``: one new buffer, exactly autograd's ``index_select`` gradient for a bijection.
    Autograd's own (``index_select_backward``: zeros, then ``index_add_``) takes its out-of-place
    branch when the index is a tensor subclass, so a fake-tensor trace of it holds one buffer more
    than the GPU does; this one allocates the same in both."""

    @staticmethod
    def forward(ctx, x, perm, inv):
        ctx.save_for_backward(inv)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad):
        (inv,) = ctx.saved_tensors
        return grad.index_select(0, inv), None, None


class AllToAll(torch.autograd.Function):
    """Uneven all-to-all along dim 0; backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, inp, out_splits, in_splits, group):
        ctx.splits, ctx.group = (list(out_splits), list(in_splits)), group
        out = inp.new_empty((int(sum(out_splits)), *inp.shape[1:]))
        a2a(out, inp.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        g = grad.new_empty((int(sum(in_splits)), *grad.shape[1:]))
        a2a(g, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return g, None, None, None


class Prefetch:
    """One chunk's gathered rows and weights, and its in-flight dispatch all-to-alls."""

    def __init__(self, x_NH, w_flat, idx_R, tok_R, send_splits, recv_splits, group) -> None:
        self.idx_R, self.tok_R = idx_R, tok_R
        self.send_splits, self.recv_splits, self.group = send_splits, recv_splits, group
        n_recv = int(sum(recv_splits))
        with torch.no_grad():
            send_x = x_NH.index_select(0, tok_R)
            send_w = w_flat.index_select(0, idx_R)
            self.recv_x = x_NH.new_empty((n_recv, x_NH.shape[1]))
            self.recv_w = w_flat.new_empty(n_recv)
            async_ = shim.group_size(group) > 1 and not shim.is_tracing()
            self.works = [a2a(self.recv_x, send_x, recv_splits, send_splits,
                                                 group=group, async_op=async_),
                          a2a(self.recv_w, send_w, recv_splits, send_splits,
                                                 group=group, async_op=async_)]
        self._send = [send_x, send_w]

    def wait(self) -> None:
        """Wait for the all-to-alls and free the send buffers."""
        shim.wait_all(self.works)
        self.works, self._send = [], []


class Dispatch(torch.autograd.Function):
    """Autograd node of a prefetched chunk: returns its received rows and weights."""

    @staticmethod
    def forward(ctx, x_NH, w_flat, pre: Prefetch):
        pre.wait()
        ctx.n_tokens, ctx.n_routes = x_NH.shape[0], w_flat.shape[0]
        ctx.splits, ctx.group = (pre.send_splits, pre.recv_splits), pre.group
        ctx.save_for_backward(pre.idx_R, pre.tok_R)
        recv_x, recv_w = pre.recv_x, pre.recv_w
        pre.recv_x = pre.recv_w = None
        return recv_x, recv_w

    @staticmethod
    def backward(ctx, g_x, g_w):
        idx_R, tok_R = ctx.saved_tensors
        send_splits, recv_splits = ctx.splits
        n_send = int(sum(send_splits))
        gx_NH = gw_flat = None
        if g_x is not None and ctx.needs_input_grad[0]:
            gs_RH = g_x.new_empty((n_send, g_x.shape[1]))
            a2a(gs_RH, g_x.contiguous(), send_splits, recv_splits, group=ctx.group)
            gx_NH = g_x.new_zeros((ctx.n_tokens, g_x.shape[1])).index_add_(0, tok_R, gs_RH)
            del gs_RH
        if g_w is not None and ctx.needs_input_grad[1]:
            gs_R = g_w.new_empty(n_send)
            a2a(gs_R, g_w.contiguous(), send_splits, recv_splits, group=ctx.group)
            gw_flat = g_w.new_zeros(ctx.n_routes).index_add_(0, idx_R, gs_R)
        return gx_NH, gw_flat, None


def _is_fake(group) -> bool:
    return shim.dist.is_initialized() and shim.dist.get_backend(group) == "fake"


def _transfer(send, recv, group) -> None:
    """Point-to-point exchange (``batch_isend_irecv``); a no-op under the fake process group."""
    if (send or recv) and not _is_fake(group):
        shim.wait_all(shim.send_recv(send, recv, group=group))


class ImportWeights(torch.autograd.Function):
    """LLEP weight transfer (see module docstring). Returns ``(w_up_XHJ, w_down_XIH, token)``.

    ``exports``: ``[(local slot, importer), …]`` and ``imports``: ``[(import slot, owner), …]``,
    both in expert-id order, so the point-to-point messages of every pair of ranks match.
    """

    @staticmethod
    def forward(ctx, w_up, w_down, exports, imports, num_imports, group, slot_weights, inplace):
        ctx.exports, ctx.imports, ctx.group = exports, imports, group
        ctx.slot_weights, ctx.inplace = slot_weights, inplace
        ctx.shapes = (w_up.shape, w_down.shape)
        up = w_up.new_empty((num_imports, *w_up.shape[1:]))
        down = w_down.new_empty((num_imports, *w_down.shape[1:]))
        send = [(w[sl], peer) for sl, peer in exports for w in (w_up, w_down)]
        recv = [(buf[j], owner) for j, owner in imports for buf in (up, down)]
        _transfer(send, recv, group)
        return up, down, w_up.new_zeros(0)

    @staticmethod
    def backward(ctx, g_up, g_down, g_token):
        shard = ctx.slot_weights.shard
        if ctx.inplace:
            g_up, g_down = ctx.slot_weights.imp_grads or (None, None)   # None: frozen or no route
            ctx.slot_weights.imp_grads = []
        # in place (PipelinedLLEP) the pieces travel in the owner's gradient dtype (grad_dtype)
        dt = [grad_dtype(w) if ctx.inplace else w.dtype for w in (shard.w_up_nHJ, shard.w_down_nIH)]
        send = []
        for j, owner in ctx.imports:
            for g, w, d in ((g_up, shard.w_up_nHJ, dt[0]), (g_down, shard.w_down_nIH, dt[1])):
                send.append((g[j].contiguous() if g is not None else w.new_zeros(w.shape[1:], dtype=d), owner))
        pieces = [(sl, shard.w_up_nHJ.new_empty(ctx.shapes[0][1:], dtype=dt[0]),
                   shard.w_down_nIH.new_empty(ctx.shapes[1][1:], dtype=dt[1]), peer) for sl, peer in ctx.exports]
        _transfer(send, [(buf, peer) for _, up, down, peer in pieces for buf in (up, down)], ctx.group)
        del send, g_up, g_down
        sums: dict[int, list[torch.Tensor]] = {}
        for sl, up, down, _ in pieces:                     # summed per expert, in exports order
            if sl in sums:
                sums[sl][0] += up
                sums[sl][1] += down
            else:
                sums[sl] = [up, down]
        none = (None,) * 6
        if ctx.inplace:
            if sums:
                gu, gd = shard.ensure_grads()
                for sl, (up, down) in sums.items():
                    if gu is not None:
                        gu[sl].add_(up)
                    if gd is not None:
                        gd[sl].add_(down)
            return (None, None, *none)
        if not sums:
            return (None, None, *none)
        full_up = shard.w_up_nHJ.new_zeros(ctx.shapes[0])
        full_down = shard.w_down_nIH.new_zeros(ctx.shapes[1])
        for sl, (up, down) in sums.items():
            full_up[sl] += up
            full_down[sl] += down
        return (full_up, full_down, *none)


def transfer_lists(plan, rank: int):
    """``(exports, imports)`` of ``rank`` for ``ImportWeights``, both in expert-id order."""
    a = plan.assignment
    n = a.experts_per_rank
    exports = sorted(((e, r) for e, r in a.exports[rank]))
    exports = [(e - rank * n, r) for e, r in exports]
    imports = sorted((e, j) for j, e in enumerate(a.imports[rank]))
    imports = [(j, a.owner(e)) for e, j in imports]
    return exports, imports


class Depend(torch.autograd.Function):
    """``t`` unchanged, made to depend on ``token`` so that the token's producer (the weight
    transfer) runs its backward on every rank, importer or not."""

    @staticmethod
    def forward(ctx, t, token):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_zeros(0)


class CombineAdd(torch.autograd.Function):
    """Combine all-to-all of a chunk's outputs, summed into ``out_NH`` in place.

    Unlike ``out.index_add_(0, tok, AllToAll(y))`` under autograd (whose backward keeps the
    combined rows alive to the end of the layer), only ``tok_C`` is saved. Backward:
    ``grad_out`` passes through, and the chunk's rows of it go back by the reverse all-to-all.
    """

    @staticmethod
    def forward(ctx, out_NH, y_QH, tok_C, send_splits, recv_splits, group):
        y_CH = y_QH.new_empty((int(sum(send_splits)), y_QH.shape[1]))
        a2a(y_CH, y_QH.contiguous(), send_splits, recv_splits, group=group)
        out_NH.index_add_(0, tok_C, y_CH)
        ctx.mark_dirty(out_NH)
        ctx.save_for_backward(tok_C)
        ctx.splits, ctx.group, ctx.q_rows = (send_splits, recv_splits), group, y_QH.shape[0]
        return out_NH

    @staticmethod
    def backward(ctx, g_out):
        (tok_C,) = ctx.saved_tensors
        send_splits, recv_splits = ctx.splits
        g_y = None
        if ctx.needs_input_grad[1]:
            g_y = g_out.new_empty((ctx.q_rows, g_out.shape[1]))
            a2a(g_y, g_out.index_select(0, tok_C), recv_splits, send_splits,
                                   group=ctx.group)
        return g_out, g_y, None, None, None, None
