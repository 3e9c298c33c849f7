"""PipelinedLLEP: LLEP dispatched in ``K`` chunks with a launch-time memory bound (DESIGN §3.2, §7).

This is the **destination-residue** variant (``dispatch_residue = destination``): the receiving
rank keeps every chunk's rows until the layer's backward. The source-side variant, which keeps
nothing on the receiver across chunks, is ``planner.runtime.pipelined_llep_source``.

Legend:
    x_NH, ids_Nk, weights_Nk   this rank's tokens, expert ids, fp32 route weights
    K, c, K_max, c_eff         ``K = min(AllReduceMax(ceil(N/c)), K_max)``, ``c_eff = ceil(N_max/K)``
    perm_R                     the ``R = k·N`` flat route indices in send order (destination, slot)
    idx_C, tok_C               chunk ``i``'s routes ``perm_R[i::K]`` (strided) and their tokens
    recv_x_QH, recv_w_Q        a chunk's received rows and route weights (``Q`` rows)
    y_QH, y_CH                 its weighted expert outputs, before and after the combine
    out_NH                     ``Σ_j w_nj · expert_{e_nj}(x_n)``, accumulated chunk by chunk

Schedule per layer: plan (all-gather of ``E`` counts, with ``ceil(N/c)`` in its header whose
maximum gives ``K``; ``planner.runtime.dispatch_agreement``), the LLEP
weight transfer (point-to-point, once), then for each chunk ``i``:

1. dispatch: ``all_to_all_single`` of the chunk's rows (``H`` bf16 each) and of its route weights
   (fp32), issued while chunk ``i-1`` computes (asynchronous under NCCL; in order on the CPU and in
   traces);
2. the grouped gated-MLP expert matmul of every slot (``ExpertChunk``), inside a **reentrant**
   ``torch.utils.checkpoint``; the route weight is applied here, at the destination;
3. combine: ``all_to_all_single`` of the weighted outputs back to their sources, then
   ``out.index_add_``.

Collectives per chunk: two dispatch all-to-alls (``≤ k·c_eff`` rows of ``H·b`` bytes and
``≤ k·c_eff`` fp32 weights sent per source) and one combine all-to-all (the same rows back).
Backward, per chunk: the reverse combine, the reverse dispatch of rows and weights. Once per layer:
the gradients of imported experts return to their owners.

Recompute multiplicities: the expert matmuls run 3 times per step (forward, the outer checkpoint's
recompute, the reentrant checkpoint's recompute; in the last, the down projection runs inside the
backward, expert by expert, where it also gives the router gradient). The dispatch and combine
all-to-alls are re-issued in the outer recompute, in the same order on every rank. The plan is
computed once per layer per step and reused in the recompute (``context_fn=op.plan_reuse``);
route-scale index tensors are rebuilt, never cached.

Live buffers (rank ``d``; ``Q_i`` rows received in chunk ``i``, ``C_i`` rows sent):

- across chunks until the layer's backward (the *residue*): every chunk's ``recv_x`` (``Q_i·H``
  activations) and ``recv_w`` (``Q_i`` fp32), the reentrant checkpoint's inputs. The route weight
  is applied inside the checkpoint, so no expert output is kept for the router gradient;
- one chunk: the next chunk's gathered send rows and received rows (prefetch), the chunk's
  ``y_QH``, the combined ``y_CH``, and one GEMM block's ``x``/``gu``/``h``/``o`` (a slot's rows
  run in blocks of at most ``max(m, ceil(E_p·k·c_eff/E))``, so skewed routing cannot inflate them);
- backward, one chunk: ``grad y_CH``, ``grad y_QH``, the recomputed ``gu`` ``Q_i·2I``, ``grad
  recv_x``, the reverse-dispatched gradient ``C_i·H`` and its ``N·H`` scatter;
- the imported experts' weights ``X·3HI`` and their in-place gradients, and the output ``N·H``.

Gradients: ``.backward()`` is supported, also inside a decoder layer's **non-reentrant**
checkpoint (no chunk's graph stays alive: every saved tensor goes through saved-tensor hooks);
``torch.autograd.grad`` is not (reentrant checkpoint). Expert-weight gradients accumulate in place
into one stacked tensor per weight (``param.grad``), and the weight-transfer backward fires once
per layer. As with standard EP and LLEP, every rank's ``param.grad`` exists after backward (zeros
when its experts received no route): the shard's weights are inputs of every chunk's checkpoint,
so each chunk's backward runs and allocates them (``ExpertChunk``).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from planner.plans import dispatch as plans_dispatch
from planner.plans.chunking import STRIDED
from planner.runtime import shim
from planner.runtime.exchange import CombineAdd, Dispatch, Prefetch, send_order
from planner.runtime.expert_chunk import ExpertChunk
from planner.runtime.expert_mlp import SlotWeights
from planner.runtime.expert_parallel import DispatchOp
from planner.runtime.llep import import_weights
from planner.runtime.validation import check_choice
from planner.units import ceil_div


def chunk_layout(plan, rank: int, chunk: int):
    """``[(slot, [(offset, rows), …]), …]``: the received chunk's pieces, slot-major."""
    rows_WS, offs_WS = plan.recv_layout(rank, chunk)
    out = []
    for sl in range(rows_WS.shape[1]):
        pieces = [(int(offs_WS[s, sl]), int(rows_WS[s, sl])) for s in range(rows_WS.shape[0])
                  if rows_WS[s, sl]]
        if pieces:
            out.append((sl, pieces))
    return out


def _experts(recv_x_QH, recv_w_Q, w_up_imp, w_down_imp, token, w_up, w_down, layout, sw, block_rows):
    # grad mode is on only in the reentrant checkpoint's inner recompute
    return ExpertChunk.apply(recv_x_QH, recv_w_Q, w_up_imp, w_down_imp, token, layout, sw,
                             block_rows, torch.is_grad_enabled(), w_up, w_down)


def chunk_routes(perm_R: torch.Tensor, plan, chunk: int) -> torch.Tensor:
    """``idx_C``: chunk ``chunk``'s flat route indices (strided or contiguous membership)."""
    k_chunks = plan.num_chunks
    if plan.membership == STRIDED:
        return perm_R[chunk::k_chunks]
    step = max(ceil_div(perm_R.shape[0], k_chunks), 1)
    return perm_R[chunk * step:(chunk + 1) * step]


def run_pipelined(x_NH, ids_Nk, weights_Nk, plan, rank, sw: SlotWeights, group) -> torch.Tensor:
    """PipelinedLLEP execution of one layer (see module docstring)."""
    n_tok, hid = x_NH.shape
    perm_R = send_order(ids_Nk, plan.source_pieces(rank))
    w_flat = weights_Nk.reshape(-1)
    imports = import_weights(plan, rank, sw, group, inplace=True)
    w_up_imp, w_down_imp, token = imports if imports is not None else (None, None, None)
    send_KW = plan.send_KWW[:, rank, :]
    recv_KW = plan.send_KWW[:, :, rank]

    def prefetch(i: int) -> Prefetch:
        idx_C = chunk_routes(perm_R, plan, i)
        tok_C = torch.div(idx_C, plan.top_k, rounding_mode="floor")
        return Prefetch(x_NH, w_flat, idx_C, tok_C, send_KW[i].tolist(), recv_KW[i].tolist(), group)

    out_NH = x_NH.new_zeros((n_tok, hid))
    pre = prefetch(0)
    for i in range(plan.num_chunks):
        recv_x_QH, recv_w_Q = Dispatch.apply(x_NH, w_flat, pre)
        tok_C = pre.tok_R
        nxt = prefetch(i + 1) if i + 1 < plan.num_chunks else None
        y_QH = checkpoint(_experts, recv_x_QH, recv_w_Q, w_up_imp, w_down_imp, token,
                          sw.shard.w_up_nHJ, sw.shard.w_down_nIH, chunk_layout(plan, rank, i), sw,
                          plan.block_rows, use_reentrant=True, preserve_rng_state=False)
        del recv_x_QH, recv_w_Q
        if nxt is not None:
            nxt.wait()
        out_NH = CombineAdd.apply(out_NH, y_QH, tok_C, send_KW[i].tolist(), recv_KW[i].tolist(),
                                  group)
        del y_QH
        pre = nxt
    return out_NH


class PipelinedLLEP(DispatchOp):
    """LLEP in ``K`` strided chunks, each expert matmul under a reentrant checkpoint (the
    destination-residue variant; ``planner.runtime.pipelined_llep_source.pipelined_llep`` builds
    the variant a ``residue`` names, by default the plan's, which ``planner check`` sizes)."""

    operator = "pipelined_llep"
    residue = plans_dispatch.DESTINATION
    """The ``dispatch_residue`` this class runs; a ``residue`` argument must name it."""

    def __init__(self, *args, residue: str | None = None, **kwargs) -> None:
        check_choice("residue", residue, plans_dispatch.RESIDUES, allow_none=True)
        if residue is not None and residue != self.residue:
            raise ValueError(f"residue ({residue!r}) is not the variant {type(self).__name__} runs ({self.residue!r}); "
                             "fix: build it with planner.runtime.pipelined_llep_source.pipelined_llep(..., "
                             f"residue={residue!r})")
        super().__init__(*args, residue=self.residue, **kwargs)

    def _want_chunks(self, n_tokens: int) -> int:
        return ceil_div(n_tokens, self.knobs["token_budget"])

    def _chunks(self, want_max: int) -> int:
        """``K = min(max over ranks of ceil(N/c), K_max)``, from the count all-gather's headers."""
        return max(1, min(want_max, self.knobs["max_chunks"]))

    def _num_chunks(self, n_tokens: int) -> int:
        """``K`` by its own all-reduce (for a ``make_plan`` that replaces the count all-gather)."""
        want = ceil_div(n_tokens, self.knobs["token_budget"])
        return max(1, min(shim.global_max(want, self.group), self.knobs["max_chunks"]))

    def _run(self, x_NH, ids_Nk, weights_Nk, plan) -> torch.Tensor:
        return run_pipelined(x_NH, ids_Nk, weights_Nk, plan, self.rank, SlotWeights(self.shard),
                             self.group)
