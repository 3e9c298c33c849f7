"""Gated expert MLPs: the stacked expert weights of one rank, and the two ways to run them (§7).

Legend:
    n, X        experts this rank owns, experts it imports (LLEP)
    H, I, J     hidden width, expert FFN width, ``J = 2I`` (gate | up)
    w_up_nHJ    stacked gate|up weights ``H → 2I``; ``w_down_nIH`` stacked down weights ``I → H``
    x_rH        the routes of one expert (``r`` rows); ``gu_rJ`` gate|up, ``h_rI = silu(g)·u``
    o_rH        the expert output ``h·w_down``; ``y_rH = o·w`` with the route weight ``w``

``mlp`` is one expert's forward. ``GroupedMLP`` runs every expert slot of a rank as one autograd
node, the way a grouped-GEMM op does (standard EP and LLEP): it saves the slot-major input, the
gate|up output, ``silu(g)`` and ``h`` (what autograd saves for ``mlp``), and its backward repeats
autograd's arithmetic for ``mlp`` operation for operation, returning stacked weight gradients.
PipelinedLLEP's per-chunk node is ``planner.runtime.expert_chunk.ExpertChunk``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


class ExpertShard(torch.nn.Module):
    """The ``n`` routed experts one rank owns, stacked (gate|up ``[n,H,2I]``, down ``[n,I,H]``)."""

    def __init__(self, num_local: int, hidden_size: int, expert_ffn: int, *, dtype=torch.bfloat16,
                 device=None, first_expert: int | None = None) -> None:
        from planner.runtime.validation import (_int_at_least, check_alloc, check_positive_ints, checked_device,
                                                floating_dtype)

        check_positive_ints(num_local=num_local, hidden_size=hidden_size, expert_ffn=expert_ffn)
        _int_at_least("first_expert", first_expert, 0, allow_none=True)
        dtype = floating_dtype("dtype", dtype)
        device = checked_device("device", device, allow_none=True)
        check_alloc(f"num_local ({num_local}), hidden_size ({hidden_size}) and expert_ffn ({expert_ffn})",
                    3 * num_local * hidden_size * expert_ffn, dtype, device)
        super().__init__()
        self.first_expert = 0 if first_expert is None else first_expert
        """Global id of the first expert held: the shard holds ``first_expert … first_expert + n − 1``.
        A dispatch operator places expert ``e`` on rank ``e // n`` of its group, so it checks a given
        value against ``rank · n`` and sets it when none was given; ``load_full_state`` copies these
        rows out of a full state dict."""
        self.first_expert_given = first_expert is not None
        self.w_up_nHJ = torch.nn.Parameter(
            torch.empty(num_local, hidden_size, 2 * expert_ffn, dtype=dtype, device=device))
        self.w_down_nIH = torch.nn.Parameter(
            torch.empty(num_local, expert_ffn, hidden_size, dtype=dtype, device=device))
        with torch.no_grad():
            torch.nn.init.normal_(self.w_up_nHJ, std=hidden_size ** -0.5)
            torch.nn.init.normal_(self.w_down_nIH, std=expert_ffn ** -0.5)

    @property
    def num_local(self) -> int:
        return self.w_up_nHJ.shape[0]

    @property
    def expert_ffn(self) -> int:
        return self.w_down_nIH.shape[1]

    def ensure_grads(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The stacked gradient tensors, allocated as zeros on first use in the dtype torch
        accumulates them in (``grad_dtype``); ``None`` for a frozen weight (``requires_grad=False``),
        whose ``.grad`` stays ``None``, as autograd leaves it."""
        for p in (self.w_up_nHJ, self.w_down_nIH):
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p, dtype=grad_dtype(p))
        return tuple(p.grad if p.requires_grad else None for p in (self.w_up_nHJ, self.w_down_nIH))


def grad_dtype(p: torch.Tensor) -> torch.dtype:
    """The dtype ``p``'s gradient accumulates in: ``p.grad_dtype`` where torch has it and it is set
    (torch >= 2.10), else ``p.dtype``."""
    gdt = getattr(p, "grad_dtype", None)
    return gdt if gdt is not None else p.dtype


def mlp(x_rH: torch.Tensor, w_up_HJ: torch.Tensor, w_down_IH: torch.Tensor) -> torch.Tensor:
    """``o = (silu(x·Wg) ⊙ (x·Wu))·Wd`` for one expert."""
    i = w_down_IH.shape[0]
    gu_rJ = torch.mm(x_rH, w_up_HJ)
    h_rI = F.silu(gu_rJ[:, :i]) * gu_rJ[:, i:]
    return torch.mm(h_rI, w_down_IH)


def mlp_backward(x_rH, gu_rJ, act_rI, h_rI, go_rH, w_up, w_down, g_up, g_down):
    """Autograd's arithmetic for ``mlp``'s backward: adds ``dW`` into ``g_up``/``g_down`` and
    returns ``dx``. ``act_rI``, ``h_rI``, ``go_rH`` are lists of one tensor, emptied as soon as
    they are no longer needed (so the caller's references do not keep them alive).
    """
    i = w_down.shape[0]
    g_rI, u_rI = gu_rJ[:, :i], gu_rJ[:, i:]
    if g_down is not None:                      # None: frozen (PipelinedLLEP skips its gradient)
        g_down.add_(torch.mm(h_rI[0].t(), go_rH[0]))
    gh_rI = torch.mm(go_rH[0], w_down.t())
    h_rI.clear()
    go_rH.clear()
    gg_rI = torch.ops.aten.silu_backward(gh_rI * u_rI, g_rI)
    ggu_rJ = torch.cat([gg_rI, gh_rI * act_rI[0]], 1)
    del gg_rI, gh_rI
    act_rI.clear()
    if g_up is not None:
        g_up.add_(torch.mm(x_rH.t(), ggu_rJ))
    return torch.mm(ggu_rJ, w_up.t())


@dataclass
class SlotWeights:
    """The weights of every slot of a rank, and where their gradients accumulate."""

    shard: ExpertShard
    imp_grads: list = field(default_factory=list)
    """``[g_up_XHJ, g_down_XIH]`` for imported experts (PipelinedLLEP, allocated on first use)."""

    def up(self, slot: int, w_up_imp: torch.Tensor) -> torch.Tensor:
        n = self.shard.num_local
        return self.shard.w_up_nHJ[slot] if slot < n else w_up_imp[slot - n]

    def down(self, slot: int, w_down_imp: torch.Tensor) -> torch.Tensor:
        n = self.shard.num_local
        return self.shard.w_down_nIH[slot] if slot < n else w_down_imp[slot - n]

    def grads(self, slot: int, w_up_imp, w_down_imp):
        """In-place gradient views of ``slot`` (own: ``param.grad``; imported: the buffer, in the
        owner's gradient dtype); ``None`` for a frozen weight."""
        n = self.shard.num_local
        own = self.shard.ensure_grads()
        if slot < n:
            return tuple(g[slot] if g is not None else None for g in own)
        if not self.imp_grads:
            self.imp_grads = [torch.zeros_like(w, dtype=g.dtype) if g is not None else None
                              for w, g in zip((w_up_imp, w_down_imp), own)]
        return tuple(g[slot - n] if g is not None else None for g in self.imp_grads)


class GroupedMLP(torch.autograd.Function):
    """Every slot's experts on slot-major rows ``xs_QH`` (``rows`` per slot): ``o_QH``.

    Saves ``xs_QH``, ``gu_QJ``, ``act_QI``, ``h_QI``. Backward returns ``dxs`` and stacked
    gradients of the own (``[n,H,2I]``, ``[n,I,H]``) and imported weights.
    """

    @staticmethod
    def forward(ctx, xs_QH, w_up, w_down, w_up_imp, w_down_imp, rows, sw: SlotWeights):
        q, i = xs_QH.shape[0], w_down.shape[1]
        gu_QJ = xs_QH.new_empty(q, 2 * i)
        act_QI = xs_QH.new_empty(q, i)
        h_QI = xs_QH.new_empty(q, i)
        o_QH = xs_QH.new_empty(xs_QH.shape)
        at = 0
        for slot, r in enumerate(rows):
            if r:
                sl = slice(at, at + r)
                torch.mm(xs_QH[sl], sw.up(slot, w_up_imp), out=gu_QJ[sl])
                torch.ops.aten.silu.out(gu_QJ[sl, :i], out=act_QI[sl])
                torch.mul(act_QI[sl], gu_QJ[sl, i:], out=h_QI[sl])
                torch.mm(h_QI[sl], sw.down(slot, w_down_imp), out=o_QH[sl])
            at += r
        ctx.rows, ctx.sw = rows, sw
        ctx.save_for_backward(xs_QH, gu_QJ, act_QI, h_QI, w_up_imp, w_down_imp)
        return o_QH

    @staticmethod
    def backward(ctx, go_QH):
        xs_QH, gu_QJ, act_QI, h_QI, w_up_imp, w_down_imp = ctx.saved_tensors
        sw: SlotWeights = ctx.sw
        n = sw.shard.num_local
        g_up, g_down = torch.zeros_like(sw.shard.w_up_nHJ), torch.zeros_like(sw.shard.w_down_nIH)
        gi_up = torch.zeros_like(w_up_imp) if w_up_imp is not None else None
        gi_down = torch.zeros_like(w_down_imp) if w_down_imp is not None else None
        gxs_QH = torch.empty_like(xs_QH)
        at = 0
        for slot, r in enumerate(ctx.rows):
            if r:
                sl = slice(at, at + r)
                gu_, gd_ = (g_up[slot], g_down[slot]) if slot < n else (gi_up[slot - n], gi_down[slot - n])
                gxs_QH[sl] = mlp_backward(xs_QH[sl], gu_QJ[sl], [act_QI[sl]], [h_QI[sl]], [go_QH[sl]],
                                          sw.up(slot, w_up_imp), sw.down(slot, w_down_imp), gu_, gd_)
            at += r
        return gxs_QH, g_up, g_down, gi_up, gi_down, None, None
