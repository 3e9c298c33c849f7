"""LLEP: least-loaded expert parallelism (DESIGN §7; LLEP, arXiv 2601.17111), one chunk.

Legend: as ``planner.runtime.expert_parallel``; ``w_up_XHJ``/``w_down_XIH`` are the ``X`` foreign
experts this rank imports (``X <= n_import_max``).

The plan (``planner.plans.llep.assign``) caps every rank at ``α·(total routes)/E_p`` and moves the
excess of hot experts, with their weights, to the least-loaded ranks. Per layer and pass:

- one all-gather of the ``E`` route counts and the call's agreement header (once per step: the
  recompute reuses the plan);
- the weight transfer: each exported expert's ``3·H·I`` weights point-to-point to its importer
  (``batch_isend_irecv``); in backward the importer returns the expert's gradient to its owner,
  exactly once per layer (``ImportWeights``);
- the dispatch and combine all-to-alls of ``k·N`` rows each, as standard EP.

Live buffers: standard EP's (the whole routed batch at once, see ``expert_parallel``), with the
received rows capped by the plan, plus the imported weights ``X·3HI`` (and, in backward, their
gradients and the full-size gradient returned to the owner, as autograd produces it).
"""

from __future__ import annotations

import torch

from planner.runtime.exchange import ImportWeights, transfer_lists
from planner.runtime.expert_mlp import SlotWeights
from planner.runtime.expert_parallel import DispatchOp, run_unchunked


def import_weights(plan, rank: int, sw: SlotWeights, group, *, inplace: bool):
    """``(w_up_XHJ, w_down_XIH, token)`` for ``rank`` under ``plan``, or ``None`` when nothing moves."""
    if not plan.assignment.active:
        return None
    exports, imports = transfer_lists(plan, rank)
    if not exports and not imports:
        return None
    shard = sw.shard
    return ImportWeights.apply(shard.w_up_nHJ, shard.w_down_nIH, exports, imports,
                               len(plan.assignment.imports[rank]), group, sw, inplace)


class LLEP(DispatchOp):
    """Least-loaded EP holding the whole routed batch at once."""

    operator = "llep"

    def _run(self, x_NH, ids_Nk, weights_Nk, plan) -> torch.Tensor:
        sw = SlotWeights(self.shard)
        imports = import_weights(plan, self.rank, sw, self.group, inplace=False)
        return run_unchunked(x_NH, ids_Nk, weights_Nk, plan, self.rank, sw, self.group, imports)
