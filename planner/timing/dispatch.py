"""Time of one MoE layer's expert dispatch: standard EP, LLEP and PipelinedLLEP (DESIGN §4, §7).

Legend: ``N`` tokens per rank, ``k`` top-k, ``E``/``E_p`` experts and expert-parallel degree,
``n = E/E_p`` local experts, ``H``/``I`` hidden and expert widths, ``b`` activation bytes, ``K``
chunks (1 for EP and LLEP), ``c_eff = ceil(N/K)``, ``r`` routes one slot of the binding rank
computes (per chunk for PipelinedLLEP).

**Load.** The ranks of an expert group synchronise in every all-to-all, so the layer runs at the
pace of its slowest rank. ``balanced`` routing: every slot receives ``r = E_p·k·N/E`` routes
(``/K`` per chunk, strided chunks) and LLEP is skipped (max/mean < λ). Skewed and ``worst``
routing: the integer plan of ``planner.plans.dispatch`` on the profile's synthetic routing (the
same code the runtime runs), and the rank whose expert GEMMs take longest binds; sends and
receives are the largest over ranks. ``E_p = 1``: nothing is sent (zero dispatch traffic).

**Compute** is the runtime's (``planner/runtime/expert_mlp.py``): a loop of ``torch.mm`` per slot,
each timed from the GEMM table at its own rows (``flops.expert_fwd``/``expert_bwd``). Per layer:

    EP, LLEP        forward up+down; backward (autograd of ``mlp``) g_down, gh, g_up, gx
    PipelinedLLEP   forward up+down (no grad, inside the reentrant checkpoint), inner recompute
                    up only, backward (``ExpertChunk.backward``) down again + g_down, gh, g_up, gx

so in a step with per-layer checkpointing the up projection runs 3× (forward, outer recompute,
inner recompute) and the down projection 3× (forward, outer recompute, backward's recompute),
against 2× for EP/LLEP. PipelinedLLEP's ``K``-chunk compute is the measured chunk-count curve
applied to the one-chunk compute (``chunk_relative_time``); without that curve (assumed, listed)
each chunk's GEMMs are timed at the chunk's rows. Elementwise passes (permutations, SwiGLU, route
weights, index_add) move ``ELEM_*`` bytes per route (approximate inventories of the runtime,
times ``b``).

**Communication** (``comm=True``; per-rank emulation has none): dispatch all-to-all of
``k·c_eff`` rows of ``H·b`` bytes plus their fp32 route weights, combine all-to-all of the rows back,
and the same two reversed in backward. EP/LLEP run them in series with the compute. PipelinedLLEP
issues chunk ``i+1``'s dispatch while chunk ``i`` computes and the combine after it:

    forward  = d + (K−1)·max(c, d) + c + K·e        backward = K·(e' + c' + d')   (serial)

LLEP's imported experts (``n_imp·3HI·b`` bytes, p2p) travel once per forward and their gradients
once per backward.
"""

from __future__ import annotations

import functools

import numpy as np

from planner.plans import chunking
from planner.plans import dispatch as plans_dispatch
from planner.plans.routing import profile_counts
from planner.timing import curves as C
from planner.timing.comm import collective_s
from planner.timing.compute import elementwise_s, gemm_s
from planner.timing.flops import expert_bwd, expert_fwd
from planner.timing.lookups import Lookups, shared_memo

OPERATORS = ("ep", "llep", "pipelined_llep")


def elem_bytes_per_route(op: str, H: int, I: int, b: int) -> tuple[int, int]:
    """(forward, backward) elementwise bytes per route of ``op`` (approximate inventories):

    - EP/LLEP forward ``(12H + 5I)·b``: send-order gather 2H, slot-major copy 2H, SwiGLU 5I, output
      concatenation 2H, source-order outputs 2H, route weighting 2H, ``index_add`` 2H; backward
      ``(12H + 10I)·b`` (the same permutations reversed, SwiGLU backward 10I).
    - PipelinedLLEP forward ``(6H + 5I)·b``: chunk gather 2H, SwiGLU 5I, weighted scatter 2H,
      ``index_add`` 2H; backward ``(10H + 13I)·b`` (SwiGLU recompute 3I and backward 10I, route-weight
      gradient 2H, output gradients 4H, scatters 4H).
    """
    if op == "pipelined_llep":
        return (6 * H + 5 * I) * b, (10 * H + 13 * I) * b
    return (12 * H + 5 * I) * b, (12 * H + 10 * I) * b


# ------------------------------------------------------------------------------------------------
# loads from the integer plan (skewed routing)
# ------------------------------------------------------------------------------------------------
def _counts(profile: str, N: int, E: int, k: int, E_p: int) -> np.ndarray:
    """``counts_WE`` of the routing profile (``planner.plans.routing.profile_counts``): every rank
    routes its own ``N`` tokens alike, so one row is computed (per ``E_p`` only for ``one_rank``)."""
    row = _counts_row(profile, N, E, k, E_p if profile == "one_rank" else 1)
    return np.broadcast_to(row, (E_p, E))


@functools.lru_cache(maxsize=64)
def _counts_row(profile: str, N: int, E: int, k: int, E_p: int) -> np.ndarray:
    out = profile_counts(profile, N, E, k, E_p)[0].copy()
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=256)
def plan_loads(op: str, N: int, E: int, k: int, E_p: int, K: int, profile: str, knobs: tuple):
    """Per rank: ``rows_WKS`` routes per chunk and slot it computes, ``send_WK``/``recv_WK`` routes
    it sends and receives per chunk, ``imports_W`` experts it imports (from the runtime's plan)."""
    alpha, min_tokens, lam, max_imports = knobs
    counts = _counts(profile, N, E, k, E_p)
    plan = plans_dispatch.plan_layer(counts, top_k=k, operator=op, alpha=alpha, min_tokens=min_tokens,
                                     lam=lam, max_imports=max_imports, num_chunks=K if op == "pipelined_llep" else None)
    ch = plan.chunk_KWWS                                   # [K, src, dst, slot]
    rows = ch.sum(1).transpose(1, 0, 2)                    # [dst, K, slot]
    send = ch.sum((2, 3)).T                                # [src, K]
    recv = ch.sum((1, 3)).T                                # [dst, K]
    return rows, send, recv, plan.num_imports_W()


def _expert_pass_s(lk: Lookups, rows, H: int, I: int, which: str):
    """Seconds of the expert GEMMs of slots with ``rows`` routes (any shape), per element."""
    if which == "fwd":
        gs = expert_fwd(rows, H, I)
    elif which == "up":
        gs = expert_fwd(rows, H, I)[:1]
    elif which == "bwd":
        gs = expert_bwd(rows, H, I)
    else:
        assert which == "bwd_chunk", which
        gs = expert_fwd(rows, H, I)[1:] + expert_bwd(rows, H, I)
    return sum(gemm_s(lk, g.m, g.n, g.k) for g in gs)


def _chunk_factor(lk: Lookups, K):
    """Measured chunk-count curve at ``K`` (NaN + gap outside it), or None when absent."""
    c = lk.curves.chunk_count
    if c is None:
        lk.assume("PipelinedLLEP chunk overhead: no chunk_count curve; each chunk's GEMMs timed at its rows")
        return None
    return lk.call(lambda v: C.chunk_relative_time(lk.curves, v), K)


def expert_compute(lk: Lookups, op: str, rows_per_slot, n_slots, K, H: int, I: int) -> dict:
    """Expert GEMM seconds of one rank whose ``n_slots`` slots each compute ``rows_per_slot``
    routes in the layer, split evenly over ``K`` chunks: ``{fwd, up, bwd}`` (``up``: PipelinedLLEP's
    inner recompute; ``bwd`` includes its down recompute)."""
    rows = np.asarray(rows_per_slot, dtype=float)
    if op != "pipelined_llep":
        return {"fwd": n_slots * _expert_pass_s(lk, rows, H, I, "fwd"), "up": 0.0 * rows,
                "bwd": n_slots * _expert_pass_s(lk, rows, H, I, "bwd")}
    K = np.asarray(K, dtype=float)
    rel = _chunk_factor(lk, K)
    if rel is None:
        per, mult = rows / K, n_slots * K
    else:
        per, mult = rows, n_slots * rel
    return {w: mult * _expert_pass_s(lk, per, H, I, p) for w, p in (("fwd", "fwd"), ("up", "up"), ("bwd", "bwd_chunk"))}


def _plan_compute(lk, op, N, E, k, E_p, K, profile, knobs, H, I):
    """Binding-rank compute (and its traffic) from the plan of one scalar configuration; kept
    across evaluations for the same curves (with the assumptions it used, replayed on a hit)."""
    cache = shared_memo(("dispatch_plan", lk.curves))
    key = (op, N, E, k, E_p, K, profile, knobs, H, I)
    hit = cache.get(key)
    if hit is None:
        notes: list[str] = []
        lk.recorders.append(notes)
        try:
            out = _plan_compute_uncached(lk, op, N, E, k, E_p, K, profile, knobs, H, I)
        finally:
            lk.recorders.pop()
        if all(np.isfinite(v) for v in out.values()):
            cache[key] = (out, notes)
        return out
    out, notes = hit
    for a in notes:
        lk.assume(a)
    return out


def _plan_compute_uncached(lk, op, N, E, k, E_p, K, profile, knobs, H, I):
    rows, send, recv, imports = plan_loads(op, N, E, k, E_p, K, profile, knobs)
    if op == "pipelined_llep" and lk.curves.chunk_count is not None:
        rel = _chunk_factor(lk, K)
        full = rows.sum(1)                                 # [dst, slot]
        parts = {w: rel * _expert_pass_s(lk, full, H, I, p).sum(1)
                 for w, p in (("fwd", "fwd"), ("up", "up"), ("bwd", "bwd_chunk"))}
    elif op == "pipelined_llep":
        _chunk_factor(lk, K)
        parts = {w: _expert_pass_s(lk, rows, H, I, p).sum((1, 2))
                 for w, p in (("fwd", "fwd"), ("up", "up"), ("bwd", "bwd_chunk"))}
    else:
        parts = {w: _expert_pass_s(lk, rows[:, 0], H, I, p).sum(1) for w, p in (("fwd", "fwd"), ("bwd", "bwd"))}
        parts["up"] = np.zeros(rows.shape[0])
    total = parts["fwd"] + parts["up"] + parts["bwd"]
    r = int(np.nanargmax(total)) if np.isfinite(total).any() else 0
    out = {w: float(v[r]) for w, v in parts.items()}
    out.update(routes=float(rows[r].sum()), send=float(send.max()), recv=float(recv.max()),
               imports=float(imports.max()) if len(imports) else 0.0)
    return out


def moe_dispatch_s(lk: Lookups, op: str, N, E: int, k: int, E_p, K, H: int, I: int, b: int, *,
                   profile: str = "balanced", knobs: tuple = (1.0, 1024, 1.3, 4), comm: bool = True) -> dict:
    """One MoE layer's dispatch operator on the binding rank (module docstring).

    Returns arrays: ``fwd`` (forward seconds), ``bwd`` (backward seconds, PipelinedLLEP's inner
    recompute included), ``compute_fwd``/``compute_bwd`` (expert GEMMs), ``elem_fwd``/``elem_bwd``,
    ``comm_fwd``/``comm_bwd`` (exposed all-to-all seconds), ``imports`` (LLEP weight traffic).
    """
    assert op in OPERATORS, op
    N, E_p, K = np.broadcast_arrays(np.asarray(N, dtype=np.int64), np.asarray(E_p, dtype=np.int64),
                                    np.asarray(K if op == "pipelined_llep" else 1, dtype=np.int64))
    shape = N.shape
    N, E_p, K = N.reshape(-1), E_p.reshape(-1), K.reshape(-1)
    n_slots = E // E_p
    if profile == "balanced":
        routes = k * N.astype(float)                       # received = sent = k·N per rank
        cp = expert_compute(lk, op, routes / n_slots, n_slots, K, H, I)
        send = recv = routes
        imports = np.zeros_like(routes)
    else:
        combos, inv = np.unique(np.stack([N, E_p, K], axis=1), axis=0, return_inverse=True)
        inv = np.asarray(inv).reshape(-1)
        per = [_plan_compute(lk, op, int(n), E, k, int(e), int(kk), profile, knobs, H, I) for n, e, kk in combos]
        cp = {w: np.array([r[w] for r in per])[inv] for w in ("fwd", "up", "bwd")}
        routes = np.array([r["routes"] for r in per])[inv]
        send, recv = np.array([r["send"] for r in per])[inv], np.array([r["recv"] for r in per])[inv]
        imports = np.array([r["imports"] for r in per])[inv]
    ef, eb = elem_bytes_per_route(op, H, I, b)
    elem_f, elem_b = elementwise_s(lk, ef * routes), elementwise_s(lk, eb * routes)
    up = np.asarray(cp["up"], dtype=float) * np.ones_like(routes)
    c_f = cp["fwd"] + elem_f
    c_b = up + cp["bwd"] + elem_b
    out = {"compute_fwd": cp["fwd"], "compute_bwd": up + cp["bwd"], "elem_fwd": elem_f, "elem_bwd": elem_b}
    zero = np.zeros_like(routes)
    if not comm or not np.any(E_p > 1):
        out.update(fwd=c_f, bwd=c_b, comm_fwd=zero, comm_bwd=zero, imports=zero)
    else:
        per_chunk = np.maximum(send, recv) / K             # routes through the busiest rank per chunk
        d = collective_s(lk, "all_to_all", E_p, per_chunk * (H * b + 4))
        e = collective_s(lk, "all_to_all", E_p, per_chunk * H * b)
        imp = 2.0 * collective_s(lk, "p2p_ring", E_p, imports * 3 * H * I * b) if np.any(imports > 0) else zero
        if op == "pipelined_llep":      # d + (K−1)·max(c, d) + c + K·e, written as c_f + exposed
            fwd = c_f + d + (K - 1) * np.maximum(0.0, d - c_f / K) + K * e
        else:
            fwd = c_f + d + e
        bwd = c_b + K * (d + e)
        out.update(fwd=fwd + imp / 2, bwd=bwd + imp / 2, comm_fwd=fwd - c_f, comm_bwd=bwd - c_b, imports=imp)
        assert np.all(out["comm_fwd"][E_p == 1] == 0), "E_p = 1 must move no dispatch traffic"
    res = {key: np.asarray(v, dtype=float).reshape(shape) for key, v in out.items()}
    return {key: (float(v) if v.ndim == 0 else v) for key, v in res.items()}


def default_chunks(N, token_budget: int = 4096, max_chunks: int = 10):
    """``K = min(ceil(N/c), K_max)`` (``planner.plans.chunking``)."""
    return chunking.num_chunks(N, token_budget, max_chunks)
