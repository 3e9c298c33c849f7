"""The dispatch operators' buffers: each buffer's name and its formula text, declared once.

``planner.budget.dispatch_inventory`` writes a moment as ``{(buffer, elem_bytes): count}`` with these
buffers as keys, so a dispatch term carries its formula with its count (as the vocab terms do); a
buffer without a declaration here cannot be written down. Legend: ``dispatch_inventory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Buf:
    """One buffer of a dispatch operator: ``name`` (unique: equality, hashing and order use it alone)
    and ``formula``, its element count in DESIGN §1 symbols."""

    name: str
    formula: str = field(compare=False)


ROUTER_SOFTMAX = Buf("router softmax",
          "N·E (fp32 softmax of the router logits; 2·N·E with the fp32 logits, 3·N·E in its backward)")
ROUTER_WEIGHTS = Buf("router weights", "N·(2k+1) fp32 (top-k values, their sum, the weights)")
SEND_ORDER = Buf("send order", "k·N int64 route indices in send order (×5 while sorting; ×2 with tokens)")
IMPORTED_WEIGHTS = Buf("imported weights", "X·3·H·I (X imported experts)")
OUTPUT = Buf("output", "N·H (the output accumulator; the region output belongs to boundaries in forward, but "
          "LLEP's and standard EP's, made at the operator's end, to dispatch in a composed MoE region, and so "
          "does PipelinedLLEP's destination variant's without checkpointing)")
REGION_SUM = Buf("region output (residual sum)", "N·H (the region's residual add h + out after LLEP's or standard "
          "EP's end, beside their output and saved buffers: checkpoint = none)")
RESIDUE_ROWS = Buf("residue rows",
          "Σ_{j≤i} Q_j·H (reentrant-checkpoint inputs kept to the layer's backward; guarantee: Σ Q ≤ "
          "min(E_p·k·N_max, max(ceil(max(α,λ)·k·N_max) + (E/E_p)(m−1), U)), U = rows of a rank left "
          "with unplaced excess when import slots run out)")
RESIDUE_ROUTE_WEIGHTS = Buf("residue route weights", "Σ_{j≤i} Q_j fp32")
CHUNK_TOKEN_IDS = Buf("chunk token ids", "Σ_{j≤i} C_j int64")
PREFETCH_SEND_ROWS = Buf("prefetch send rows", "C_{i+1}·H (next chunk's rows, gathered and in flight)")
PREFETCH_SEND_WEIGHTS = Buf("prefetch send weights", "C_{i+1} fp32")
CHUNK_INDEX = Buf("chunk index", "Q_i int64")
CHUNK_OUTPUTS = Buf("chunk outputs", "Q_i·H (weighted expert outputs of chunk i)")
EXPERT_BLOCK = Buf("expert block",
          "bytes of one GEMM block of r rows: fwd max(r(H+4I), r(2H+3I))·b, bwd max(r(4H+2I)·b, "
          "r(H+6I)·b, …) (dispatch_inventory)")
COMBINED_ROWS = Buf("combined rows", "C_i·H (combine all-to-all output)")
CHUNK_ROWS = Buf("chunk rows", "Q_i·H")
CHUNK_ROUTE_WEIGHTS = Buf("chunk route weights", "Q_i fp32")
NEXT_CHUNK_ROWS = Buf("next chunk rows", "Q_{i+1}·H")
NEXT_CHUNK_ROUTE_WEIGHTS = Buf("next chunk route weights", "Q_{i+1} fp32")
NEXT_CHUNK_TOKEN_IDS = Buf("next chunk token ids", "C_{i±1} int64 (the prefetched chunk's token ids)")
INPUT_GRADIENT = Buf("input gradient", "N·H (standalone runs; LLEP and standard EP in a composed MoE region: the "
          "dispatcher's input gradient, made at its end; PipelinedLLEP's destination variant without "
          "checkpointing: from its first chunk's backward scatter on)")
IMPORTED_WEIGHT_GRADS = Buf("imported weight grads", "X·3·H·I")
GRAD_CHUNK_OUTPUTS = Buf("grad chunk outputs", "Q_i·H")
GRAD_COMBINED_ROWS = Buf("grad combined rows", "C_i·H")
RECOMPUTED_GATE_UP = Buf("recomputed gate|up", "Q_i·2I")
GRAD_CHUNK_ROWS = Buf("grad chunk rows", "Q_i·H")
GRAD_CHUNK_ROUTE_WEIGHTS = Buf("grad chunk route weights", "Q_i fp32")
GRAD_SENT_ROWS = Buf("grad sent rows", "C_i·H")
RETURNED_EXPERT_GRADS = Buf("returned expert grads", "X_e·3·H·I (exported experts' gradients coming home; LLEP "
          "with a transfer: + n·3·H·I, the own experts' full-size gradient)")
UPSTREAM_GRADIENT = Buf("upstream gradient", "N·H (standalone runs: the dense gradient of the output)")
GRAD_ROUTE_WEIGHTS = Buf("grad route weights",
          "k·N fp32 (source variant: the route-weight gradient, filled chunk by chunk)")
ROUTER_LOGITS_GRAD = Buf("router logits grad", "N·E")
ROUTER_INPUT_GRAD = Buf("router input grad", "N·H")
SENT_ROUTE_WEIGHTS = Buf("sent route weights", "R fp32")
SLOT_MAJOR_ROWS = Buf("slot-major rows", "Q·H (saved)")
SAVED_GATE_UP_SILU_H = Buf("saved gate|up, silu, h", "Q·4I (saved by the grouped MLP)")
PERMUTATION_INDICES = Buf("permutation indices", "Q int64 per permutation (slot-major and back)")
SENT_ROWS = Buf("sent rows", "R·H (R = k·N)")
RECEIVED_ROWS = Buf("received rows", "Q·H")
EXPERT_OUTPUTS = Buf("expert outputs", "Q·H per buffer")
COMBINE_ROWS = Buf("combine rows", "R·H beside the permuted expert outputs Q·H (Q·H + R·H where they are not saved)")
WEIGHTS_CAST = Buf("weights cast", "R (route weights in the activation dtype, saved)")
STACKED_WEIGHT_GRADS = Buf("stacked weight grads", "(n + X)·3·H·I at the grouped MLP's backward, then n·3·H·I "
          "(waiting for the weight transfer; with freed gradients, param.grad)")
ROUTE_WEIGHT_GRAD = Buf("route weight grad", "R")
GRAD_EXPERT_OUTPUTS = Buf("grad expert outputs", "Q·H per buffer")
GRAD_RECEIVED_ROWS = Buf("grad received rows", "Q·H per buffer")
