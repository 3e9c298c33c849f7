"""The four ring passes of Ring-DTP (forward and backward, activations and weights branches).

Helpers of ``planner.runtime.ring_dtp``, whose docstring holds the legend, the collectives, the
bytes per hop and the live buffers. Shape suffixes: ``n`` = ``N_max`` rows of a moving batch
buffer, ``N`` this rank's tokens, ``Vp`` this rank's shard rows, ``VH`` a ``V_max``-row buffer.

Buffer discipline (what ``planner.budget.vocab`` counts): a moving operand is double-buffered
(the one being read and the one being received; the rank's own tensor is sent without a copy and
never reused as a receive buffer), so ``min(2, P-1)`` buffers; the gradient riding on it has two
(accumulating and arriving, the sent one reused as the next receive buffer), ``min(2, P)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from planner.plans.ring import RingPlan
from planner.runtime import ring_dtp_state as S
from planner.runtime import shim

FP32 = torch.float32


@dataclass(frozen=True)
class Cfg:
    """One call's plan and settings (identical on every rank but ``rank``)."""

    plan: RingPlan
    rank: int
    group: object
    ignore_index: int
    reduction: str


# ---------------------------------------------------------------------------------------------
# forward passes: return the final state st_3N of this rank's own tokens
# ---------------------------------------------------------------------------------------------
def forward_activations(c: Cfg, x_NH, t_N, w_VpH):
    """Batches travel; returns this rank's final ``(m, z, y_t)`` (3 × N view)."""
    plan, r, ig = c.plan, c.rank, c.ignore_index
    ring, (start, _), n = S.Ring(plan, r, c.group), plan.shards[r], plan.n_max
    x_nH, t_n = S.padded(x_NH, n), S.padded(t_N, n, ig)
    spare = None                                  # received buffers free for the next hop
    st_in = st_hop = None
    for s in range(plan.P):
        op_hop = None
        if plan.operand_hop(s):
            nxt = spare or (x_NH.new_empty(n, x_NH.shape[1]), t_N.new_empty(n))
            op_hop = ring.hop([x_nH, t_n], list(nxt))
        st_3n = S.new_state(n, x_NH)
        for lo, hi in plan.blocks[r]:
            if hi > lo:
                S.fold_strip(st_3n, x_nH, w_VpH[lo - start:hi - start], t_n, lo, hi, ig)
        if s > 0:                                 # this batch's state so far, from the left
            shim.wait_all(st_hop)
            S.merge_lse(st_3n, st_in[0], st_in[1], st_in[2])
        if plan.P > 1:
            st_in = torch.empty_like(st_3n)
            st_hop = ring.hop([st_3n], [st_in])
        else:
            st_in = st_3n
        if op_hop is not None:
            shim.wait_all(op_hop)
            spare = None if x_nH is x_NH else (x_nH, t_n)
            x_nH, t_n = nxt
    shim.wait_all(st_hop)
    return st_in[:, : x_NH.shape[0]]


def forward_weights(c: Cfg, x_NH, t_N, w_VpH):
    """Shards travel; returns this rank's final ``(m, z, y_t)`` (3 × N)."""
    plan, r, ig = c.plan, c.rank, c.ignore_index
    ring, st_3N = S.Ring(plan, r, c.group), S.new_state(x_NH.shape[0], x_NH)
    w_cur, spare = w_VpH, None
    for s in range(plan.P):
        j = plan.owner(r, s)
        op_hop = None
        if plan.operand_hop(s):
            nxt = spare if spare is not None else w_VpH.new_empty(plan.v_max, w_VpH.shape[1])
            op_hop = ring.hop([w_cur[: plan.shard_rows(j)]], [nxt[: plan.shard_rows(plan.owner(r, s + 1))]])
        a = plan.shards[j][0]
        for lo, hi in plan.blocks[j]:
            if hi > lo:
                S.fold_strip(st_3N, x_NH, w_cur[lo - a:hi - a], t_N, lo, hi, ig)
        if op_hop is not None:
            shim.wait_all(op_hop)
            spare = None if w_cur is w_VpH else w_cur
            w_cur = nxt
    return st_3N


# ---------------------------------------------------------------------------------------------
# backward passes: return (gx_NH fp32, gw_VpH fp32)
# ---------------------------------------------------------------------------------------------
def backward_activations(c: Cfg, x_NH, t_N, w_VpH, ms_3n):
    """Batches travel with their gradient (and their ``N_max``-row state ``ms_3n``,
    ``ring_dtp_state.grad_state``); returns (gx_NH, gw_VpH), fp32."""
    plan, r, ig = c.plan, c.rank, c.ignore_index
    ring, (start, stop), n, H = S.Ring(plan, r, c.group), plan.shards[r], plan.n_max, x_NH.shape[1]
    x_nH, t_n = S.padded(x_NH, n), S.padded(t_N, n, ig)
    gw_VpH = torch.zeros(stop - start, H, dtype=FP32, device=x_NH.device)
    gx_nH = torch.zeros(n, H, dtype=FP32, device=x_NH.device)
    spare = nxt = g_spare = g_hop = gx_in = None
    for s in range(plan.P):
        op_hop = None
        if plan.operand_hop(s):
            nxt = spare or (x_NH.new_empty(n, H), t_N.new_empty(n), torch.empty_like(ms_3n))
            op_hop = ring.hop([x_nH, t_n, ms_3n], list(nxt))
        if s > 0:                                 # the batch's gradient so far arrives from the left
            pending, g_hop = g_hop, None
        else:
            pending = None
        for lo, hi in plan.blocks[r]:
            if hi == lo:
                continue
            w_bH = w_VpH[lo - start:hi - start]
            p_nb = S.grad_strip(x_nH, w_bH, t_n, lo, hi, ms_3n, ig)
            S.accumulate(gw_VpH[lo - start:hi - start], p_nb.t(), x_nH)
            if pending is not None:
                shim.wait_all(pending)
                pending, gx_nH = None, gx_in
            S.accumulate(gx_nH, p_nb, w_bH)
            del p_nb
        if pending is not None:                   # a shard with no rows: pass the gradient on
            shim.wait_all(pending)
            gx_nH = gx_in
        if plan.P > 1:
            gx_in = g_spare if g_spare is not None else torch.empty_like(gx_nH)
            g_hop, g_spare = ring.hop([gx_nH], [gx_in]), gx_nH
        if op_hop is not None:
            shim.wait_all(op_hop)
            spare = None if x_nH is x_NH else (x_nH, t_n, ms_3n)
            x_nH, t_n, ms_3n = nxt
    del x_nH, t_n, ms_3n, spare, nxt
    if plan.P > 1:
        shim.wait_all(g_hop)
        del g_spare
        gx_nH = gx_in
    return gx_nH[: x_NH.shape[0]], gw_VpH


def backward_weights(c: Cfg, x_NH, t_N, w_VpH, ms_3N):
    """Shards travel with their gradient (``ms_3N``: this rank's state, ``grad_state``); returns
    (gx_NH, gw_VpH), fp32."""
    plan, r, ig = c.plan, c.rank, c.ignore_index
    ring, H = S.Ring(plan, r, c.group), x_NH.shape[1]
    gx_NH = torch.zeros(x_NH.shape[0], H, dtype=FP32, device=x_NH.device)
    gw_VH = torch.zeros(plan.v_max, H, dtype=FP32, device=x_NH.device)
    w_cur = w_VpH
    spare = g_spare = g_hop = gw_in = None
    for s in range(plan.P):
        j, jn = plan.owner(r, s), plan.owner(r, s + 1)
        op_hop = None
        if plan.operand_hop(s):
            nxt = spare if spare is not None else w_VpH.new_empty(plan.v_max, H)
            op_hop = ring.hop([w_cur[: plan.shard_rows(j)]], [nxt[: plan.shard_rows(jn)]])
        pending, g_hop = (g_hop, None) if s > 0 else (None, None)
        a = plan.shards[j][0]
        for lo, hi in plan.blocks[j]:
            if hi == lo:
                continue
            w_bH = w_cur[lo - a:hi - a]
            p_nb = S.grad_strip(x_NH, w_bH, t_N, lo, hi, ms_3N, ig)
            S.accumulate(gx_NH, p_nb, w_bH)
            if pending is not None:
                shim.wait_all(pending)
                pending, gw_VH = None, gw_in
            S.accumulate(gw_VH[lo - a:hi - a], p_nb.t(), x_NH)
            del p_nb
        if pending is not None:
            shim.wait_all(pending)
            gw_VH = gw_in
        if plan.P > 1:
            gw_in = g_spare if g_spare is not None else torch.empty_like(gw_VH)
            g_hop = ring.hop([gw_VH[: plan.shard_rows(j)]], [gw_in[: plan.shard_rows(jn)]])
            g_spare = gw_VH
        if op_hop is not None:
            shim.wait_all(op_hop)
            spare = None if w_cur is w_VpH else w_cur
            w_cur = nxt
    del w_cur, spare, ms_3N
    if plan.P > 1:
        shim.wait_all(g_hop)
        del g_spare
        gw_VH = gw_in
    return gx_NH, gw_VH[: plan.shard_rows(r)]
