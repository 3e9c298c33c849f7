"""Time of one MoE layer's expert dispatch: standard EP, LLEP and PipelinedLLEP (DESIGN §4, §7).

Legend: ``N`` tokens per rank, ``k`` top-k, ``E``/``E_p`` experts and expert-parallel degree,
``n = E/E_p`` local experts, ``H``/``I`` hidden and expert widths, ``b`` activation bytes, ``K``
chunks (1 for EP and LLEP), ``c_eff = ceil(N/K)``, ``r`` routes one slot of the binding rank
computes (per chunk for PipelinedLLEP).

**Load.** The ranks of an expert group synchronise in every all-to-all, so the layer runs at the
pace of its slowest rank. ``balanced`` routing (vectorised): every slot receives
``r = E_p·k·N/E`` routes (``/K`` per chunk, one GEMM block each) and LLEP is skipped (max/mean <
λ). Skewed routing, or a given ``rank``: the integer plan of ``planner.plans.dispatch`` on the
profile's synthetic routing (the same code the runtime runs): every rank's sends, receives, slot
rows per chunk and blocks, imports and exports; the rank whose layer takes longest binds (or the
given one); sends and receives for communication are the largest over ranks. ``E_p = 1``:
nothing is sent (zero dispatch traffic), and the shim's all-to-alls are local copies.

**Compute** is the runtime's kernels, one by one (``planner.timing.dispatch_kernels``): every
expert ``torch.mm`` at its own block rows from the GEMM table (backward GEMMs × their measured
layout ratio, all × the sustained-clock factor), the memory-bound kernels (row gathers and
permutations, SwiGLU, route weights, ``index_add_``/``index_copy_`` combines, casts, zero-fills,
weight-gradient accumulation) by the bytes they move at their kernel class's measured rate, and the
host's measured time per block of each runtime loop and per other launching call (the profile's
``dispatch_kernels`` curve, ``planner.timing.kernel_rates``). Per layer:

    EP, LLEP        forward up+down; backward (autograd of ``mlp``) g_down, gh, g_up, gx
    PipelinedLLEP   forward up+down (no grad, inside the reentrant checkpoint), inner recompute
                    up only, backward (``ExpertChunk.backward``) down again + g_down, gh, g_up, gx

each slot's rows in blocks of ``block_rows`` for PipelinedLLEP (the plan's), so skewed slots run
several GEMMs. PipelinedLLEP's compute is then scaled by the profile's chunk-count curve: its
measured/replayed ratio φ(K) at the curve's shape (``planner.timing.chunk_curve``: what the replay
misses per chunk, measured), listed in ``assumed``. The curve is a single-rank emulation (no
communication to overlap), so it prices the compute only; the overlap rule below is the model's
(``test_timing_dispatch.py`` checks the inventory against the runtime call by call;
``tests/unit/test_heldout_timing.py`` compares it with the benches at shapes the curve did not measure).

**Communication** (``comm=True``; per-rank emulation has none): dispatch all-to-all of
``k·c_eff`` rows of ``H·b`` bytes plus their fp32 route weights, combine all-to-all of the rows back,
and the same two reversed in backward. EP/LLEP run them in series with the compute. PipelinedLLEP
issues chunk ``i+1``'s dispatch while chunk ``i`` computes and the combine after it:

    forward  = d + (K−1)·max(c, d) + c + K·e        backward = K·(e' + c' + d')   (serial)

The source-side variant (``residue = source``) adds the re-dispatch ``K·d`` to backward (serial:
its prefetch may hide part of it; counted whole), and the re-gather kernels of every chunk.

LLEP's imported experts (``n_imp·3HI·b`` bytes, p2p) travel once per forward and their gradients
once per backward.
"""

from __future__ import annotations

import functools

import numpy as np

from planner.plans import dispatch as plans_dispatch
from planner.plans.routing import profile_counts
from planner.timing import chunk_curve
from planner.timing import dispatch_kernels as DK
from planner.timing import kernel_rates as KR
from planner.timing.comm import collective_s
from planner.timing.lookups import Lookups, shared_memo
from planner.plans.llep import LlepKnobs

OPERATORS = ("ep", "llep", "pipelined_llep")
PARTS = ("gemm_f", "mem_f", "host_f", "gemm_b", "mem_b", "host_b")


# ------------------------------------------------------------------------------------------------
# loads from the integer plan
# ------------------------------------------------------------------------------------------------
def _counts(profile: str, N: int, E: int, k: int, E_p: int) -> np.ndarray:
    """``counts_WE`` of the routing profile (``planner.plans.routing.profile_counts``): every rank
    routes its own ``N`` tokens alike, so one row is computed (per ``E_p`` only for ``one_rank``)."""
    if profile == "one_rank":
        return _counts_all(profile, N, E, k, E_p)
    return np.broadcast_to(_counts_all(profile, N, E, k, 1)[0], (E_p, E))


@functools.lru_cache(maxsize=64)
def _counts_all(profile: str, N: int, E: int, k: int, E_p: int) -> np.ndarray:
    out = profile_counts(profile, N, E, k, E_p).copy()
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=256)
def plan_loads(op: str, N: int, E: int, k: int, E_p: int, K: int, profile: str, knobs: LlepKnobs,
               residue: str = plans_dispatch.DESTINATION) -> dict:
    """Per rank (from the runtime's plan): ``send``/``recv`` ``[W, K]`` routes per chunk,
    ``rows``/``cnt`` ``[W, K, B]`` GEMM blocks in the runtime's order (EP/LLEP: slots;
    PipelinedLLEP: per slot, its chunk rows' full blocks of ``block_rows``, then its remainder),
    ``imports``/``exports`` ``[W]``."""
    alpha, min_tokens, lam, max_imports = knobs.alpha, knobs.min_tokens, knobs.lam, knobs.max_imports
    counts = _counts(profile, N, E, k, E_p)
    plan = plans_dispatch.plan_layer(counts, top_k=k, operator=op, alpha=alpha, min_tokens=min_tokens,
                                     lam=lam, max_imports=max_imports, num_chunks=K if op == "pipelined_llep" else None,
                                     residue=residue)
    ch = plan.chunk_KWWS                                   # [K, src, dst, slot]
    slot = ch.sum(1).transpose(1, 0, 2)                    # [dst, K, slot]
    if plan.block_rows:
        br = plan.block_rows
        # per slot, in slot order: its full blocks, then its remainder (the runtime's block order)
        rows = np.stack([np.where(slot >= br, br, 0), slot % br], axis=-1).reshape(*slot.shape[:-1], -1)
        cnt = np.stack([slot // br, (slot % br > 0)], axis=-1).reshape(*slot.shape[:-1], -1)
    else:
        rows, cnt = slot, (slot > 0)
    return {"K": np.full(ch.shape[1], plan.num_chunks, dtype=np.int64), "send": ch.sum((2, 3)).T, "recv": ch.sum((1, 3)).T, "rows": rows, "cnt": cnt.astype(float),
            "imports": plan.num_imports_W(), "exports": plan.num_exports_W()}


def _rank_parts(lk: Lookups, op, L: dict, N, E, k, E_p, K, H, I, b, dense_grad: bool,
                residue: str = plans_dispatch.DESTINATION) -> dict:
    """``PARTS`` per rank ``[W]`` from ``plan_loads``."""
    kw = dict(N=N, copies=E_p == 1, dense_grad=dense_grad)
    if op == "pipelined_llep":
        r = DK.pipelined(lk, H, I, b, k, s=L["send"], q=L["recv"], rows=L["rows"], cnt=L["cnt"], K=L["K"],
                         source=residue == plans_dispatch.SOURCE,
                         X=L["imports"], X_e=L["exports"], chunk_axis=True, **kw)
    else:
        r = DK.unchunked(lk, H, I, b, k, s=L["send"][:, 0], q=L["recv"][:, 0], rows=L["rows"][:, 0],
                         cnt=L["cnt"][:, 0], n_own=E // E_p,
                         X=L["imports"], X_e=L["exports"], **kw)
    return dict(zip(PARTS, (*r["fwd"], *r["bwd"])))


def _plan_parts(lk, op, N, E, k, E_p, K, profile, knobs, H, I, b, rank, dense_grad, residue):
    """The binding (or the given) rank's parts and the traffic, for one scalar configuration; kept
    across evaluations for the same curves (with the assumptions they used, replayed on a hit)."""
    cache = shared_memo(("dispatch_plan", lk.curves))
    key = (op, N, E, k, E_p, K, profile, knobs, H, I, b, rank, dense_grad, residue)
    hit = cache.get(key)
    if hit is not None:
        for a in hit[1]:
            lk.assume(a)
        return hit[0]
    notes: list[str] = []
    lk.recorders.append(notes)
    try:
        L = plan_loads(op, N, E, k, E_p, K, profile, knobs, residue)
        parts = _rank_parts(lk, op, L, N, E, k, E_p, K, H, I, b, dense_grad, residue)
    finally:
        lk.recorders.pop()
    total = sum(np.asarray(v, dtype=float) for v in parts.values())
    r = rank if rank is not None else (int(np.nanargmax(total)) if np.isfinite(total).any() else 0)
    out = {w: float(np.asarray(v).reshape(-1)[r] if np.ndim(v) else v) for w, v in parts.items()}
    out.update(K=float(L["K"].max()), send=float(L["send"].sum(1).max()), recv=float(L["recv"].sum(1).max()),
               imports=float(L["imports"].max(initial=0)))
    if all(np.isfinite(v) for v in out.values()):
        cache[key] = (out, notes)
    return out


def _balanced_parts(lk, op, N, E, k, E_p, K, H, I, b, dense_grad, residue) -> dict:
    """``PARTS`` of balanced routing, vectorised: ``k·N`` routes sent and received, ``n = E/E_p``
    slots of ``k·N·E_p/E`` routes, one GEMM block per slot and chunk."""
    routes = k * N.astype(float)
    n = E // E_p
    kw = dict(N=N, copies=E_p == 1, dense_grad=dense_grad)
    if op == "pipelined_llep":
        lk.assume("PipelinedLLEP, balanced routing: one GEMM block per slot and chunk at the mean share (the "
                  "plan's strided-chunk jitter can add a remainder block of a few rows; a given rank or a skewed "
                  "profile is timed from the plan's exact blocks)")
        r = DK.pipelined(lk, H, I, b, k, s=routes / K, q=routes / K, rows=(routes / n / K)[:, None],
                         cnt=n[:, None].astype(float), K=K, mult=K, source=residue == plans_dispatch.SOURCE, **kw)
    else:
        r = DK.unchunked(lk, H, I, b, k, s=routes, q=routes, rows=(routes / n)[:, None],
                         cnt=n[:, None].astype(float), n_own=n, **kw)
    parts = dict(zip(PARTS, (*r["fwd"], *r["bwd"])))
    parts.update(K=K.astype(float), send=routes, recv=routes, imports=np.zeros_like(routes))
    return parts


def _curve_replay(lk: Lookups, K: int, shape: dict) -> tuple[float, float, float]:
    """The chunk-count curve's measurement replayed (``chunk_curve.ratios``): (operator seconds,
    router-and-loss seconds, the operator's exposed host seconds) of forward + backward at the
    curve's shape, rank 0 of the plan, a dense upstream gradient (the calibration hook's
    ``out.backward(randn_like(out))``)."""
    N, H, I, E, k, E_p = (int(shape[key]) for key in chunk_curve.SHAPE_KEYS)
    r = moe_dispatch_s(lk, "pipelined_llep", N, E, k, E_p, K, H, I, 2, profile="balanced", comm=False, rank=0,
                       dense_grad=True, chunk_costs=False)
    with KR.at_width(lk, H, I, k):
        rl = DK.router_and_loss(lk, N, H, E, k, 2)
    return float(r["fwd"] + r["bwd"]), float(sum(rl["fwd"]) + sum(rl["bwd"])), float(r["host_fwd"] + r["host_bwd"])


def _curve_fill_s(lk: Lookups, nbytes: float, shape: dict) -> float:
    """Seconds of the chunk-count curve's filled all-to-all outputs (``ChunkCurve.fill_bytes``: read
    and write) at the ``copy`` class rate of the curve's width."""
    H, I, k = (int(shape[key]) for key in ("hidden_size", "expert_ffn", "top_k"))
    with KR.at_width(lk, H, I, k):
        return float(KR.memory_s(lk, {"copy": nbytes}))


def moe_dispatch_s(lk: Lookups, op: str, N, E: int, k: int, E_p, K, H: int, I: int, b: int, *,
                   profile: str = "balanced", knobs: LlepKnobs = LlepKnobs(), comm: bool = True,
                   rank: int | None = None, dense_grad: bool = True,
                   residue: str = plans_dispatch.DESTINATION, chunk_costs: bool = True) -> dict:
    """One MoE layer's dispatch operator on the binding rank (module docstring).

    ``rank``: time that rank of the plan instead of the slowest (per-rank emulation).
    ``dense_grad``: the output's gradient is a dense ``N×H`` tensor (False: a broadcast scalar,
    as under ``out.sum()``, whose reads come from cache).
    Returns arrays: ``fwd``/``bwd`` seconds (PipelinedLLEP's inner recompute in ``bwd``),
    ``compute_fwd``/``compute_bwd`` (expert GEMMs), ``elem_fwd``/``elem_bwd`` (memory-bound
    kernels + host launch time not hidden behind the GPU), ``host_fwd``/``host_bwd`` (that
    exposed launch time alone), ``comm_fwd``/``comm_bwd`` (exposed all-to-all seconds),
    ``imports`` (LLEP weight traffic).
    ``residue``: PipelinedLLEP's variant; ``source`` re-dispatches every chunk in backward (one
    more dispatch all-to-all per chunk, and the re-gather kernels) and may run ``K' >= K`` chunks
    where the LLEP plan leaves unplaced excess (the plan's ``K'`` is used).
    ``chunk_costs``: PipelinedLLEP's compute × the chunk-count curve's ratio φ(K)
    (``planner.timing.chunk_curve``); False: the replay alone.
    """
    assert op in OPERATORS, op
    with KR.at_width(lk, H, I, k):
        return _moe_dispatch_s(lk, op, N, E, k, E_p, K, H, I, b, profile=profile, knobs=knobs, comm=comm, rank=rank,
                               dense_grad=dense_grad, residue=residue, chunk_costs=chunk_costs)


def _moe_dispatch_s(lk: Lookups, op: str, N, E: int, k: int, E_p, K, H: int, I: int, b: int, *, profile: str,
                    knobs: tuple, comm: bool, rank: int | None, dense_grad: bool, residue: str,
                    chunk_costs: bool) -> dict:
    """``moe_dispatch_s`` inside its ``kernel_rates.at_width`` block."""
    N, E_p, K = np.broadcast_arrays(np.asarray(N, dtype=np.int64), np.asarray(E_p, dtype=np.int64),
                                    np.asarray(K if op == "pipelined_llep" else 1, dtype=np.int64))
    shape = N.shape
    N, E_p, K = N.reshape(-1), E_p.reshape(-1), K.reshape(-1)
    if profile == "balanced" and rank is None:
        cp = _balanced_parts(lk, op, N, E, k, E_p, K, H, I, b, dense_grad, residue)
    else:
        combos, inv = np.unique(np.stack([N, E_p, K], axis=1), axis=0, return_inverse=True)
        inv = np.asarray(inv).reshape(-1)
        per = [_plan_parts(lk, op, int(n), E, k, int(e), int(kk), profile, knobs, H, I, b, rank, dense_grad,
                           residue)
               for n, e, kk in combos]
        cp = {w: np.array([r[w] for r in per])[inv] for w in per[0]}
    if op == "pipelined_llep" and chunk_costs:
        phi = chunk_curve.factor(lk, np.asarray(cp.get("K", K), dtype=float) * np.ones(N.shape),
                                 lambda kk, shape: _curve_replay(lk, kk, shape),
                                 lambda nbytes, shape: _curve_fill_s(lk, nbytes, shape))
        cp = {w: (v * phi if w in PARTS else v) for w, v in cp.items()}
    one = np.ones(N.shape)
    c_f = (cp["gemm_f"] + cp["mem_f"] + cp["host_f"]) * one
    c_b = (cp["gemm_b"] + cp["mem_b"] + cp["host_b"]) * one
    out = {"compute_fwd": cp["gemm_f"] * one, "compute_bwd": cp["gemm_b"] * one,
           "elem_fwd": (cp["mem_f"] + cp["host_f"]) * one, "elem_bwd": (cp["mem_b"] + cp["host_b"]) * one,
           "host_fwd": cp["host_f"] * one, "host_bwd": cp["host_b"] * one}
    zero = np.zeros(N.shape)
    if not comm or not np.any(E_p > 1):
        out.update(fwd=c_f, bwd=c_b, comm_fwd=zero, comm_bwd=zero, imports=zero)
    else:
        send, recv, imports = cp["send"] * one, cp["recv"] * one, cp["imports"] * one
        K = np.asarray(cp.get("K", K), dtype=float) * one   # the plan's K' (source variant) where planned
        per_chunk = np.maximum(send, recv) / K             # routes through the busiest rank per chunk
        d = collective_s(lk, "all_to_all", E_p, per_chunk * (H * b + 4))
        e = collective_s(lk, "all_to_all", E_p, per_chunk * H * b)
        imp = 2.0 * collective_s(lk, "p2p_ring", E_p, imports * 3 * H * I * b) if np.any(imports > 0) else zero
        if op == "pipelined_llep":      # d + (K−1)·max(c, d) + c + K·e, written as c_f + exposed
            fwd = c_f + d + (K - 1) * np.maximum(0.0, d - c_f / K) + K * e
        else:
            fwd = c_f + d + e
        bwd = c_b + K * (d + e)
        if op == "pipelined_llep" and residue == plans_dispatch.SOURCE:
            bwd = bwd + K * d                              # the re-dispatch of every chunk
        local = E_p == 1
        assert all(np.all(np.broadcast_to(x, local.shape)[local] == 0) for x in (d, e, imp)), \
            "E_p = 1 must move no dispatch traffic"
        # exposed communication; exactly 0 at E_p = 1 even where a compute curve is missing (NaN)
        out.update(fwd=fwd + imp / 2, bwd=bwd + imp / 2, comm_fwd=np.where(local, 0.0, fwd - c_f),
                   comm_bwd=np.where(local, 0.0, bwd - c_b), imports=imp)
    res = {key: np.asarray(v, dtype=float).reshape(shape) for key, v in out.items()}
    return {key: (float(v) if v.ndim == 0 else v) for key, v in res.items()}
