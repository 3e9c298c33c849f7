"""Kernel inventory of the dispatch operators on one rank and one layer, read from the runtime
(``planner/runtime/{expert_parallel,expert_mlp,llep,pipelined_llep,expert_chunk,exchange}.py``).
Torch-free (DESIGN §4, §7).

Legend: ``s``/``q`` routes the rank sends / receives (computes) in one chunk (EP, LLEP: one chunk
= the layer), ``r`` rows of one GEMM block (EP/LLEP: a slot of ``GroupedMLP``; PipelinedLLEP: a
``block_rows`` block of ``ExpertChunk``), ``nb`` blocks in the chunk, ``N`` tokens, ``H``/``I``
widths, ``b`` activation bytes, ``w3 = 3·H·I`` weights of one expert, ``n``/``X``/``X_e`` own,
imported, exported experts. Route weights are fp32 (4 B), indices int64 (8 B). ``[copy …]``: only
when ``E_p = 1`` (the shim's all-to-all is then a ``copy_``; under NCCL it is communication, under the
fake process group nothing).

**GEMMs** (``torch.mm`` per block, from the GEMM table at the block's rows, ``flops.expert_*``):
EP/LLEP forward up + down, backward ``g_down, gh, g_up, gx``; PipelinedLLEP forward up + down, the
reentrant recompute up, ``ExpertChunk.backward`` down + the four gradients.

**Memory-bound kernels**, bytes read + written (``x`` gathers read and write ``2Hb`` per row):

    EP/LLEP fwd   send_order (sort, searchsorted, scatter: SEND_ORDER_BYTES/route), tok div 16s,
                  weights gather 16s, x gather (2Hb+8)s, [copy 2Hb·s], perm_Q gather (2Hb+8)q,
                  SiLU 2Ib·q + mul 3Ib·q, inv_Q gather (2Hb+8)q, [copy 2Hb·q], weight cast 6s,
                  o·w (2Hb+b)s, zeros N·Hb, index_add_ (3Hb+8)s (source read + target RMW)
    EP/LLEP bwd   grad gather (Hb·(1+dense)+8)s, mul grads (2Hb+b)s + 3Hb·s, sum (Hb+b)s, cast 6s,
                  weights scatter 12Nk + 20s, [copy], inv_Q and perm_Q index_select backward
                  (autograd's zeros + out-of-place index_add, which copies the zeros first:
                  3Hb·q + (3Hb+8)q, twice), per row 13Ib (gh·u, silu', gh·act, cat) + 2Hb (dx
                  copy), zeros (n+X)·w3·b, per slot add_ 3·w3·b, AccumulateGrad 3n·w3·b, [copy],
                  tok_R backward (3N·Hb + (3Hb+8)s); LLEP exporter: zeros n·w3·b, 5·w3·b per
                  export (``full[sl] += g``: add_ and the setitem's copy_), the engine's sum 3n·w3·b
    PLLEP fwd     layer: send_order, zeros N·Hb; chunk: div 16s, x gather (2Hb+8)s, w gather 16s,
                  [copy (2Hb+8)s], per row: gather 2Hb+8, SiLU·mul 5Ib, w gather 16,
                  cast 6, o·w 2Hb+b, index_copy_ 2Hb+8; [copy 2Hb·q], index_add_ (3Hb+8)s
    PLLEP bwd     chunk: grad gather (Hb·(1+dense)+8)s, [copy], recompute: per row 2Hb+8;
                  backward: per row 12Hb + 18Ib + 2b + 68, per block add_ 3·w3·b; Dispatch
                  backward [copy (2Hb+8)s], zeros N·Hb + (3Hb+8)s, zeros 4Nk + 20s; layer: the
                  engine sums the K chunks' input gradients, (K−1)·(3NHb + 12Nk); importer: zeros
                  X·w3·b (``imp_grads``) and X·w3·b (autograd materialises ``ImportWeights``'
                  undefined output gradients); 3·w3·b per export

timed at the HBM rate derived from the measured fused GPU AdamW curve (``compute.hbm_bytes_per_s``).
The host→device index copies (``torch.as_tensor(...).to(device)``: ``send_order``'s two, EP's
``perm_Q``/``inv_Q``, ``ExpertChunk``'s ``slot_index``) cross PCIe, not HBM: launches only.

**Launches.** Every torch call that launches a kernel costs the host ``compute.host_op_s`` (the
GEMM table's launch floor); view and allocation calls are free (assumed). Per block: EP/LLEP 4
forward, 11 backward; PipelinedLLEP 9 forward, 2 recompute, 23 backward. Per chunk/layer: the
constants below. A phase (a whole EP/LLEP pass, one PipelinedLLEP chunk: ``ExpertChunk`` starts
with a synchronous host→device index copy) takes ``max(GPU seconds, host seconds)``: the host
runs ahead of the GPU within a phase, and the GPU waits for it when its kernels are shorter.
"""

from __future__ import annotations

import numpy as np

from planner.timing.compute import elementwise_s, gemm_s, host_op_s
from planner.timing.flops import expert_bwd, expert_fwd
from planner.timing.lookups import Lookups

SEND_ORDER_BYTES = 336
"""Bytes per route of ``exchange.send_order`` (approximate: a stable 64-bit radix sort of ids and
indices, 8 passes × 32 B, plus arange, searchsorted, the shift and the scatter, 80 B)."""
IDX = 8
"""Bytes of one int64 index."""
LAUNCH = {  # kernel-launching torch calls (module docstring), read from the runtime
    "send_order": 9, "ep_fwd_layer": 11, "ep_bwd_layer": 13, "ep_fwd_block": 4, "ep_bwd_block": 11,
    "pl_fwd_chunk": 5, "pl_bwd_chunk": 8, "pl_fwd_block": 9, "pl_up_block": 2, "pl_bwd_block": 23,
    "copies": 2, "pl_copies": 3,
}


def block_gemm_s(lk: Lookups, rows, cnt, H: int, I: int, which: str):
    """GEMM seconds of ``cnt`` blocks of ``rows`` rows (arrays, summed over the last axis) for
    ``which`` ∈ {fwd, up, down, bwd}."""
    gs = {"fwd": expert_fwd(rows, H, I), "up": expert_fwd(rows, H, I)[:1],
          "down": expert_fwd(rows, H, I)[1:], "bwd": expert_bwd(rows, H, I)}[which]
    if which == "bwd":
        lk.assume("expert backward GEMMs (transposed operands: h.t()@go, go@Wd.t(), x.t()@ggu, ggu@Wu.t()) "
                  "at the NN table's rate for the same (m, n, k)")
    t = sum(gemm_s(lk, g.m, g.n, g.k) for g in gs)
    return (np.asarray(cnt, dtype=float) * t).sum(-1)


class Phase:
    """GPU seconds (GEMMs + memory-bound bytes) and host launches of one phase."""

    def __init__(self) -> None:
        self.gemm, self.nbytes, self.launches = 0.0, 0.0, 0.0

    def gemms(self, seconds) -> "Phase":
        """Add GEMM seconds."""
        self.gemm = self.gemm + seconds
        return self

    def mem(self, nbytes, launches=0.0) -> "Phase":
        """Add memory-bound bytes and kernel-launching host calls."""
        self.nbytes = self.nbytes + np.asarray(nbytes, dtype=float)
        self.launches = self.launches + np.asarray(launches, dtype=float)
        return self

    def times(self, lk: Lookups) -> tuple:
        """``(gemm, memory-bound, exposed host)`` seconds: the phase takes ``max(GPU, host)``."""
        mem = elementwise_s(lk, self.nbytes)
        host = self.launches * host_op_s(lk)
        return self.gemm, mem, np.maximum(0.0, host - self.gemm - mem)


def _finish(lk: Lookups, passes: dict, raw: bool) -> dict:
    """``{pass: [(phase, mult, sum_last_axis), …]}`` → per pass ``(gemm, mem, exposed host)``
    seconds, or with ``raw`` ``(gemm seconds, bytes, launches)``: each phase ``mult`` times over,
    its last axis summed where flagged (a plan's chunks)."""
    if not raw:
        lk.assume(f"dispatch phases (an EP/LLEP pass, a PipelinedLLEP chunk) take max(GPU, host launch) "
                  f"seconds; send_order moves {SEND_ORDER_BYTES} B/route (approximate sort traffic)")
    out = {}
    for name, phases in passes.items():
        acc = [0.0, 0.0, 0.0]
        for ph, mult, axis in phases:
            parts = (ph.gemm, ph.nbytes, ph.launches) if raw else ph.times(lk)
            for i, v in enumerate(parts):
                v = np.asarray(mult) * np.asarray(v, dtype=float)
                acc[i] = acc[i] + (v.sum(-1) if axis else v)
        out[name] = tuple(acc)
    return out


def unchunked(lk: Lookups, H: int, I: int, b: int, k: int, *, N, s, q, rows, cnt, n_own, X=0, X_e=0,
              copies=False, dense_grad=True, raw: bool = False) -> dict:
    """EP/LLEP on one rank (``run_unchunked`` + ``GroupedMLP``): ``{fwd, bwd}`` → ``(gemm, mem,
    host)`` seconds (``raw``: see ``_finish``). ``rows``/``cnt``: slot rows (slots with no rows
    are skipped by the runtime)."""
    N, s, q = (np.asarray(v, dtype=float) for v in (N, s, q))
    nb = (np.asarray(cnt, dtype=float) * (np.asarray(rows) > 0)).sum(-1)
    cp = np.asarray(copies, dtype=float)
    hb, ib, w3b = H * b, I * b, 3.0 * H * I * b
    f = Phase().gemms(block_gemm_s(lk, rows, cnt, H, I, "fwd"))
    f.mem(s * (SEND_ORDER_BYTES + 16 + 16 + 2 * hb + IDX + 6 + 2 * hb + b + 3 * hb + IDX) + N * hb,
          LAUNCH["send_order"] + LAUNCH["ep_fwd_layer"] + LAUNCH["ep_fwd_block"] * nb + cp * LAUNCH["copies"])
    f.mem(q * (2 * (2 * hb + IDX) + 5 * ib) + cp * 2 * hb * (s + q))
    g = Phase().gemms(block_gemm_s(lk, rows, cnt, H, I, "bwd"))
    g.mem(s * (hb * (1 + dense_grad) + IDX + 2 * hb + b + 3 * hb + hb + b + 6 + 20 + 3 * hb + IDX)
          + N * (12 * k + 3 * hb), LAUNCH["ep_bwd_layer"] + LAUNCH["ep_bwd_block"] * nb + cp * LAUNCH["copies"])
    g.mem(q * (2 * (3 * hb + 3 * hb + IDX) + 13 * ib + 2 * hb) + cp * 2 * hb * (s + q))
    g.mem((n_own + X) * w3b + 3 * w3b * nb + 3 * n_own * w3b, 4 + 2 * (np.asarray(X) > 0))
    X_e = np.asarray(X_e, dtype=float)
    g.mem(np.where(X_e > 0, n_own * w3b + 5 * w3b * X_e + 3 * n_own * w3b, 0.0),
          launches=np.where(X_e > 0, 4 + 4 * X_e, 0.0))
    return _finish(lk, {"fwd": [(f, 1.0, False)], "bwd": [(g, 1.0, False)]}, raw)


def pipelined(lk: Lookups, H: int, I: int, b: int, k: int, *, N, s, q, rows, cnt, K, mult=1.0, X=0,
              X_e=0, copies=False, dense_grad=True, chunk_axis: bool = False, raw: bool = False) -> dict:
    """PipelinedLLEP on one rank (``run_pipelined`` + ``ExpertChunk``): ``{fwd, bwd}`` →
    ``(gemm, mem, host)`` seconds (``raw``: see ``_finish``). ``s``, ``q``, ``rows``/``cnt``
    (blocks, last axis) describe a chunk, ``mult`` times over (balanced: ``mult = K``); with
    ``chunk_axis`` the last axis of ``s``/``q`` (second last of ``rows``) runs over the ``K``
    chunks of a plan and is summed."""
    N, s, q, K = (np.asarray(v, dtype=float) for v in (N, s, q, K))
    nb = (np.asarray(cnt, dtype=float) * (np.asarray(rows) > 0)).sum(-1)
    cp = np.asarray(copies, dtype=float)
    hb, ib, w3b = H * b, I * b, 3.0 * H * I * b
    up, down = block_gemm_s(lk, rows, cnt, H, I, "up"), block_gemm_s(lk, rows, cnt, H, I, "down")
    f = Phase().gemms(up + down)
    f.mem(s * (16 + 2 * hb + IDX + 16 + 3 * hb + IDX), LAUNCH["pl_fwd_chunk"] + LAUNCH["pl_fwd_block"] * nb)
    f.mem(q * (2 * hb + IDX + 5 * ib + 16 + 6 + 2 * hb + b + 2 * hb + IDX) + cp * ((2 * hb + IDX) * s + 2 * hb * q),
          cp * LAUNCH["pl_copies"])
    g = Phase().gemms(up + down + block_gemm_s(lk, rows, cnt, H, I, "bwd"))
    g.mem(s * (hb * (1 + dense_grad) + IDX + 3 * hb + IDX + 20) + N * (hb + 4 * k),
          LAUNCH["pl_bwd_chunk"] + (LAUNCH["pl_up_block"] + LAUNCH["pl_bwd_block"]) * nb)
    g.mem(q * (2 * hb + IDX + 12 * hb + 18 * ib + 2 * b + 68) + 3 * w3b * nb
          + cp * (2 * hb * q + (2 * hb + IDX) * s), cp * LAUNCH["pl_copies"])

    X, X_e = np.asarray(X, dtype=float), np.asarray(X_e, dtype=float)
    lf = Phase().mem(N * k * SEND_ORDER_BYTES + N * hb, LAUNCH["send_order"] + 1)
    lb = Phase().mem((K - 1) * (3 * N * hb + 12 * N * k) + 2 * X * w3b + 3 * w3b * X_e,
                     launches=2 * (K - 1) + 4 * (X > 0) + 2 * X_e)
    return _finish(lk, {"fwd": [(f, mult, chunk_axis), (lf, 1.0, False)],
                        "bwd": [(g, mult, chunk_axis), (lb, 1.0, False)]}, raw)


def router_and_loss(lk: Lookups, N, H: int, E: int, k: int, b: int) -> dict:
    """What ``bench/dispatch.py`` times around the operator (``dispatch_trace.build_layer``): the
    ``TopKRouter`` on given ids (``F.linear``, fp32 cast, softmax, gather, renormalise), the loss
    ``out.sum()``, and in backward their gradients, the router GEMMs and the sum of ``x``'s two
    gradients: ``{fwd, bwd}`` → ``(gemm, mem, host)``."""
    N = np.asarray(N, dtype=float)
    f = Phase().gemms(gemm_s(lk, N, E, H)).mem(N * E * (b + 4 + 8) + N * k * (IDX + 8 + 4 + 12) + N * H * b, 7)
    g = Phase().gemms(gemm_s(lk, N, H, E) + gemm_s(lk, E, H, N)).mem(
        N * E * (4 + 12 + 4 + b) + N * k * (24 + 12) + 3 * N * H * b + 3 * E * H * b, 10)
    return _finish(lk, {"fwd": [(f, 1.0, False)], "bwd": [(g, 1.0, False)]}, False)
