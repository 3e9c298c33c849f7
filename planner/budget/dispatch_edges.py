"""Which live set books the tensors at a MoE region's edges under LLEP and standard EP (and, without
checkpointing, PipelinedLLEP's destination-residue variant).

``run_unchunked`` (``planner/runtime/expert_parallel.py``, LLEP and standard EP) makes, unlike
PipelinedLLEP, three tensors late:

- the region's output accumulator ``N·H`` (``x_NH.new_zeros(...).index_add_``) at the operator's
  end, after the grouped MLP's forward peak; without checkpointing the region's residual add
  (``model.py`` ``ffn_region``: ``h + out``) then makes the region output ``N·H`` beside it and
  beside every buffer the operator saved;
- the dispatcher's input gradient ``N·H`` (``index_select``'s backward) at the end of its backward,
  after the combine's backward peak;
- with freed gradients, the region's own expert gradients, which the grouped MLP's backward makes as
  its stacked gradients (they become ``param.grad``).

PipelinedLLEP's destination-residue variant (``planner/runtime/pipelined_llep.py``) makes its input
gradient chunk by chunk (``exchange.Dispatch``'s backward scatter into ``N×H``), the first one after
its first chunk's expert backward; without checkpointing nothing else makes it earlier.

On the composed stack the dispatch inventory (``dispatch_inventory.unchunked``, ``pipelined``)
counts these at the moments they exist; ``boundaries`` / ``saved_composed`` (region output, the
gradient into the normed input) and ``persistent`` (the region's own expert gradients in
``backward[r]``) leave them out, and the sub-steps of ``ffn`` that add to or take from those terms
follow.
"""

from __future__ import annotations

from planner.context.ctx import Ctx
from planner.plans.dispatch import DESTINATION

UNCHUNKED = ("ep", "llep")
"""Operators run by ``run_unchunked`` (plain autograd, the whole routed batch at once)."""


def _composed_unchunked(ctx: Ctx) -> bool:
    return ctx.stack == "composed" and ctx.dispatch in UNCHUNKED


def books_region_io(ctx: Ctx) -> bool:
    """LLEP and standard EP in a composed MoE region make the region's output accumulator and the
    dispatcher's input gradient at the operator's end (``run_unchunked``'s ``index_add_``,
    ``index_select``'s backward), after the grouped MLP's and the combine's peaks: the inventory
    counts them at those moments and ``boundaries`` leaves them out (H200 allocator history of
    qwen3-30b-a3b W = 8 LLEP, forward[2]: no N·H output beside the grouped MLP's buffers;
    backward[4]: one N·H incoming gradient at the combine's backward). Without checkpointing the
    same holds (``NONE_SOURCE``), and so it does for PipelinedLLEP's destination variant, whose
    first input gradient comes after its first chunk's backward."""
    if ctx.stack != "composed":
        return False
    if ctx.dispatch in UNCHUNKED:
        return ctx.checkpoint in ("per_layer", "sco", "none")
    return (ctx.dispatch == "pipelined_llep" and ctx.checkpoint == "none"
            and ctx.dispatch_residue == DESTINATION)


NONE_SOURCE = ("H200 allocator histories of planner validate without checkpointing (bench/results/"
               "memory_snapshot/gptoss-W64-S16384-none-llep.json forward[2]: expert_parallel.py:180 "
               "index_add_'s N·H output beside model.py:85 ffn_region's N·H residual sum and every saved "
               "buffer of the operator, y_RH and yw_RH included; backward[2]: one N·H incoming gradient, "
               "ToCopyBackward0, at the grouped MLP's backward, as in qwen3-W8-S16384-none-llep.json "
               "backward[2]/[4]; dsv2-W8-S16384-none-destination.json backward[4], K = 1: the incoming "
               "ToCopyBackward0 N·H and the shared experts' MmBackward0 input gradient N·H at the chunk's "
               "expert backward, no dispatcher input gradient yet)")


def books_own_grads(ctx: Ctx) -> bool:
    """LLEP and standard EP on the composed stack with freed gradients: the region's own expert
    gradients are made by the grouped MLP's backward (its stacked gradients become ``param.grad``),
    so the inventory counts them from then on and ``persistent`` books, in ``backward[r]``, only the
    regions ``j > r`` (H200 allocator history of qwen3-30b-a3b W = 8 LLEP, backward[2]: the
    expert_mlp.py stacked gradients of region 4 alone at the combine's backward)."""
    return _composed_unchunked(ctx) and ctx.grad_lifetime == "freed"


def inventory_flags(ctx: Ctx) -> dict:
    """``own_grads`` / ``region_io`` of ``dispatch_inventory.unchunked`` for ``ctx``."""
    return dict(own_grads=books_own_grads(ctx), region_io=books_region_io(ctx))
