"""Argument checks of Ring-DTP and the one exchange that makes the group agree on them (helpers of
``planner.runtime.ring_dtp``).

Every rank of the vocabulary group calls the operator together, so an argument refused on one rank
only, or arguments that differ between ranks, must stop **every** rank before the ring: otherwise the
others wait in the ring forever, or gloo aborts on a size mismatch ("Received data size doesn't
match") and NCCL hangs or reads garbage. So no check raises on its own: each rank checks its
arguments locally (``local_error``), then ``agree`` makes the one all-reduce(max) of int64 the
operator already makes before the ring (for ``N_max`` and the target range), carrying:

    slots           value on rank r                            what every rank learns
    N, t_max, -t_min   tokens; masked target extremes          N_max; the target range check
    failed          P - r if r's local checks failed, else 0   the lowest rank that failed
    fingerprint     (v, ~v) of mode, H, dtype, B_v,            whether the group agrees (max and
                    ignore_index, vocab_size                   ~max(~v) = min of each field)
    stop            vocab_start + V_r                          V when vocab_size is not given
    shard lo / hi   the V for which r's shard is the plan's    whether every shard is the plan's
                    (an interval), packed with r               (and the rank of one that is not)

Then every rank raises together: a rank whose own check failed raises its own error; the others
name that rank. Disagreement raises the same error on every rank. No extra collective, and the one
host sync the ``N_max`` read needs anyway.
"""

from __future__ import annotations

import numbers

import torch

from planner.errors import InvalidPlan
from planner.plans.ring import MOVES, shard_bounds
from planner.runtime import shim
from planner.runtime.validation import check_not_meta, check_targets
from planner.schema.base import MAX_IMPORTS

REDUCTIONS = ("mean", "sum")
"""``reduction`` values (``"none"`` would need a per-token loss the ring does not keep)."""
DTYPES = (torch.float32, torch.bfloat16)
"""Input dtypes (accumulators are fp32)."""
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
SHARD_CAP = 1 << 40
"""Shard-interval bounds are clamped here before packing a rank index below them (``2^40·P`` stays
inside int64 for any group of up to ``2^22`` ranks); a larger ``V`` is refused (``vocab_size``)."""


class _Said(str):
    """A value shown as written (``InvalidPlan`` repeats values by their ``repr``)."""

    __repr__ = str.__str__


def int_arg(name: str, v, lo: int, hi: int, fix: str, *, allow_none: bool = False) -> None:
    """``v`` is an integer (not a bool, not ``1.5`` or ``'2'``) in ``[lo, hi]``, else ``InvalidPlan``."""
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
        raise InvalidPlan(name, v, f"must be an integer in [{lo}, {hi}]" + (" or None" if allow_none else ""), fix)


def check_vocab_blocks(vocab_blocks) -> None:
    """``1 <= B_v <=`` the plan schema's bound (``planner.schema.base.MAX_IMPORTS``): the plan holds
    ``B_v`` strip bounds per shard."""
    int_arg("vocab_blocks", vocab_blocks, 1, MAX_IMPORTS, "pass B_v within the plan schema's bound "
            "(planner.schema.base.MAX_IMPORTS); 1 unless the strips must be smaller")


def check_args(x_NH, targets_N, w_VpH, *, vocab_start, vocab_blocks, ignore_index, reduction, mode,
               vocab_size, n_max) -> None:
    """This rank's arguments, without communication (raises ``InvalidPlan`` or the ``ValueError`` of
    ``planner.runtime.validation``)."""
    for name, t in (("x_NH", x_NH), ("targets_N", targets_N), ("w_VpH", w_VpH)):
        if not isinstance(t, torch.Tensor):
            raise InvalidPlan(name, _Said(f"a {type(t).__name__}"), "must be a torch.Tensor", "pass a tensor")
    if x_NH.dim() != 2 or w_VpH.dim() != 2 or x_NH.shape[1] != w_VpH.shape[1]:
        raise InvalidPlan("x_NH/w_VpH", (tuple(x_NH.shape), tuple(w_VpH.shape)),
                          "must be N×H and V_r×H with the same H", "flatten the batch to N×H")
    check_targets(targets_N)
    check_not_meta(x_NH=x_NH, targets_N=targets_N, w_VpH=w_VpH)
    int_arg("n_max", n_max, x_NH.shape[0], INT64_MAX, "pass the group's largest N (trace mode only)",
            allow_none=True)
    if targets_N.shape != (x_NH.shape[0],):
        raise InvalidPlan("targets_N", tuple(targets_N.shape), f"must have shape ({x_NH.shape[0]},)",
                          "flatten the targets like x_NH")
    if x_NH.dtype != w_VpH.dtype or x_NH.dtype not in DTYPES:
        raise InvalidPlan("dtype", (x_NH.dtype, w_VpH.dtype), "must be the same, fp32 or bf16",
                          "cast x_NH and w_VpH to one dtype")
    if reduction not in REDUCTIONS:
        raise InvalidPlan("reduction", reduction, "must be 'mean' or 'sum'", "pick one")
    if mode is not None and mode not in MOVES:
        raise InvalidPlan("mode", mode, f"must be one of {MOVES} or None", "drop mode for the auto branch")
    check_vocab_blocks(vocab_blocks)
    int_arg("vocab_start", vocab_start, 0, SHARD_CAP, "pass the first row of the shard, "
            "planner.plans.ring.shard_bounds(V, P)[rank][0]")
    int_arg("vocab_size", vocab_size, 1, SHARD_CAP, "pass V, or None to take it from the shards",
            allow_none=True)
    int_arg("ignore_index", ignore_index, INT64_MIN, INT64_MAX, "torch's default is -100")


def local_error(**args) -> ValueError | None:
    """``check_args``'s refusal on this rank, or ``None`` (recorded, raised after ``agree``)."""
    try:
        check_args(**args)
    except ValueError as e:               # InvalidPlan is a ValueError
        return e
    return None


def shard_interval(start: int, rows: int, r: int, P: int) -> tuple[int, int]:
    """The vocabulary sizes ``V`` for which ``[start, start + rows)`` is shard ``r`` of
    ``shard_bounds(V, P)`` (``floor(V/P)`` rows, the first ``V mod P`` one more): an interval
    ``[lo, hi]``, empty (``lo > hi``) when there is none."""
    lo, hi = SHARD_CAP, 0
    if start == r * rows:                 # r among the longer shards (V mod P > r), or V = P·rows
        lo, hi = P * (rows - 1) + r + 1, P * rows
    elif 0 <= start - r * rows <= r:      # r among the shorter ones: V mod P = start - r·rows
        lo = hi = P * rows + start - r * rows
    lo = max(lo, P)                       # every shard has a row (P <= V)
    return min(lo, SHARD_CAP), max(0, min(hi, SHARD_CAP))


_FIELDS = ("mode", "hidden size H", "dtype", "vocab_blocks", "ignore_index")
_CODES = {"mode": (None, *MOVES), "dtype": DTYPES}


def _fingerprint(err, x_NH, w_VpH, vocab_blocks, ignore_index, mode) -> list[int]:
    if err is not None:
        return [0] * len(_FIELDS)
    return [_CODES["mode"].index(mode), x_NH.shape[1], _CODES["dtype"].index(x_NH.dtype), vocab_blocks,
            ignore_index]


def _shown(field: str, v: int):
    return _CODES[field][v] if field in _CODES else v


def agree(err, x_NH, t_N, w_VpH, *, group, vocab_start, vocab_blocks, ignore_index, mode,
          vocab_size) -> tuple[int, int]:
    """``(V, N_max)`` of the group, after one all-reduce that checks every rank's arguments (module
    docstring). Raises on every rank together; never called in trace mode (no values there).

    Raises:
        InvalidPlan: ``err`` on this rank (its own), a local refusal on another rank (naming it),
            arguments that differ between ranks, or a shard that is not the plan's.
        ValueError: a target outside ``[0, V)`` that is not ``ignore_index`` on some rank.
    """
    P, r = shim.group_size(group), shim.group_rank(group)
    ok = err is None
    rows = w_VpH.shape[0] if ok else 0
    s = max(1, (P - 1).bit_length())
    lo, hi = shard_interval(vocab_start, rows, r, P) if ok else (SHARD_CAP, 0)
    given = ok and vocab_size is not None
    host = [x_NH.shape[0] if ok else 0, 0 if ok else P - r, min(vocab_start + rows, SHARD_CAP) if ok else 0,
            vocab_size if given else -1, ~vocab_size if given else INT64_MIN, (lo << s) | r,
            ((SHARD_CAP - hi) << s) | r]
    for v in _fingerprint(err, x_NH, w_VpH, vocab_blocks, ignore_index, mode):
        host += [v, ~v]
    if ok and x_NH.shape[0]:              # masked target extremes on the device: no host copy
        t_lo, t_hi = torch.aminmax(t_N.masked_fill(t_N == ignore_index, 0))
        tgt = torch.stack([t_hi.long(), t_lo.long().clamp(min=-(1 << 62)).neg()])   # -2**63 negates to itself
    else:
        tgt = torch.zeros(2, dtype=torch.int64)
    dev = torch.device("cpu")
    if P > 1 and shim.dist.get_backend(group) == "nccl":
        dev = torch.device("cuda", torch.cuda.current_device())
    elif P == 1:
        dev = tgt.device
    vals = torch.cat([tgt.to(dev), torch.tensor(host, dtype=torch.int64).to(dev)])
    shim.all_reduce(vals, "max", group)
    (t_max, t_min, n, failed, stop, v_max, v_min_inv, lo_key, hi_key, *fp) = vals.tolist()
    if err is not None:
        raise err
    if failed:
        raise InvalidPlan(f"rank {P - failed}", _Said(f"of {P} in the vocabulary group"), "refused its Ring-DTP "
                          "arguments, so no rank entered the ring (that rank's error names the argument)",
                          "correct the argument that rank's error names")
    for i, field in enumerate(_FIELDS):
        top, bottom = fp[2 * i], ~fp[2 * i + 1]
        if top != bottom:
            raise InvalidPlan(field, _Said(f"{_shown(field, bottom)!r} on one rank, {_shown(field, top)!r} on another"),
                              "must be the same on every rank of the group", "pass one value on every rank")
    if v_max >= 0 and v_max != ~v_min_inv:
        raise InvalidPlan("vocab_size", _Said(f"{~v_min_inv} on one rank, {v_max} on another"),
                          "must be the same on every rank of the group", "pass one V on every rank (or None)")
    V = v_max if v_max >= 0 else stop
    bounds = shard_bounds(V, P)
    mask = (1 << s) - 1
    bad = lo_key & mask if lo_key >> s > V else hi_key & mask if SHARD_CAP - (hi_key >> s) < V else None
    if bad is not None:
        if not lo <= V <= hi:
            raise InvalidPlan("vocab_start", vocab_start, f"with {rows} rows must give the shard {bounds[r]} of "
                              f"rank {r} (V={V}, P={P})", "shard the head with planner.plans.ring.shard_bounds(V, P)")
        raise InvalidPlan(f"vocab_start of rank {bad}", _Said("given there"), f"with that rank's rows must give the "
                          f"shard {bounds[bad]} (V={V}, P={P}); that rank's error names the value",
                          "shard the head with planner.plans.ring.shard_bounds(V, P) on every rank")
    t_min = -t_min
    if t_min < 0 or t_max >= V:
        worst = t_min if t_min < 0 else t_max
        raise ValueError(f"targets_N must lie in [0, {V}) or equal ignore_index ({ignore_index}): a rank "
                         f"of the group has target {worst}; fix: map "
                         "out-of-vocabulary ids to ignore_index, as torch's cross_entropy requires")
    return V, int(n)
