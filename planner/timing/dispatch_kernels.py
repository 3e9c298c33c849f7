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
                  weights scatter 12Nk + 20s, [copy], inv_Q and perm_Q backward (``exchange.Permute``:
                  the inverse permutation's gather, (2Hb+8)q, twice), per row 13Ib (gh·u, silu', gh·act, cat) + 2Hb (dx
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

Each term carries its kernel class (``planner.schema.curves.DISPATCH_KERNEL_CLASSES``; the bytes
per class are checked call by call against the runtime in ``tests/unit/test_timing_dispatch.py``):
``index_select`` from the token tensor or its gradient ``gather_dup`` (rows repeated up to ``k``
times), other gathers ``gather_perm``; ``index_add(_)`` into token rows ``index_add_bf16`` (combine),
into route rows ``index_add_bf16_perm``, fp32 ``index_add_fp32``; an out-of-place ``index_add``'s copy
of its target, ``copy_`` and dtype casts ``copy``; ``index_copy_``; zero-fills ``zero``;
``y·w[:, None]`` ``route_weight``; ``sum(1)`` ``row_sum``; SiLU / ``silu_backward`` on the strided
gate half ``silu`` / ``silu_bwd``; a product with a strided half ``mul_strided``; ``cat``; contiguous
same-shape ``add``/``add_``/``mul`` ``add`` (the weight-gradient ``add_`` row); the ids' sort of
``send_order`` ``sort`` (``SORT_BYTES``); the rest ``other``. Each class runs at its measured rate
(``planner.timing.kernel_rates``).
The host→device index copies (``torch.as_tensor(...).to(device)``: ``send_order``'s two, EP's
``perm_Q``/``inv_Q``, ``ExpertChunk``'s ``slot_index``) cross PCIe, not HBM: launches only.

**Launches.** Per block: EP/LLEP 4 forward, 11 backward; PipelinedLLEP 9 forward, 2 recompute,
23 backward (``kernel_rates.LOOP_LAUNCH``), each block at the measured host seconds of its loop;
per chunk/layer the constants below, each at the measured host seconds of one launching call
(``kernel_rates.host_s``); view and allocation calls are free (assumed). A phase (a whole EP/LLEP
pass, one PipelinedLLEP chunk: ``ExpertChunk`` starts with a synchronous host→device index copy)
takes ``max(GPU seconds, host seconds)``: the host runs ahead of the GPU within a phase, and the
GPU waits for it when its kernels are shorter.
"""

from __future__ import annotations

import numpy as np

from planner.timing import kernel_rates as KR
from planner.timing.compute import gemm_s
from planner.timing.flops import expert_bwd, expert_fwd
from planner.timing.lookups import Lookups

SORT_BYTES = 256
"""Nominal bytes per route of ``send_order``'s stable 64-bit radix sort (8 passes × 32 B): the
``sort`` class's measured rate is per these bytes."""
SEND_ORDER_BYTES = SORT_BYTES + 80
"""Bytes per route of ``exchange.send_order``: the sort, plus arange, searchsorted, the shift and the
scatter, 80 B (approximate)."""
IDX = 8
"""Bytes of one int64 index."""
LAUNCH = {  # kernel-launching torch calls (module docstring), read from the runtime
    "send_order": 9, "ep_fwd_layer": 11, "ep_bwd_layer": 11, "ep_fwd_block": KR.LOOP_LAUNCH["grouped_fwd"],
    "ep_bwd_block": KR.LOOP_LAUNCH["grouped_bwd"], "pl_fwd_chunk": 5, "pl_bwd_chunk": 8,
    "pl_fwd_block": KR.LOOP_LAUNCH["chunk_fwd"], "pl_up_block": KR.LOOP_LAUNCH["chunk_recompute"],
    "pl_bwd_block": KR.LOOP_LAUNCH["chunk_bwd"], "copies": 2, "pl_copies": 3,
}
BWD_ROLES = ("g_down", "gh", "g_up", "gx")
"""Roles of ``flops.expert_bwd``'s GEMMs, in its order."""


def item_gemm_s(lk: Lookups, rows, H: int, I: int, which: str):
    """GEMM seconds of one block of ``rows`` rows (arrays, per element) for ``which`` ∈ {fwd, up,
    down, bwd}; forward GEMMs × their measured ratio at the block rows
    (``kernel_rates.forward_factor``), backward GEMMs × their layout factor
    (``kernel_rates.layout_factor``)."""
    gs = {"fwd": expert_fwd(rows, H, I), "up": expert_fwd(rows, H, I)[:1],
          "down": expert_fwd(rows, H, I)[1:], "bwd": expert_bwd(rows, H, I)}[which]
    if which == "bwd":
        return sum(gemm_s(lk, g.m, g.n, g.k) * KR.layout_factor(lk, role, rows, H, I) for g, role in zip(gs, BWD_ROLES))
    roles = {"fwd": KR.FORWARD_ROLES, "up": KR.FORWARD_ROLES[:1], "down": KR.FORWARD_ROLES[1:]}[which]
    return sum(gemm_s(lk, g.m, g.n, g.k) * KR.forward_factor(lk, role, rows) for g, role in zip(gs, roles))


def block_gemm_s(lk: Lookups, rows, cnt, H: int, I: int, which: str):
    """GEMM seconds of ``cnt`` blocks of ``rows`` rows (arrays, summed over the last axis) for
    ``which`` ∈ {fwd, up, down, bwd} (``item_gemm_s``)."""
    return (np.asarray(cnt, dtype=float) * item_gemm_s(lk, rows, H, I, which)).sum(-1)


class Phase:
    """GPU seconds (GEMMs + memory-bound bytes by class) and host work (launching calls outside
    the block loops, blocks per loop) of one phase."""

    def __init__(self) -> None:
        self.gemm, self.calls = 0.0, 0.0
        self.nbytes: dict = {}
        self.blocks: dict = {}
        self.pipes: list = []

    def gemms(self, seconds) -> "Phase":
        """Add GEMM seconds."""
        self.gemm = self.gemm + seconds
        return self

    def mem(self, launches=0.0, **by_class) -> "Phase":
        """Add memory-bound bytes by class (``cls=bytes``) and kernel-launching host calls."""
        for c, v in by_class.items():
            self.nbytes[c] = self.nbytes.get(c, 0.0) + np.asarray(v, dtype=float)
        self.calls = self.calls + np.asarray(launches, dtype=float)
        return self

    def loop(self, loop: str, blocks) -> "Phase":
        """Add ``blocks`` blocks of the runtime loop ``loop`` (``kernel_rates.LOOP_LAUNCH``)."""
        self.blocks[loop] = self.blocks.get(loop, 0.0) + np.asarray(blocks, dtype=float)
        return self

    def pipe(self, loop: str, rows, cnt, gemm, per_row: dict, per_block: dict | None = None) -> "Phase":
        """A block loop of ``loop`` that starts on an idle GPU (``kernel_rates.loop_exposed_s``):
        items (last axis, in runtime order) of ``cnt`` blocks of ``rows`` rows, each block ``gemm``
        seconds (the table's, before the sustained factor) and ``per_row``·rows + ``per_block``
        memory-bound bytes by class. Its GEMMs, bytes and blocks are added with ``gemms``, ``mem``
        and ``loop`` as before; this only orders them for the host's pace."""
        self.pipes.append((loop, rows, cnt, gemm, per_row, per_block or {}))
        return self

    @property
    def launches(self):
        """All kernel-launching host calls."""
        return self.calls + sum(KR.LOOP_LAUNCH[lp] * n for lp, n in self.blocks.items())

    def times(self, lk: Lookups, sustain=1.0) -> tuple:
        """``(gemm, memory-bound, exposed host)`` seconds, GEMMs × ``sustain``: the phase takes
        ``max(GPU, host)``."""
        gemm = self.gemm * sustain
        mem = KR.memory_s(lk, self.nbytes) if self.nbytes else 0.0
        host = KR.host_s(lk, self.calls, self.blocks)
        exposed = host - gemm - mem
        if self.pipes:
            s = np.expand_dims(sustain, -1) if np.ndim(sustain) else sustain
            loops = 0.0
            for loop, rows, cnt, g, per_row, per_block in self.pipes:
                r = np.asarray(rows, dtype=float)
                nbytes = {c: v * r for c, v in per_row.items()}
                for c, v in per_block.items():
                    nbytes[c] = nbytes.get(c, 0.0) + v * (r > 0)
                gpu = np.asarray(g, dtype=float) * s + KR.memory_s(lk, nbytes)
                loops = loops + KR.loop_exposed_s(KR.block_host_s(lk, loop), gpu, np.asarray(cnt) * (r > 0))
            exposed = np.maximum(exposed, loops)
        return gemm, mem, np.maximum(0.0, exposed)


def _finish(lk: Lookups, passes: dict, raw: bool) -> dict:
    """``{pass: [(phase, mult, sum_last_axis), …]}`` → per pass ``(gemm, mem, exposed host)``
    seconds, or with ``raw`` ``(gemm seconds, {class: bytes}, launches)``: each phase ``mult``
    times over, its last axis summed where flagged (a plan's chunks). GEMMs × the sustained factor
    of the forward + backward GEMM seconds (``kernel_rates.sustained_factor``)."""
    def total(v, mult, axis):
        v = np.asarray(mult) * np.asarray(v, dtype=float)
        return v.sum(-1) if axis else v

    if raw:
        out = {}
        for name, phases in passes.items():
            g, nb, la = 0.0, {}, 0.0
            for ph, mult, axis in phases:
                g = g + total(ph.gemm, mult, axis)
                la = la + total(ph.launches, mult, axis)
                for c, v in ph.nbytes.items():
                    nb[c] = nb.get(c, 0.0) + total(v, mult, axis)
            out[name] = (g, nb, la)
        return out
    lk.assume("dispatch phases (an EP/LLEP pass, a PipelinedLLEP chunk) take max(GPU, host) seconds; "
              f"send_order moves {SEND_ORDER_BYTES} B/route ({SORT_BYTES} B sort, approximate)")
    T = sum(total(ph.gemm, mult, axis) for phases in passes.values() for ph, mult, axis in phases)
    f = KR.sustained_factor(lk, T)
    out = {}
    for name, phases in passes.items():
        acc = [0.0, 0.0, 0.0]
        for ph, mult, axis in phases:
            fa = np.asarray(f)[..., None] if axis and np.ndim(f) else f
            for i, v in enumerate(ph.times(lk, fa)):
                acc[i] = acc[i] + total(v, mult, axis)
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
    f = Phase().gemms(block_gemm_s(lk, rows, cnt, H, I, "fwd")).loop("grouped_fwd", nb)
    f.mem(LAUNCH["send_order"] + LAUNCH["ep_fwd_layer"] + cp * LAUNCH["copies"],
          sort=s * SORT_BYTES, other=s * (SEND_ORDER_BYTES - SORT_BYTES + 16),
          gather_perm=s * 16 + q * 2 * (2 * hb + IDX),
          gather_dup=s * (2 * hb + IDX), copy=s * 6 + cp * 2 * hb * (s + q), silu=q * 2 * ib, mul_strided=q * 3 * ib,
          route_weight=s * (2 * hb + b), zero=N * hb, index_add_bf16=s * (3 * hb + IDX))
    g = Phase().gemms(block_gemm_s(lk, rows, cnt, H, I, "bwd")).loop("grouped_bwd", nb)
    g.mem(LAUNCH["ep_bwd_layer"] + cp * LAUNCH["copies"],
          gather_dup=s * (hb * (1 + dense_grad) + IDX), route_weight=s * (2 * hb + b), add=s * 3 * hb + q * 3 * ib,
          row_sum=s * (hb + b), copy=s * 6 + N * (8 * k + 2 * hb) + q * 2 * hb + cp * 2 * hb * (s + q),
          zero=N * (4 * k + hb), index_add_fp32=s * 20, index_add_bf16=s * (3 * hb + IDX),
          gather_perm=q * 2 * (2 * hb + IDX), mul_strided=q * 3 * ib, silu_bwd=q * 3 * ib, cat=q * 4 * ib)
    g.mem(4 + 2 * (np.asarray(X) > 0), zero=(n_own + X) * w3b, add=3 * w3b * nb + 3 * n_own * w3b)
    X_e = np.asarray(X_e, dtype=float)
    exp = X_e > 0
    g.mem(np.where(exp, 4 + 4 * X_e, 0.0), zero=np.where(exp, n_own * w3b, 0.0),
          add=np.where(exp, 3 * w3b * X_e + 3 * n_own * w3b, 0.0), copy=np.where(exp, 2 * w3b * X_e, 0.0))
    return _finish(lk, {"fwd": [(f, 1.0, False)], "bwd": [(g, 1.0, False)]}, raw)


def pipelined(lk: Lookups, H: int, I: int, b: int, k: int, *, N, s, q, rows, cnt, K, mult=1.0, X=0,
              X_e=0, copies=False, dense_grad=True, chunk_axis: bool = False, raw: bool = False,
              source: bool = False) -> dict:
    """PipelinedLLEP on one rank (``run_pipelined`` + ``ExpertChunk``; ``source``: the source-side
    variant ``pipelined_llep_source.SourceLayer``, which re-gathers every chunk's rows and weights in
    backward, fills one ``N×H`` / ``N·k`` gradient instead of one per chunk, and leaves the engine
    no ``K`` input gradients to sum): ``{fwd, bwd}`` →
    ``(gemm, mem, host)`` seconds (``raw``: see ``_finish``). ``s``, ``q``, ``rows``/``cnt``
    (blocks, last axis) describe a chunk, ``mult`` times over (balanced: ``mult = K``); with
    ``chunk_axis`` the last axis of ``s``/``q`` (second last of ``rows``) runs over the ``K``
    chunks of a plan and is summed."""
    N, s, q, K = (np.asarray(v, dtype=float) for v in (N, s, q, K))
    nb = (np.asarray(cnt, dtype=float) * (np.asarray(rows) > 0)).sum(-1)
    cp = np.asarray(copies, dtype=float)
    hb, ib, w3b = H * b, I * b, 3.0 * H * I * b
    gi_up, gi_down = item_gemm_s(lk, rows, H, I, "up"), item_gemm_s(lk, rows, H, I, "down")
    gi_bwd = item_gemm_s(lk, rows, H, I, "bwd")
    cn = np.asarray(cnt, dtype=float)
    up, down = (cn * gi_up).sum(-1), (cn * gi_down).sum(-1)
    f = Phase().gemms(up + down).loop("chunk_fwd", nb)
    f.pipe("chunk_fwd", rows, cnt, gi_up + gi_down,
           dict(gather_perm=2 * hb + IDX + 16, silu=2 * ib, mul_strided=3 * ib, copy=6, route_weight=2 * hb + b,
                index_copy=2 * hb + IDX))
    f.mem(LAUNCH["pl_fwd_chunk"] + cp * LAUNCH["pl_copies"],
          other=s * 16, gather_dup=s * (2 * hb + IDX), gather_perm=s * 16 + q * (2 * hb + IDX + 16),
          index_add_bf16=s * (3 * hb + IDX), silu=q * 2 * ib, mul_strided=q * 3 * ib, copy=q * 6
          + cp * ((2 * hb + IDX) * s + 2 * hb * q), route_weight=q * (2 * hb + b), index_copy=q * (2 * hb + IDX))
    per_chunk = np.zeros_like(s) if source else np.ones_like(s)   # N-sized terms repeat per chunk
    g = Phase().gemms(up + down + (cn * gi_bwd).sum(-1))
    g.loop("chunk_recompute", nb).loop("chunk_bwd", nb)
    g.pipe("chunk_recompute", rows, cnt, gi_up, dict(gather_perm=2 * hb + IDX))
    g.pipe("chunk_bwd", rows, cnt, gi_down + gi_bwd,
           dict(gather_perm=2 * (2 * hb + IDX) + 16, silu=2 * ib, mul_strided=6 * ib, copy=12, add=3 * hb + 3 * ib,
                row_sum=hb + b, route_weight=2 * hb + b, silu_bwd=3 * ib, cat=4 * ib, index_copy=2 * hb + IDX + 16),
           dict(add=3 * w3b))
    g.mem(LAUNCH["pl_bwd_chunk"] + cp * LAUNCH["pl_copies"],
          gather_dup=s * (hb * (1 + dense_grad) + IDX), index_add_bf16=s * (3 * hb + IDX), index_add_fp32=s * 20,
          zero=per_chunk * N * (hb + 4 * k), gather_perm=q * (3 * (2 * hb + IDX) + 16), silu=q * 2 * ib,
          mul_strided=q * 6 * ib, copy=q * 12 + cp * (2 * hb * q + (2 * hb + IDX) * s), add=q * (3 * hb + 3 * ib)
          + 3 * w3b * nb, row_sum=q * (hb + b), route_weight=q * (2 * hb + b), silu_bwd=q * 3 * ib, cat=q * 4 * ib,
          index_copy=q * (2 * hb + IDX + 16))
    if source:                                             # the re-dispatch's gathers
        g.mem(3, other=s * 16, gather_dup=s * (2 * hb + IDX), gather_perm=s * 16,
              copy=cp * (2 * hb + IDX) * s)

    X, X_e = np.asarray(X, dtype=float), np.asarray(X_e, dtype=float)
    lf = Phase().mem(LAUNCH["send_order"] + 1, sort=N * k * SORT_BYTES,
                     other=N * k * (SEND_ORDER_BYTES - SORT_BYTES), zero=N * hb)
    engine = 0.0 if source else 1.0
    lb = Phase().mem(2 * (K - 1) * engine + 4 * (X > 0) + 2 * X_e,
                     add=engine * (K - 1) * (3 * N * hb + 12 * N * k) + 3 * w3b * X_e,
                     zero=2 * X * w3b + (1.0 - engine) * N * (hb + 4 * k))
    return _finish(lk, {"fwd": [(f, mult, chunk_axis), (lf, 1.0, False)],
                        "bwd": [(g, mult, chunk_axis), (lb, 1.0, False)]}, raw)


def router_and_loss(lk: Lookups, N, H: int, E: int, k: int, b: int) -> dict:
    """What ``bench/dispatch.py`` times around the operator (``dispatch_trace.build_layer``): the
    ``TopKRouter`` on given ids (``F.linear``, fp32 cast, softmax, gather, renormalise), the loss
    ``out.sum()``, and in backward their gradients, the router GEMMs and the sum of ``x``'s two
    gradients: ``{fwd, bwd}`` → ``(gemm, mem, host)`` (memory-bound kernels: class ``other``)."""
    N = np.asarray(N, dtype=float)
    f = Phase().gemms(gemm_s(lk, N, E, H)).mem(7, other=N * E * (b + 4 + 8) + N * k * (IDX + 8 + 4 + 12) + N * H * b)
    g = Phase().gemms(gemm_s(lk, N, H, E) + gemm_s(lk, E, H, N)).mem(
        10, other=N * E * (4 + 12 + 4 + b) + N * k * (24 + 12) + 3 * N * H * b + 3 * E * H * b)
    return _finish(lk, {"fwd": [(f, 1.0, False)], "bwd": [(g, 1.0, False)]}, False)
