"""Standard dropless all-to-all expert parallelism (the baseline of DESIGN §7), and the plan
handling shared with LLEP and PipelinedLLEP.

Legend:
    x_NH, ids_Nk, weights_Nk   this rank's tokens, expert ids and fp32 route weights
    perm_R, tok_R              flat route indices in send order, and their tokens
    x_RH                       rows in send order (``R = k·N``); ``recv_x_QH`` received (``Q``)
    xs_QH, o_QH                received rows in slot-major order, and the experts' outputs
    out_NH                     ``Σ_j w_nj · expert_{e_nj}(x_n)``

Per layer and pass: one all-gather of ``E`` route counts behind a fixed header of the call's
cross-rank agreement (the plan; ``planner.runtime.dispatch_agreement``: an argument that differs
between ranks, or fails a local check on one, raises on every rank before any data moves; an
operator's first call agrees on ``E`` by a header-only all-gather first), the dispatch all-to-all of
``k·N`` rows of ``H`` and the combine all-to-all of the same size. Forward live buffers, under
autograd as a user writes them with a grouped-GEMM MLP (``GroupedMLP``): the sent rows ``R·H``,
the received ``Q·H``, the slot-major copy ``Q·H`` (saved), ``gu`` ``Q·2I``, ``silu(g)`` and ``h``
``Q·I`` each (saved), the outputs ``Q·H``, the source-order outputs ``Q·H``, the combined ``R·H``
(saved for the route-weight gradient) and the weighted ``R·H`` (saved by ``index_add_``).

The plan (``planner.plans.dispatch``) is computed once per layer per step. Inside
``torch.utils.checkpoint(..., use_reentrant=False, context_fn=op.plan_reuse)`` the recompute
reuses the plan of its own forward instead of all-gathering again (``planner.runtime.plan_reuse``:
keyed by the checkpoint call, so a forward whose backward never ran leaves nothing behind).
"""

from __future__ import annotations

import numpy as np
import torch

from planner.plans import dispatch as plans_dispatch
from planner.plans.chunking import MEMBERSHIPS, STRIDED
from planner.runtime import plan_reuse, shim
from planner.runtime.dispatch_agreement import Call, call_of, check_given_plan, exchange
from planner.runtime.exchange import AllToAll, Depend, Permute, send_order
from planner.runtime.expert_mlp import ExpertShard, GroupedMLP, SlotWeights
from planner.runtime.routing import local_counts
from planner.runtime.validation import check_choice, check_dispatch_knobs, check_dispatch_shard, check_max_imports
from planner.schema.knobs import default as knob_default


class DispatchOp(torch.nn.Module):
    """Base of the three dispatch operators: holds the shard, the group and the knobs."""

    operator = "ep"

    def __init__(self, shard: ExpertShard, num_experts: int, top_k: int, group=None, *,
                 token_budget: int = knob_default("token_budget"), max_chunks: int = knob_default("max_chunks"),
                 alpha: float = knob_default("llep_alpha"), min_tokens: int = knob_default("llep_min_tokens"),
                 lam: float = knob_default("llep_lambda"), max_imports: int = knob_default("max_imports"),
                 membership: str = STRIDED, block_rows: int | None = None,
                 residue: str = plans_dispatch.DESTINATION) -> None:
        super().__init__()
        check_dispatch_knobs(num_experts, top_k, token_budget=token_budget, max_chunks=max_chunks, alpha=alpha,
                             min_tokens=min_tokens, lam=lam, max_imports=max_imports, block_rows=block_rows)
        check_choice("membership", membership, MEMBERSHIPS)
        check_choice("residue", residue, plans_dispatch.RESIDUES)
        max_imports = check_max_imports(max_imports, num_experts, shim.group_size(group),
                                        knob_default("max_imports"))
        if shard is not None:
            check_dispatch_shard(shard, num_experts, shim.group_size(group), shim.group_rank(group), ExpertShard)
        self.shard, self.num_experts, self.top_k, self.group = shard, num_experts, top_k, group
        self.knobs = dict(token_budget=token_budget, max_chunks=max_chunks, alpha=alpha,
                          min_tokens=min_tokens, lam=lam, max_imports=max_imports,
                          membership=membership, block_rows=block_rows, residue=residue)
        self.built_group_size = shim.group_size(group)
        """The group size at construction (the shard was checked against it)."""
        self._reuse: list = []          # entered plan_reuse contexts, innermost last
        self._agreed = False            # the group agreed on num_experts (dispatch_agreement)
        self.plans_computed = 0
        self.last_plan = None

    # ---- plan ---------------------------------------------------------------------------------
    def plan_from_counts(self, counts_WE, num_chunks: int | None = None):
        """The layer's plan from the group's route counts (torch-free; used by traces too)."""
        return plans_dispatch.plan_layer(counts_WE, top_k=self.top_k, operator=self.operator,
                                         num_chunks=num_chunks, **self.knobs)

    def make_plan(self, ids_Nk: torch.Tensor, call: Call | None = None):
        """All-gather the route counts (with ``ceil(N/c)`` for PipelinedLLEP and the cross-rank
        agreement of ``call``, ``dispatch_agreement``) and plan. An instance may replace it with a
        ``make_plan(ids_Nk)`` of its own (profile or emulated counts under the fake process group)."""
        call = call if call is not None else Call([], want_chunks=self._want_chunks(ids_Nk.shape[0]))
        counts_E = call.check("ids_Nk", local_counts, ids_Nk, self.num_experts)
        if shim.group_size(self.group) == 1:
            call.raise_local()
            counts_WE, want = counts_E.cpu().numpy()[None].astype(np.int64), call.want_chunks
        else:
            if counts_E is None:
                counts_E = torch.zeros(self.num_experts, dtype=torch.int64, device=ids_Nk.device)
            counts_WE, want = exchange(call, counts_E, self.num_experts, self.group, self._agreed)
            self._agreed = True
        self.plans_computed += 1
        return self.plan_from_counts(counts_WE, self._chunks(want))

    def _want_chunks(self, n_tokens: int) -> int:
        return 0

    def _chunks(self, want_max: int) -> int | None:
        return None

    def _num_chunks(self, n_tokens: int) -> int | None:
        return None

    def _plan_for(self, ids_Nk, call: Call):
        plan = plan_reuse.reused(self)
        if plan is not None:
            call.raise_local()
            return plan
        if "make_plan" in vars(self):               # replaced: it plans alone, checks stay local
            call.raise_local()
            plan = self.make_plan(ids_Nk)
        else:
            plan = self.make_plan(ids_Nk, call)
        plan_reuse.remember(self, plan)
        return plan

    def plan_reuse(self):
        """``context_fn`` for a non-reentrant checkpoint: the recompute reuses the plans its own
        forward computed (``planner.runtime.plan_reuse``)."""
        return plan_reuse.contexts(self)

    @property
    def rank(self) -> int:
        return shim.group_rank(self.group)

    def forward(self, x_NH: torch.Tensor, ids_Nk: torch.Tensor, weights_Nk: torch.Tensor,
                plan=None) -> torch.Tensor:
        """``out_NH``. ``plan``: a precomputed ``DispatchPlan`` (required in trace mode).

        Raises, on every rank of the group alike when the plan is computed here
        (``dispatch_agreement``): a malformed argument on any rank, or a plan-shaping argument
        (knob, ``H``, dtype, ``E``, which tensors require grad) that differs between ranks."""
        if plan is None and shim.is_tracing():
            raise ValueError("trace mode needs the plan computed outside fake mode (plan=...)")
        if plan is not None:
            check_given_plan(plan, shim.group_size(self.group), self.num_experts, self.top_k)
        call = call_of(self, x_NH, ids_Nk, weights_Nk)
        if plan is not None:
            call.raise_local()
        self.last_plan = self._plan_for(ids_Nk, call) if plan is None else plan
        return self._run(x_NH, ids_Nk, weights_Nk, self.last_plan)

    def _run(self, x_NH, ids_Nk, weights_Nk, plan):
        return run_unchunked(x_NH, ids_Nk, weights_Nk, plan, self.rank, SlotWeights(self.shard),
                             self.group)


class ExpertParallel(DispatchOp):
    """Standard EP: every expert computed by its owner; one dispatch and one combine."""

    operator = "ep"


def slot_major(plan, rank: int, chunk: int = 0):
    """``(rows per slot, perm_Q)``: the received rows grouped by slot (``perm_Q`` indexes the
    received buffer), and the inverse permutation back to source-major order."""
    rows_WS, offs_WS = plan.recv_layout(rank, chunk)
    parts = [np.arange(offs_WS[s, sl], offs_WS[s, sl] + rows_WS[s, sl])
             for sl in range(rows_WS.shape[1]) for s in range(rows_WS.shape[0])]
    perm = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    return rows_WS.sum(0), perm.astype(np.int64), inv.astype(np.int64)


def run_unchunked(x_NH, ids_Nk, weights_Nk, plan, rank, sw: SlotWeights, group,
                  imports=None) -> torch.Tensor:
    """Standard EP / LLEP execution under plain autograd (one chunk; see module docstring).

    ``imports``: ``(w_up_XHJ, w_down_XIH, token)`` from ``ImportWeights`` (LLEP), or ``None``.
    """
    n_tok, hid = x_NH.shape
    dev = x_NH.device
    perm_R = send_order(ids_Nk, plan.source_pieces(rank))
    tok_R = torch.div(perm_R, plan.top_k, rounding_mode="floor")
    send_w_R = weights_Nk.reshape(-1).index_select(0, perm_R)
    send_splits = plan.send_KWW[0, rank, :].tolist()
    recv_splits = plan.send_KWW[0, :, rank].tolist()
    recv_x_QH = AllToAll.apply(x_NH.index_select(0, tok_R), recv_splits, send_splits, group)
    rows_S, perm_Q, inv_Q = slot_major(plan, rank)
    perm_Q, inv_Q = (torch.as_tensor(p).to(dev) for p in (perm_Q, inv_Q))
    xs_QH = Permute.apply(recv_x_QH, perm_Q, inv_Q)
    del recv_x_QH
    w_up_imp, w_down_imp, token = imports if imports is not None else (None, None, None)
    o_QH = GroupedMLP.apply(xs_QH, sw.shard.w_up_nHJ, sw.shard.w_down_nIH, w_up_imp, w_down_imp,
                            rows_S.tolist(), sw)
    del xs_QH
    y_QH = Permute.apply(o_QH, inv_Q, perm_Q)
    del o_QH
    y_RH = AllToAll.apply(y_QH, send_splits, recv_splits, group)
    del y_QH
    if token is not None:
        y_RH = Depend.apply(y_RH, token)
    yw_RH = y_RH * send_w_R.to(y_RH.dtype)[:, None]
    del y_RH
    return x_NH.new_zeros((n_tok, hid)).index_add_(0, tok_R, yw_RH)
