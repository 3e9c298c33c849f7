"""Live set ``boundaries``, composed stack without checkpointing: the sub-steps that outgrow the
interior they follow once ``N·H`` is large (their excess over it, as ``ffn``'s for a checkpointed
region).

Legend (DESIGN §1): ``N`` tokens per rank, ``H`` hidden, ``b`` bytes per scalar, ``E_p`` the expert
parallel degree, ``Θ_exp_layer`` one MoE layer's routed-expert parameters, ``Θ_dense`` one dense FFN
region's parameters (its norm and gate, up and down).

**A MoE region's input-norm backward.** Its backward ends with its input RMSNorm's backward in fp32 (``planner/runtime/
model_layers.py``), after the dispatcher's and the shared experts' backward have freed their
buffers: the saved fp32 input (counted by ``saved_composed`` as the region's own save), five fp32
temporaries over ``N·H`` (PowBackward0 3×, MulBackward0, MeanBackward1) and one ``N·H`` gradient
(b, ToCopyBackward0). By then the norm's saved cast and weighted output (``2·N·H``, b), the
boundary gradients ``saved_composed`` books, the shared experts' input gradient and every dispatch
buffer are freed; the region's own expert gradients stay where the dispatcher made them (freed
lifetime under LLEP and standard EP: ``dispatch_edges.books_own_grads``). The term is that
sub-step's excess over the dispatch backward's moment, as ``ffn``'s for a checkpointed region.

It binds where ``N·H`` outgrows the dispatch's chunked working set: at ``W = 1``, ``N = 32768`` the
H200 measured gpt-oss-20b backward[2] and [4] 572 MiB and Qwen3-30B-A3B 120 MiB above a budget
without it (held-out round 8), and the allocator histories place both peaks here.

**A dense FFN region's residual add.** Its forward peaks at the down projection (the region's
gathered weights, the four saved products, the down output in the place of the region output) or
at the residual add after it: the unsharded weights are freed once the region's unit has run (the
all-gather output, at ``W > 1``, stays until the next unit's all-gather), and the down output and
the sum are both live. The term is the add's excess, ``N·H − Θ_dense``: it binds above
``N = Θ_dense/H`` (DeepSeek-V2-Lite: ``3·I_d``, N ≈ 32k). Held-out round 9 measured DeepSeek-V2-Lite
W = 1 forward[2] at 0.991 (N = 65536) and 0.983 (N = 131072) without it; the allocator history
(``dsv2-W1-S131072-none.json`` forward[2]) holds model_layers.py:109 4 × N·I_d and the N·H down
output, model.py:85's N·H sum and model.py:82's N·H region input, and no block of the region's
unsharded weights.
"""

from __future__ import annotations

import numpy as np

from planner.budget.dispatch_edges import books_own_grads
from planner.budget.terms import Term
from planner.context.ctx import Ctx

TEMPORARIES_FP32 = 5
"""fp32 ``N·H`` temporaries of the RMSNorm backward (PowBackward0 3×, MulBackward0, MeanBackward1)."""

SOURCE = ("the fp32 backward of planner/runtime/model_layers.py RMSNorm; H200 allocator histories of "
          "planner validate without checkpointing (bench/results/memory_snapshot/gptoss-W1-S32768-none.json "
          "and qwen3-W1-S32768-none.json backward[2]): PowBackward0 3 × N·H fp32, MulBackward0 and "
          "MeanBackward1 N·H fp32 each, ffn_region's model_layers.py:72 N·H fp32 (the saved input), one "
          "ToCopyBackward0 N·H (b); no model_layers.py:74 block of the region and no dispatch buffer "
          "(held-out round 8: backward[2] 0.9614 / 0.9891 without the term)")


DENSE_ADD_SOURCE = ("planner/runtime/model.py ffn_region's residual add after the unit's forward; H200 allocator "
                    "history bench/results/memory_snapshot/dsv2-W1-S131072-none.json forward[2]: model_layers.py:109 "
                    "4 × 2736 MiB (N·I_d) + 512 MiB (the down output), model.py:85 512 MiB (the sum), model.py:82 "
                    "512 MiB (the region input), no unsharded weight block (validate_heldout_r9: 0.9827 without it)")


def dense_residual_add(ctx: Ctx) -> list[Term]:
    """The dense FFN region's residual-add sub-step's excess over its down-projection moment."""
    from planner.budget import regions

    if "dense_mlp" not in set(ctx.regions) or not ctx.model.num_dense_layers:
        return []
    N, H, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    v = np.maximum(np.asarray(N, np.int64) * H - regions.dense_region_params(ctx.model), 0)
    return [Term("dense FFN residual add: the down output beside the sum, the unsharded weights freed (excess)",
                 "boundaries", int(v) if np.ndim(v) == 0 else v, b, "max(0, N·H − Θ_dense)", ("forward",),
                 regions=("dense_mlp",), source=DENSE_ADD_SOURCE)]


def moe_norm_backward(ctx: Ctx, dispatch_backward_bytes, grads_nh, shared_grad: bool) -> list[Term]:
    """The MoE norm-backward sub-step's excess (``dispatch_backward_bytes``: the dispatch live set's
    bytes in a MoE region's backward; ``grads_nh``: the boundary gradients, in ``N·H``, booked
    there; ``shared_grad``: the shared experts' input gradient is booked there)."""
    N, H, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    NH = np.asarray(N, np.int64) * H
    own_grads = (ctx.model.num_experts * ctx.model.expert_params() // np.asarray(ctx.expert_parallel) * b
                 if books_own_grads(ctx) else 0)
    sub = NH * (4 * TEMPORARIES_FP32 + b) + own_grads
    freed = NH * b * (2 + grads_nh + (1 if shared_grad else 0)) + np.asarray(dispatch_backward_bytes, np.int64)
    v = np.maximum(sub - freed, 0)
    v = -(-v // b)
    text = (f"max(0, N·H·({4 * TEMPORARIES_FP32} + b) [+ b·Θ_exp_layer/E_p, freed] − N·H·b·(2 + boundary "
            "gradients" + (" + 1 shared-expert gradient" if shared_grad else "") + ") − dispatch backward)/b")
    return [Term("MoE ffn_norm backward sub-step: 5 fp32 temporaries, 1 gradient (excess over the dispatch "
                 "backward)", "boundaries", int(v) if np.ndim(v) == 0 else v, b, text, ("backward",),
                 regions=("moe",), source=SOURCE)]
