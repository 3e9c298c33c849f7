"""Tensor inventories of the dispatch operators, as timelines of live buffers (torch-free).

Each operator of ``planner/runtime`` (``expert_parallel``, ``llep``, ``pipelined_llep``) allocates
and frees its buffers in a fixed order. Here each moment where a peak can occur is written down
as the buffers alive at that moment: ``{(name, elem_bytes): count}``. The counts are read off the
operators' code (the comments name the statement); the peak of a phase is the largest moment.
Counts work on ints and on numpy arrays (the guarantee vectorises over candidates).

Legend (rank ``d``): N tokens, H hidden, I expert FFN, E experts, k top-k, b activation bytes,
n = E/E_p own experts, X imports, X_e exports, R = k·N routes sent,
Q_i / C_i rows received / sent in chunk ``i``, r_i rows of the largest GEMM block in chunk ``i``,
Σ_{j≤i} Q_j the residue after chunk ``i``.

``standalone=True`` models the operator as the benches and traces run it (``out = op(x);
out.backward(torch.randn_like(out))``, as a decoder layer's backward delivers a dense ``N×H``
gradient): the output ``N·H·b`` and that upstream gradient ``N·H·b`` stay resident through backward,
and the input gradient ``N·H·b`` appears in backward after the first chunk; otherwise these belong
to the ``boundaries`` live set and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

I64, F32 = 8, 4


@dataclass(frozen=True)
class Shape:
    """Model-side sizes of one MoE layer on one rank."""

    N: object
    H: int
    I: int
    E: int
    k: int
    b: int

    @property
    def R(self):
        return self.k * np.asarray(self.N) if np.ndim(self.N) else self.k * self.N

    @property
    def w3(self) -> int:
        """Elements of one expert's weights, ``3·H·I``."""
        return 3 * self.H * self.I


def total_bytes(moment: dict):
    """Bytes of one moment."""
    return sum(np.asarray(c, dtype=np.int64) * eb for (_, eb), c in moment.items())


def _m(*parts: dict) -> dict:
    out: dict = {}
    for p in parts:
        for key, c in p.items():
            out[key] = out[key] + c if key in out else c
    return out


def router_saved(s: Shape) -> dict:
    """``TopKRouter``: fp32 softmax ``N·E`` (saved), top-k values, their sum and the weights."""
    return {("router softmax", F32): s.N * s.E, ("router weights", F32): s.N * (2 * s.k + 1)}


def _router_moments(s: Shape) -> list[dict]:
    # softmax of the fp32 logits (logits + probs), then the send-order sort (values, indices,
    # positions, piece ids, destinations)
    return [{("router softmax", F32): 2 * s.N * s.E},
            _m(router_saved(s), {("send order", I64): 5 * s.R})]


def slot_forward(s: Shape, r):
    """Bytes of one expert block's forward (``expert_mlp.mlp`` and the route-weight product)."""
    return np.maximum(np.maximum(r * (s.H + 4 * s.I) * s.b, r * (2 * s.H + 3 * s.I) * s.b),
                      r * (2 * s.H * s.b + 6))


def slot_backward(s: Shape, r):
    """Bytes of one expert block's backward (``expert_chunk._backward_block``)."""
    H, I, b = s.H, s.I, s.b
    cands = [r * (4 * H + 2 * I) * b, r * (2 * H + 2 * I) * b + I * H * b, r * (2 * H + 3 * I) * b,
             r * (H + 6 * I) * b, r * (H + 2 * I) * b + 2 * H * I * b]
    out = cands[0]
    for c in cands[1:]:
        out = np.maximum(out, c)
    return out + 2 * r


def grouped_backward(s: Shape, r):
    """Bytes of one slot's backward inside ``GroupedMLP`` (views of its saved buffers)."""
    H, I, b = s.H, s.I, s.b
    cands = [I * H * b, 5 * r * I * b, 2 * r * I * b + 2 * H * I * b, r * (2 * I + H) * b]
    out = cands[0]
    for c in cands[1:]:
        out = np.maximum(out, c)
    return out


# ---- PipelinedLLEP ----------------------------------------------------------------------------
def pipelined(s: Shape, C, Q, r, resid, X, X_e, *, standalone: bool,
              tokc=None) -> dict[str, list[dict]]:
    """Moments of ``run_pipelined``. ``C, Q, r``: per chunk (lists); ``resid[i]`` = rows received
    up to chunk ``i`` (or its bound); ``X``/``X_e`` imports/exports. Keys: ``forward`` (saving, as
    standalone or in the outer recompute), ``forward_nosave`` (inside a non-reentrant checkpoint),
    ``backward``, ``saved_end`` (what the layer keeps for backward). ``tokc[i]``: chunk token ids
    kept after chunk ``i`` (default ``Σ_{j≤i} C_j``)."""
    K = len(Q)
    if tokc is None:
        tokc = np.cumsum(np.asarray(C, dtype=object)) if K else []
    base = _m(router_saved(s), {("send order", I64): s.R, ("imported weights", s.b): X * s.w3,
                                ("output", s.b): s.N * s.H})
    base_ns = {("router weights", F32): s.N * s.k, ("send order", I64): s.R,
               ("imported weights", s.b): X * s.w3, ("output", s.b): s.N * s.H}

    def res(j):  # residue after chunk j (received rows, weights, chunk token ids)
        j = min(j, K - 1)
        return {("residue rows", s.b): resid[j] * s.H, ("residue route weights", F32): resid[j],
                ("chunk token ids", I64): tokc[j]}

    def prefetch(i):
        if i >= K:
            return {}
        return {("prefetch send rows", s.b): C[i] * s.H, ("prefetch send weights", F32): C[i]}

    fwd, nos, bwd = list(_router_moments(s)), [], []
    for i in range(K):
        chunk = {("chunk index", I64): Q[i], ("chunk outputs", s.b): Q[i] * s.H,
                 ("expert block", 1): slot_forward(s, r[i])}
        comb = {("chunk outputs", s.b): Q[i] * s.H, ("combined rows", s.b): C[i] * s.H}
        fwd += [_m(base, res(i + 1), prefetch(i + 1), chunk), _m(base, res(i + 1), comb)]
        cur = {("chunk rows", s.b): Q[i] * s.H, ("chunk route weights", F32): Q[i],
               ("chunk token ids", I64): C[i]}
        nxt = ({("next chunk rows", s.b): Q[i + 1] * s.H, ("next chunk route weights", F32): Q[i + 1]}
               if i + 1 < K else {})
        nos += [_m(base_ns, cur, nxt, prefetch(i + 1), chunk), _m(base_ns, nxt, comb)]
    gx = {("input gradient", s.b): s.N * s.H} if standalone else {}
    up = upstream(s, standalone)
    bbase = _m(router_saved(s), up, {("send order", I64): s.R, ("imported weights", s.b): X * s.w3,
                                     ("imported weight grads", s.b): X * s.w3})
    for i in reversed(range(K)):
        g = gx if i < K - 1 else {}
        bwd.append(_m(bbase, res(i), g, {("grad chunk outputs", s.b): Q[i] * s.H,
                                         ("grad combined rows", s.b): C[i] * s.H}))
        bwd.append(_m(bbase, res(i), g, {
            ("grad chunk outputs", s.b): Q[i] * s.H, ("recomputed gate|up", s.b): Q[i] * 2 * s.I,
            ("chunk index", I64): Q[i], ("grad chunk rows", s.b): Q[i] * s.H,
            ("grad chunk route weights", F32): Q[i], ("expert block", 1): slot_backward(s, r[i])}))
        prev = res(i - 1) if i > 0 else {("chunk token ids", I64): C[0]}
        bwd.append(_m(bbase, prev, g, gx, {
            ("grad chunk rows", s.b): Q[i] * s.H, ("grad chunk route weights", F32): Q[i],
            ("grad sent rows", s.b): C[i] * s.H}))
    bwd.append(_m(bbase, gx, {("returned expert grads", s.b): X_e * s.w3}))
    bwd.append(_m(gx, up, _router_backward(s)))
    saved = _m(base, res(K - 1))
    del saved[("output", s.b)]
    if standalone:
        fwd.append(_m(saved, up))
    return {"forward": fwd, "forward_nosave": nos or [base_ns], "backward": bwd, "saved_end": saved}


def upstream(s: Shape, standalone: bool) -> dict:
    """Standalone runs: the output and the dense upstream gradient, ``N·H`` each, resident through
    the backward (module docstring)."""
    if not standalone:
        return {}
    return {("output", s.b): s.N * s.H, ("upstream gradient", s.b): s.N * s.H}


# ---- PipelinedLLEP, source-side residue --------------------------------------------------------
def pipelined_source(s: Shape, C, Q, r, X, X_e, *, standalone: bool) -> dict[str, list[dict]]:
    """Moments of ``pipelined_llep_source.SourceLayer``: per chunk ``C, Q, r`` (lists; the source
    variant may run ``K' >= K`` chunks), nothing kept across chunks but ``perm_R`` (``k·N``
    int64) and the imports. Keys as ``pipelined``."""
    K = len(Q)
    H, b = s.H, s.b
    imp = {("send order", I64): s.R, ("imported weights", b): X * s.w3}
    base = _m(router_saved(s), imp, {("output", b): s.N * s.H})
    base_ns = _m({("router weights", F32): s.N * s.k}, imp, {("output", b): s.N * s.H})

    def cur(i, pre=""):  # a chunk's received rows and weights, and its token ids
        if i < 0 or i >= K:
            return {}
        return {(pre + "chunk rows", b): Q[i] * H, (pre + "chunk route weights", F32): Q[i],
                (pre + "chunk token ids", I64): C[i]}

    def send(i):
        if i < 0 or i >= K:
            return {}
        return {("prefetch send rows", b): C[i] * H, ("prefetch send weights", F32): C[i]}

    def fwd_moments(bs):
        out = []
        for i in range(K):
            out.append(_m(bs, cur(i), cur(i + 1, "next "), send(i + 1), {
                ("chunk index", I64): Q[i], ("chunk outputs", b): Q[i] * H,
                ("expert block", 1): slot_forward(s, r[i])}))
            out.append(_m(bs, {("chunk token ids", I64): C[i]}, cur(i + 1, "next "),
                          {("chunk outputs", b): Q[i] * H, ("combined rows", b): C[i] * H}))
        return out

    fwd, nos = fwd_moments(base), fwd_moments(base_ns)
    up = upstream(s, standalone)
    gx = {("input gradient", b): s.N * s.H} if standalone else {}
    bbase = _m(router_saved(s), up, gx, imp, {("imported weight grads", b): X * s.w3,
                                               ("grad route weights", F32): s.R})
    bwd = []
    for i in reversed(range(K)):
        both = _m(bbase, cur(i), cur(i - 1, "next "), send(i - 1))
        bwd.append(_m(both, {("grad chunk outputs", b): Q[i] * H, ("grad combined rows", b): C[i] * H}))
        grads = {("grad chunk outputs", b): Q[i] * H, ("chunk index", I64): Q[i],
                 ("recomputed gate|up", b): Q[i] * 2 * s.I}
        bwd.append(_m(both, grads, {("expert block", 1): r[i] * H * b}))
        bwd.append(_m(both, grads, {("grad chunk rows", b): Q[i] * H,
                                    ("grad chunk route weights", F32): Q[i],
                                    ("expert block", 1): slot_backward(s, r[i])}))
        bwd.append(_m(bbase, {("chunk token ids", I64): C[i]}, cur(i - 1, "next "), {
            ("grad chunk rows", b): Q[i] * H, ("grad chunk route weights", F32): Q[i],
            ("grad sent rows", b): C[i] * H}))
    bwd.append(_m(router_saved(s), up, gx, {("imported weight grads", b): X * s.w3,
                                            ("returned expert grads", b): X_e * s.w3}))
    bwd.append(_m(gx, up, _router_backward(s)))
    saved = _m(router_saved(s), imp)
    if standalone:
        fwd.append(_m(saved, up))
    return {"forward": fwd, "forward_nosave": nos or [base_ns], "backward": bwd, "saved_end": saved}


def _router_backward(s: Shape) -> dict:
    # softmax saved + gather backward + softmax backward + cast + the router's x-gradient
    return {("router softmax", F32): 3 * s.N * s.E, ("router logits grad", s.b): s.N * s.E,
            ("router input grad", s.b): s.N * s.H}


# ---- standard EP and LLEP (plain autograd, grouped MLP) ---------------------------------------
def unchunked(s: Shape, Q, r, X, X_e, n_local, *, standalone: bool) -> dict[str, list[dict]]:
    """Moments of ``run_unchunked``: ``Q`` rows received, ``r`` rows of the largest slot,
    ``X``/``X_e`` imports/exports, ``n_local`` own experts."""
    R, H, I, b, N = s.R, s.H, s.I, s.b, s.N
    wb = R if b != F32 else 0                      # route weights cast to the activation dtype
    base = _m(router_saved(s), {("send order", I64): 2 * R, ("sent route weights", F32): R,
                                ("imported weights", b): X * s.w3})
    saved = {("slot-major rows", b): Q * H, ("saved gate|up, silu, h", b): Q * 4 * I,
             ("permutation indices", I64): 2 * Q}
    fwd = list(_router_moments(s)) + [
        _m(base, {("sent rows", b): R * H, ("received rows", b): Q * H}),
        _m(base, {("received rows", b): Q * H, ("slot-major rows", b): Q * H,
                  ("permutation indices", I64): Q}),
        _m(base, saved, {("expert outputs", b): 2 * Q * H}),
        # run_unchunked frees o_QH once permuted: the all-to-all holds y_QH and y_RH (GPU allocator
        # history, FSDP2 Qwen3 W8 ac = none forward[1]: exchange.py 256 MiB beside 256 of y_QH)
        _m(base, saved, {("expert outputs", b): Q * H, ("combine rows", b): R * H}),
        _m(base, saved, {("combined rows", b): 2 * R * H, ("weights cast", b): wb,
                         ("output", b): N * H}),
    ]
    nb = {("router weights", F32): N * s.k, ("send order", I64): 2 * R,
          ("sent route weights", F32): R, ("imported weights", b): X * s.w3}
    nos = [_m(nb, {("sent rows", b): R * H, ("received rows", b): Q * H}),
           _m(nb, {("received rows", b): Q * H, ("slot-major rows", b): Q * H,
                   ("permutation indices", I64): Q}),
           _m(nb, {("slot-major rows", b): Q * H, ("saved gate|up, silu, h", b): Q * 4 * I,
                   ("expert outputs", b): Q * H, ("permutation indices", I64): Q}),
           _m(nb, {("expert outputs", b): 2 * Q * H, ("permutation indices", I64): Q}),
           _m(nb, {("combine rows", b): Q * H + R * H}),
           _m(nb, {("combined rows", b): 2 * R * H, ("weights cast", b): wb}),
           _m(nb, {("combined rows", b): R * H, ("output", b): N * H})]
    gx = {("input gradient", b): N * H} if standalone else {}
    up = upstream(s, standalone)
    wg = {("stacked weight grads", b): (n_local + X) * s.w3}
    # with a weight transfer, the own experts' stacked grads wait for it in the autograd buffer
    held = {("stacked weight grads", b): n_local * s.w3 * (np.asarray(X) + np.asarray(X_e) > 0)}
    bwd = [
        # index_add backward; the route-weight product's backward; the combine's reverse
        _m(base, saved, {("combined rows", b): 2 * R * H, ("weights cast", b): wb,
                         ("grad combined rows", b): R * H}),
        _m(base, saved, {("combined rows", b): R * H, ("weights cast", b): wb,
                         ("grad combined rows", b): 3 * R * H, ("route weight grad", b): R}),
        _m(base, saved, {("grad combined rows", b): R * H, ("grad expert outputs", b): Q * H}),
        # index_select backward (zeros + out-of-place index_add), then GroupedMLP's backward
        _m(base, saved, {("grad expert outputs", b): 3 * Q * H}),
        _m(base, saved, wg, {("grad expert outputs", b): 2 * Q * H,
                             ("expert block", 1): grouped_backward(s, r)}),
        _m(base, held, {("grad received rows", b): 3 * Q * H, ("permutation indices", I64): Q}),
        _m(base, held, {("grad received rows", b): Q * H, ("grad sent rows", b): R * H}),
        _m(base, held, {("grad sent rows", b): R * H, ("input gradient", b): 2 * N * H}),
        _m(router_saved(s), gx, held, {("imported weight grads", b): X * s.w3,
                                       ("returned expert grads", b): (X_e + n_local) * s.w3}),
        _m(gx, _router_backward(s)),
    ]
    saved_end = _m(base, saved, {("combined rows", b): 2 * R * H, ("weights cast", b): wb})
    if standalone:
        bwd = [_m(m, up) for m in bwd]
        fwd.append(_m(saved_end, up))
    return {"forward": fwd, "forward_nosave": nos, "backward": bwd, "saved_end": saved_end}
