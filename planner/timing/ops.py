"""Per-operator time functions: the vocabulary heads, the dispatch operators and the optimizer
steps, as the operator benchmarks run them and as the step model uses them (DESIGN §4, §7).

Two layers: ``*_s(lk, ...)`` work on a ``compute.Lookups`` and candidate arrays and return the
parts the step model needs (it calls exactly these); the public ``*_time(..., cluster)`` wrap
them for one shape, raising ``ProfileGap`` outside a measured curve. The public functions model
the benches' **per-rank emulation** (the operator's code on one GPU under the fake process group):
no communication time unless ``comm=True``.

Legend (DESIGN §1): ``N`` tokens, ``H`` hidden, ``V`` vocabulary, ``P`` vocabulary group, ``B_v``
blocks per shard, ``V_max = ceil(V/P)``, ``V_b = ceil(V_max/B_v)``, ``b`` input bytes (fp32 heads in
the benches: TF32 off, the ``gemm_fp32`` table).

**Dense head** ``cross_entropy(x @ w.T, t)`` over ``c`` columns: forward GEMM ``(N, c, H)``,
backward ``(N, H, c)`` and ``(c, H, N)`` (``6·N·c·H`` FLOPs), plus ``DENSE_FWD/BWD_BYTES`` per logit of
elementwise traffic. **Ring-DTP**: rank 0 computes ``P·V_max`` (activations branch, ``N ≤ V_max``) or
``V`` (weights branch) logit columns per pass in strips of ``V_b``: forward one GEMM ``(N, V_b, H)``
per strip; backward the strip again plus ``gx`` ``(N, H, V_b)`` and ``gw`` ``(V_b, H, N)``: ``8·N·H·V``
FLOPs against the dense head's ``6·N·H·V``. With ``comm=True`` every ring step runs its strips
beside the next hop: a step takes ``max(compute, hop)``, the hop carrying the operand and the
riding state/gradient (``RingPlan.hop_bytes``), and the accumulator's last hop home is exposed.
**Vocab-parallel** (Megatron): the group's ``N·P`` tokens all-gathered, GEMMs over ``V_max``
columns, the input gradient all-reduced (a reduce-scatter plus an all-gather).
"""

from __future__ import annotations

import numpy as np

from planner.context import derive
from planner.plans.routing import parse_profile
from planner.plans.ring import ring_hop_bytes
from planner.timing.comm import collective_s, ranks_per_node
from planner.timing.compute import Lookups, elementwise_s, gemm_s
from planner.timing.dispatch import moe_dispatch_s
from planner.timing.dispatch_kernels import router_and_loss
from planner.timing.kernel_rates import at_width
from planner.timing.offload import cpu_offload_adamw_s, gpu_adamw_s, stream_adamw_s
from planner.units import DTYPE_BYTES, ceil_div
from planner.plans.llep import LlepKnobs
from planner.schema.knobs import default as knob_default


def _low(b: int) -> int:
    return int(b < 4)


def dense_fwd_bytes(b: int) -> int:
    """Elementwise bytes per logit of the dense head's forward: log-softmax reads its input three
    times and writes once (16 B), after the upcast of a low-precision product (``b + 4``)."""
    return 16 + _low(b) * (b + 4)


def dense_bwd_bytes(b: int) -> int:
    """Backward: the zeroed NLL gradient (4), log-softmax backward (reads 3 × 4, writes 4), the
    downcast of the logits' gradient (``4 + b``)."""
    return 20 + _low(b) * (4 + b)


def ring_fwd_bytes(b: int) -> int:
    """Per strip element, forward (``ring_dtp_state.fold_strip``): max (4), ``sub_`` and ``exp_``
    (16), sum (4), after the upcast (``b + 4``)."""
    return 24 + _low(b) * (b + 4)


def ring_bwd_bytes(b: int) -> int:
    """Per strip element, backward (``grad_strip``): upcast, ``sub_``, ``exp_``, ``mul_`` (24), downcast."""
    return 24 + _low(b) * (2 * b + 8)


def _dtype(b: int) -> str:
    return "fp32" if b == 4 else "bf16"


def _head_gemms_s(lk: Lookups, N, cols, H: int, b: int):
    dt = _dtype(b)
    fwd = gemm_s(lk, N, cols, H, dtype=dt)
    bwd = gemm_s(lk, N, H, cols, dtype=dt) + gemm_s(lk, cols, H, N, dtype=dt)
    return fwd, bwd


def dense_head_s(lk: Lookups, N, H: int, V: int, b: int, *, cols=None) -> dict:
    """``cross_entropy(x @ w.T, t)`` over ``cols`` (default ``V``) columns: ``{fwd, bwd, gemm_fwd,
    gemm_bwd}`` seconds (no communication)."""
    cols = V if cols is None else cols
    g_f, g_b = _head_gemms_s(lk, N, cols, H, b)
    logits = np.asarray(N, dtype=float) * cols
    e_f, e_b = elementwise_s(lk, logits * dense_fwd_bytes(b)), elementwise_s(lk, logits * dense_bwd_bytes(b))
    return {"fwd": g_f + e_f, "bwd": g_b + e_b, "gemm_fwd": g_f, "gemm_bwd": g_b}


def ring_dtp_s(lk: Lookups, N, H: int, V: int, P, B_v, b: int, *, comm: bool = False) -> dict:
    """Ring-DTP on rank 0 of its group (module docstring): ``{fwd, bwd, gemm_fwd, gemm_bwd,
    hops_fwd, hops_bwd}`` (``hops_*``: exposed ring seconds; 0 without ``comm``)."""
    N, P, B_v = (np.asarray(x, dtype=np.int64) for x in (N, P, B_v))
    V_max = ceil_div(V, P)
    V_b = ceil_div(V_max, B_v)
    act = N <= V_max
    cols = np.where(act, P * V_max, V).astype(float)        # logit columns rank 0 computes per pass
    strips = cols / V_b
    dt = _dtype(b)
    g_f = gemm_s(lk, N, V_b, H, dtype=dt)
    g_b = g_f + gemm_s(lk, N, H, V_b, dtype=dt) + gemm_s(lk, V_b, H, N, dtype=dt)
    elems = np.asarray(N, dtype=float) * V_b
    c_f = strips * (g_f + elementwise_s(lk, elems * ring_fwd_bytes(b)))
    c_b = strips * (g_b + elementwise_s(lk, elems * ring_bwd_bytes(b)))
    end = elementwise_s(lk, (np.asarray(N, dtype=float) + V_max) * H * (4 + _low(b) * (4 + b)))
    zero = np.zeros(np.broadcast(N, P, B_v).shape)
    out = {"gemm_fwd": strips * g_f, "gemm_bwd": strips * g_b, "hops_fwd": zero, "hops_bwd": zero}
    if comm and np.any(P > 1):
        hb = ring_hop_bytes(act, N, V_max, H, b)
        op_f, st_f, op_b, gr_b = hb["fwd_operand"], hb["fwd_state"], hb["bwd_operand"], hb["bwd_grad"]
        step_f, step_b = c_f / P, c_b / P
        hop_f, last_f = collective_s(lk, "p2p_ring", P, op_f + st_f), collective_s(lk, "p2p_ring", P, st_f)
        hop_b, last_b = collective_s(lk, "p2p_ring", P, op_b + gr_b), collective_s(lk, "p2p_ring", P, gr_b)
        out["hops_fwd"] = np.where(P > 1, (P - 1) * np.maximum(0.0, hop_f - step_f) + last_f, 0.0)
        out["hops_bwd"] = np.where(P > 1, (P - 1) * np.maximum(0.0, hop_b - step_b) + last_b, 0.0)
    out["fwd"] = c_f + out["hops_fwd"]
    out["bwd"] = c_b + end + out["hops_bwd"]
    return out


def vocab_parallel_s(lk: Lookups, N, H: int, V: int, P, b: int, *, comm: bool = True) -> dict:
    """Megatron vocab-parallel CE in the composed stack (module docstring): ``{fwd, bwd, gemm_fwd,
    gemm_bwd, comm_fwd, comm_bwd}``."""
    P = np.asarray(P, dtype=np.int64)
    n = np.asarray(N, dtype=float) * P
    cols = ceil_div(V, P)
    g_f, g_b = _head_gemms_s(lk, n, cols, H, b)
    logits = n * cols
    e_f = elementwise_s(lk, logits * (32 + _low(b) * (b + 4)))
    e_b = elementwise_s(lk, logits * (8 + _low(b) * (4 + b)))
    c_f = c_b = 0.0 * n
    if comm:
        c_f = collective_s(lk, "all_gather", P, n * H * b)
        c_b = collective_s(lk, "reduce_scatter", P, n * H * 4) + collective_s(lk, "all_gather", P, n * H * 4)
    return {"fwd": g_f + e_f + c_f, "bwd": g_b + e_b + c_b, "gemm_fwd": g_f, "gemm_bwd": g_b,
            "comm_fwd": c_f, "comm_bwd": c_b}


# ------------------------------------------------------------------------------------------------
# public: one shape, per-rank emulation, ProfileGap outside the curves
# ------------------------------------------------------------------------------------------------
def _lk(cluster) -> Lookups:
    return Lookups(cluster, strict=True)


def dense_head_time(N: int, H: int, V: int, dtype: str, cluster) -> tuple[float, float]:
    """(forward, forward + backward) seconds of the dense head on one GPU."""
    r = dense_head_s(_lk(cluster), N, H, V, DTYPE_BYTES[dtype])
    return float(r["fwd"]), float(r["fwd"] + r["bwd"])


def ring_dtp_time(N: int, H: int, V: int, P: int, B_v: int, dtype: str, cluster, *,
                  comm: bool = False) -> tuple[float, float]:
    """(forward, forward + backward) seconds of Ring-DTP on rank 0 (per-rank emulation unless
    ``comm``)."""
    r = ring_dtp_s(_lk(cluster), N, H, V, P, B_v, DTYPE_BYTES[dtype], comm=comm)
    return float(r["fwd"]), float(r["fwd"] + r["bwd"])


def dispatch_time(op: str, N: int, H: int, I: int, E: int, k: int, E_p: int, c: int, routing: str,
                  cluster, *, max_chunks: int = knob_default("max_chunks"), dtype: str = knob_default("dtype"), knobs: LlepKnobs = LlepKnobs(),
                  comm: bool = False, rank: int | None = None, dense_grad: bool = False) -> tuple[float, float]:
    """(forward, forward + backward) seconds of one MoE layer's dispatch operator ``op`` as
    ``bench/dispatch.py`` runs it (``dispatch_trace.build_layer``: the router on the profile's ids,
    the operator, ``out.sum()`` and its backward; no outer checkpoint), on ``rank`` of the plan (the
    slowest when None). Per-rank emulation: compute only, unless ``comm``. ``routing``:
    ``balanced``, ``R/H``, ``one_expert`` or ``one_rank``. ``dense_grad``: a dense upstream gradient
    instead of ``out.sum()``'s (the chunk-count calibration hook's ``out.backward(randn_like(out))``)."""
    parse_profile(routing)
    K = int(derive.chunk_symbols(N, c, max_chunks)[0]) if op == "pipelined_llep" else 1
    lk = _lk(cluster)
    b = DTYPE_BYTES[dtype]
    r = moe_dispatch_s(lk, op, N, E, k, E_p, K, H, I, b, profile=routing, knobs=knobs, comm=comm,
                       rank=rank, dense_grad=dense_grad)
    with at_width(lk, H, I, k):
        extra = router_and_loss(lk, N, H, E, k, b)
    fwd = float(r["fwd"] + sum(extra["fwd"]))
    return fwd, fwd + float(r["bwd"] + sum(extra["bwd"]))


def offload_adamw_time(num_params: int, beta: int, slots: int, cluster, *, world_size: int = 1) -> float:
    """Seconds of one OffloadStreamAdamW step over ``num_params`` bf16 parameters."""
    lk = _lk(cluster)
    return float(stream_adamw_s(lk, num_params, beta, slots, ranks=ranks_per_node(lk, world_size))["total"])


def cpu_offload_adamw_time(num_params: int, threads: float, cluster, *, world_size: int = 1) -> float:
    """Seconds of one CPUOffloadAdamW step (bf16 working weights) at ``threads`` host threads."""
    lk = _lk(cluster)
    return float(cpu_offload_adamw_s(lk, num_params, threads, ranks=ranks_per_node(lk, world_size))["total"])


def gpu_adamw_time(num_params: int, cluster) -> float:
    """Seconds of ``torch.optim.AdamW(fused=True)`` over ``num_params`` fp32 device parameters."""
    return float(gpu_adamw_s(_lk(cluster), num_params))
