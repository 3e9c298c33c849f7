"""PipelinedLLEP with source-side state only (``dispatch_residue = source``; DESIGN §3.2, §7).

Legend (as ``planner.runtime.pipelined_llep``):
    x_NH, w_R        this rank's tokens and its ``R = k·N`` fp32 route weights (flat)
    perm_R           the flat route indices in send order; chunk ``i``'s routes ``idx_C`` are its
                     strided slice (a view), ``tok_C = idx_C // k`` their tokens
    recv_x_QH, recv_w_Q, y_QH, y_CH   one chunk's received rows and weights, its weighted expert
                     outputs at the destination and back at the source
    gy_QH, gx_QH, gw_Q   the chunk's output gradient at the destination, and its row and
                     route-weight gradients before the reverse dispatch

One autograd node per layer (``SourceLayer``). **Nothing of a chunk is kept on the receiving rank
across chunks**: the node saves only what the sending rank already holds — the layer's inputs
``x_NH`` and ``w_R`` (references), ``perm_R`` (``k·N`` int64, the chunks' token indices, whatever
the router does) and the imported experts' weights (``≤ n_import_max``) — and re-dispatches every
chunk in backward.

Forward, chunk by chunk (no grad): dispatch of the chunk's rows and route weights (chunk ``i+1``'s
issued while chunk ``i`` computes), the expert MLP of every slot in GEMM blocks of ``block_rows``
(``ExpertChunk``'s kernels, the route weight applied at the destination), the combine all-to-all
and ``out.index_add_``.

Backward, chunks in reverse order: the **re-dispatch** of the chunk's rows and weights (chunk
``i-1``'s issued while chunk ``i`` computes), the reverse combine of the output gradient's rows,
the recomputed gate|up and ``ExpertChunk``'s backward arithmetic (expert-weight gradients in place,
the router gradient from the recomputed down projection), then the reverse dispatch of the row and
route-weight gradients, ``index_add_`` into ``gx_NH`` (``N·H``) and ``gw_R`` (``R`` fp32).

Collectives per chunk: forward 2 dispatch all-to-alls (rows ``H·b``, weights fp32) and 1 combine;
backward 2 re-dispatch, 1 reverse combine, 2 reverse dispatch: one dispatch (rows + weights) more
than the destination variant. Recompute multiplicities as the destination variant: the expert
matmuls run twice standalone (forward, backward), three times inside a non-reentrant checkpoint
(the region's recompute reruns the forward; the plan is reused through ``op.plan_reuse``).

Live buffers (rank ``d``; ``Q_i`` rows received, ``C_i`` sent in chunk ``i``), none kept across
chunks: forward the prefetched chunk's send rows/weights and received rows/weights, the current
chunk's received rows/weights, ``y_QH``, one GEMM block, then ``y_CH``; backward the current and
prefetched re-dispatched chunk, ``gy_QH``, the recomputed ``gu`` ``Q_i·2I``, ``gx_QH``/``gw_Q``, one
GEMM block, the reverse-dispatched ``C_i·H`` and ``C_i``; throughout, ``perm_R``, the output
``N·H`` (forward) or ``gx_NH`` ``N·H`` and ``gw_R`` (backward), the imported weights and their
gradients (``planner.budget.dispatch_inventory.pipelined_source``).

``.backward()`` is supported, also inside a decoder layer's non-reentrant checkpoint;
``torch.autograd.grad`` is supported too (no reentrant checkpoint). Every rank's stacked expert
``param.grad`` exists after backward (zeros without routes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from planner.runtime.exchange import Prefetch, a2a, send_order
from planner.runtime.expert_chunk import _backward_block, _forward_block, slot_index
from planner.runtime.expert_mlp import SlotWeights
from planner.runtime.llep import import_weights
from planner.plans.dispatch import RESIDUES, SOURCE
from planner.runtime.pipelined_llep import PipelinedLLEP, chunk_layout, chunk_routes
from planner.runtime.validation import check_choice
from planner.schema.knobs import default as knob_default


@dataclass
class _Layer:
    """What the node needs besides tensors: the plan, this rank, its slot weights, the group."""

    plan: object
    rank: int
    sw: SlotWeights
    group: object

    def splits(self, i: int) -> tuple[list, list]:
        send = self.plan.send_KWW[i, self.rank, :].tolist()
        recv = self.plan.send_KWW[i, :, self.rank].tolist()
        return send, recv

    def prefetch(self, x_NH, w_R, perm_R, i: int) -> Prefetch:
        idx_C = chunk_routes(perm_R, self.plan, i)
        tok_C = torch.div(idx_C, self.plan.top_k, rounding_mode="floor")
        send, recv = self.splits(i)
        return Prefetch(x_NH, w_R, idx_C, tok_C, send, recv, self.group)


def _take(pre: Prefetch):
    pre.wait()
    recv_x, recv_w = pre.recv_x, pre.recv_w
    pre.recv_x = pre.recv_w = None
    return recv_x, recv_w


def _expert_forward(L: _Layer, i, recv_x_QH, recv_w_Q, w_up_imp, w_down_imp):
    y_QH = recv_x_QH.new_empty(recv_x_QH.shape)
    idx_Q, blocks = slot_index(chunk_layout(L.plan, L.rank, i), recv_x_QH.device, L.plan.block_rows)
    for slot, at, rows in blocks:
        _forward_block(recv_x_QH, recv_w_Q, y_QH, idx_Q[at:at + rows], L.sw.up(slot, w_up_imp),
                       L.sw.down(slot, w_down_imp))
    return y_QH


def _expert_backward(L: _Layer, i, recv_x_QH, recv_w_Q, gy_QH, w_up_imp, w_down_imp):
    """``(gx_QH, gw_Q)``; expert-weight gradients accumulate in place (``ExpertChunk.backward``)."""
    sw = L.sw
    idx_Q, blocks = slot_index(chunk_layout(L.plan, L.rank, i), recv_x_QH.device, L.plan.block_rows)
    gu_QJ = recv_x_QH.new_empty(recv_x_QH.shape[0], 2 * sw.shard.expert_ffn)
    for slot, at, rows in blocks:
        torch.mm(recv_x_QH.index_select(0, idx_Q[at:at + rows]), sw.up(slot, w_up_imp),
                 out=gu_QJ[at:at + rows])
    gx_QH = torch.empty_like(recv_x_QH)
    gw_Q = torch.empty_like(recv_w_Q)
    for slot, at, rows in blocks:
        g_up, g_down = sw.grads(slot, w_up_imp, w_down_imp)
        _backward_block(recv_x_QH, recv_w_Q, gu_QJ[at:at + rows], gy_QH, gx_QH, gw_Q,
                        idx_Q[at:at + rows], sw.up(slot, w_up_imp), sw.down(slot, w_down_imp),
                        g_up, g_down)
    return gx_QH, gw_Q


class SourceLayer(torch.autograd.Function):
    """``out_NH`` of one layer, keeping only source-side state (module docstring)."""

    @staticmethod
    def forward(ctx, x_NH, w_R, perm_R, w_up_imp, w_down_imp, token, layer: _Layer,
                w_up=None, w_down=None):
        L, K = layer, layer.plan.num_chunks
        out_NH = x_NH.new_zeros(x_NH.shape)
        pre = L.prefetch(x_NH, w_R, perm_R, 0)
        for i in range(K):
            recv_x_QH, recv_w_Q = _take(pre)
            tok_C = pre.tok_R
            pre = L.prefetch(x_NH, w_R, perm_R, i + 1) if i + 1 < K else None
            y_QH = _expert_forward(L, i, recv_x_QH, recv_w_Q, w_up_imp, w_down_imp)
            del recv_x_QH, recv_w_Q
            if pre is not None:
                pre.wait()
            send, recv = L.splits(i)
            y_CH = y_QH.new_empty((int(sum(send)), y_QH.shape[1]))
            a2a(y_CH, y_QH, send, recv, group=L.group)
            del y_QH
            out_NH.index_add_(0, tok_C, y_CH)
            del y_CH, tok_C
        ctx.layer = L
        ctx.save_for_backward(x_NH, w_R, perm_R, w_up_imp, w_down_imp)
        return out_NH

    @staticmethod
    def backward(ctx, g_out_NH):
        x_NH, w_R, perm_R, w_up_imp, w_down_imp = ctx.saved_tensors
        L: _Layer = ctx.layer
        K = L.plan.num_chunks
        L.sw.shard.ensure_grads()                 # zeros on a rank whose experts got no routes
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx_NH = x_NH.new_zeros(x_NH.shape) if need_x else None
        gw_R = w_R.new_zeros(w_R.shape) if need_w else None
        g_out_NH = g_out_NH.contiguous()
        with torch.no_grad():
            pre = L.prefetch(x_NH, w_R, perm_R, K - 1)
            for i in reversed(range(K)):
                recv_x_QH, recv_w_Q = _take(pre)
                idx_C, tok_C = pre.idx_R, pre.tok_R
                pre = L.prefetch(x_NH, w_R, perm_R, i - 1) if i > 0 else None
                send, recv = L.splits(i)
                gy_QH = g_out_NH.new_empty((int(sum(recv)), g_out_NH.shape[1]))
                a2a(gy_QH, g_out_NH.index_select(0, tok_C), recv, send, group=L.group)
                gx_QH, gw_Q = _expert_backward(L, i, recv_x_QH, recv_w_Q, gy_QH, w_up_imp, w_down_imp)
                del recv_x_QH, recv_w_Q, gy_QH
                if pre is not None:
                    pre.wait()
                if need_x:
                    gs_CH = gx_QH.new_empty((int(sum(send)), gx_QH.shape[1]))
                    a2a(gs_CH, gx_QH, send, recv, group=L.group)
                    gx_QH = None
                    gx_NH.index_add_(0, tok_C, gs_CH)
                    del gs_CH
                gx_QH = None
                if need_w:
                    gs_C = gw_Q.new_empty(int(sum(send)))
                    a2a(gs_C, gw_Q, send, recv, group=L.group)
                    gw_R.index_add_(0, idx_C, gs_C)
                    del gs_C
                del gw_Q, idx_C, tok_C
        token_grad = x_NH.new_zeros(0) if ctx.needs_input_grad[5] else None
        return gx_NH, gw_R, None, None, None, token_grad, None, None, None


def run_source(x_NH, ids_Nk, weights_Nk, plan, rank, sw: SlotWeights, group) -> torch.Tensor:
    """The source-side PipelinedLLEP execution of one layer (module docstring)."""
    perm_R = send_order(ids_Nk, plan.source_pieces(rank))
    imports = import_weights(plan, rank, sw, group, inplace=True)
    w_up_imp, w_down_imp, token = imports if imports is not None else (None, None, None)
    return SourceLayer.apply(x_NH, weights_Nk.reshape(-1), perm_R, w_up_imp, w_down_imp, token,
                             _Layer(plan, rank, sw, group), sw.shard.w_up_nHJ, sw.shard.w_down_nIH)


class PipelinedLLEPSource(PipelinedLLEP):
    """PipelinedLLEP whose checkpoint keeps only source-side state (``dispatch_residue = source``)."""

    residue = SOURCE

    def _run(self, x_NH, ids_Nk, weights_Nk, plan) -> torch.Tensor:
        return run_source(x_NH, ids_Nk, weights_Nk, plan, self.rank, SlotWeights(self.shard),
                          self.group)


def pipelined_llep(shard, num_experts: int, top_k: int, group=None, *,
                   residue: str = knob_default("dispatch_residue"), **knobs) -> PipelinedLLEP:
    """The PipelinedLLEP of the variant ``residue`` names (``"source"``: ``PipelinedLLEPSource``,
    ``"destination"``: ``PipelinedLLEP``). Its default is the plan knob ``dispatch_residue``'s, the
    variant ``planner check`` sizes. ``knobs``: ``PipelinedLLEP``'s keyword arguments."""
    check_choice("residue", residue, RESIDUES)
    cls = PipelinedLLEPSource if residue == SOURCE else PipelinedLLEP
    return cls(shard, num_experts, top_k, group, **knobs)
