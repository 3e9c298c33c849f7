"""Which live set books the tensors at a MoE region's edges under LLEP and standard EP.

``run_unchunked`` (``planner/runtime/expert_parallel.py``, LLEP and standard EP) makes, unlike
PipelinedLLEP, three tensors late:

- the region's output accumulator ``N·H`` (``x_NH.new_zeros(...).index_add_``) at the operator's
  end, after the grouped MLP's forward peak;
- the dispatcher's input gradient ``N·H`` (``index_select``'s backward) at the end of its backward,
  after the combine's backward peak;
- with freed gradients, the region's own expert gradients, which the grouped MLP's backward makes as
  its stacked gradients (they become ``param.grad``).

On the composed stack the dispatch inventory (``dispatch_inventory.unchunked``) counts these at the
moments they exist; ``boundaries`` (region output, outgoing boundary gradient) and ``persistent``
(the region's own expert gradients in ``backward[r]``) leave them out, and the sub-steps of
``ffn`` that add to or take from those terms follow.
"""

from __future__ import annotations

from planner.context.ctx import Ctx

UNCHUNKED = ("ep", "llep")
"""Operators run by ``run_unchunked`` (plain autograd, the whole routed batch at once)."""


def _composed_unchunked(ctx: Ctx) -> bool:
    return ctx.stack == "composed" and ctx.dispatch in UNCHUNKED


def books_region_io(ctx: Ctx) -> bool:
    """LLEP and standard EP in a checkpointed composed MoE region make the region's output
    accumulator and the dispatcher's input gradient at the operator's end (``run_unchunked``'s
    ``index_add_``, ``index_select``'s backward), after the grouped MLP's and the combine's peaks:
    the inventory counts them at those moments and ``boundaries`` leaves them out (H200 allocator
    history of qwen3-30b-a3b W = 8 LLEP, forward[2]: no N·H output beside the grouped MLP's
    buffers; backward[4]: one N·H incoming gradient at the combine's backward)."""
    return _composed_unchunked(ctx) and ctx.checkpoint in ("per_layer", "sco")


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
