"""Cross-rank agreement of a dispatch operator's call, folded into its route-count all-gather.

Legend:
    hdr_F        this rank's header: ``F = HEADER_SLOTS`` int64 (local check, ``ceil(N/c)``, fields)
    counts_E     this rank's routes per expert (zeros where its local checks failed)
    pay_WP       the all-gathered payload, ``P = F + E`` per rank

Ranks of an expert-parallel group that disagree on what shapes the plan (the knobs, ``H``, the
dtypes, ``E``, which tensors require grad) would move buffers of different sizes, or run a
collective on one rank only: a hang, or gloo's "Received data size doesn't match" abort. A local
argument check that raised on one rank only would leave the others waiting in the all-gather.

So every local check is recorded, not raised (``Call``), and its outcome travels with the
plan-shaping fields in a fixed header of the all-gather the plan makes anyway (``exchange``). Then
every rank raises together: the rank whose check failed with its own error, the others with an
``InvalidPlan`` naming that rank and the argument; a field that differs with an ``InvalidPlan``
naming it, every rank's value and the fix. No extra collective per call. The payload's size
depends on ``E``, so an operator's first exchange is a header-only all-gather (``F`` int64, once
per operator), which agrees on ``E`` before a payload of ``F + E`` is sent.

Under the fake process group (collectives are no-ops) the output is pre-filled with this rank's
own payload, so the other ranks read as agreeing and drawing this rank's counts.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from planner.errors import InvalidPlan
from planner.plans.chunking import MEMBERSHIPS
from planner.plans.dispatch import RESIDUES, DispatchPlan
from planner.runtime import shim

HEADER_SLOTS = 32
"""int64 slots of the header: local check, ``ceil(N/c)``, then up to 30 agreement fields."""
ARGS = ("x_NH", "ids_Nk", "weights_Nk", "shard", "plan")
"""Arguments a local check can refuse (code ``1 + index``; ``arguments`` for any other)."""
OPERATORS = ("ep", "llep", "pipelined_llep")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e4m3fn,
          torch.float8_e5m2)


class _Shown(str):
    """Text an ``InvalidPlan`` shows as it is (no quotes)."""

    def __repr__(self) -> str:
        return str(self)


def _per_rank(values: list) -> _Shown:
    return _Shown(", ".join(f"{v!r} on rank {r}" for r, v in enumerate(values)))


def _encode(v) -> int:
    if isinstance(v, torch.dtype):
        return DTYPES.index(v) if v in DTYPES else len(DTYPES) + zlib.crc32(str(v).encode())
    if isinstance(v, float):
        return struct.unpack("<q", struct.pack("<d", v))[0]
    return int(v)


def _decode(code: int, like):
    if isinstance(like, torch.dtype):
        return DTYPES[code] if 0 <= code < len(DTYPES) else "another dtype"
    if isinstance(like, float):
        return struct.unpack("<d", struct.pack("<q", code))[0]
    return type(like)(code) if isinstance(like, (bool, int)) else code


@dataclass
class Call:
    """One call's agreement fields ``[(name, value, fix), …]`` (values: int, float, bool, str
    choices as their index, or a torch dtype), its recorded local error and ``ceil(N/c)``."""

    fields: list
    error: Exception | None = None
    arg: str = "arguments"
    want_chunks: int = 0
    choices: dict = field(default_factory=dict)
    """``name → tuple``: fields whose value is one of a few strings, sent as the index."""

    def check(self, arg: str, fn, *args, **kwargs):
        """Run ``fn``; a ``ValueError`` it raises is recorded (the first one) instead of raised."""
        if self.error is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            word = str(e).split(" ", 1)[0]
            self.error, self.arg = e, arg or (word if word in ARGS else "arguments")
            return None

    def raise_local(self) -> None:
        if self.error is not None:
            raise self.error

    def header(self) -> list[int]:
        code = 0 if self.error is None else 1 + (ARGS.index(self.arg) if self.arg in ARGS else len(ARGS))
        vals = [self.choices[n].index(v) if n in self.choices else _encode(v) for n, v, _ in self.fields]
        assert len(vals) + 2 <= HEADER_SLOTS, len(vals)
        return [code, int(self.want_chunks), *vals] + [0] * (HEADER_SLOTS - 2 - len(vals))

    def verdict(self, hdr_WF: np.ndarray, rank: int) -> None:
        """Raise on every rank alike when a rank's local check failed or a field differs."""
        bad = [r for r in range(hdr_WF.shape[0]) if hdr_WF[r, 0]]
        if bad:
            self.raise_local()
            r, code = bad[0], int(hdr_WF[bad[0], 0])
            arg = ARGS[code - 1] if code - 1 < len(ARGS) else "arguments"
            raise InvalidPlan(arg, _Shown(f"refused on rank {r}"), "failed that rank's check (its error names the "
                              "value), so no rank of the group dispatches", f"correct {arg} on rank {r}")
        for j, (name, v, fix) in enumerate(self.fields):
            col = hdr_WF[:, 2 + j]
            if (col != col[0]).any():
                ch = self.choices.get(name)
                shown = [ch[c] if ch and 0 <= c < len(ch) else _decode(int(c), v) for c in col.tolist()]
                raise InvalidPlan(name, _per_rank(shown), "must be the same on every rank of the "
                                  "expert-parallel group", fix)


def exchange(call: Call, counts_E: torch.Tensor, num_experts: int, group, agreed: bool):
    """``(counts_WE, max ceil(N/c))`` of the group, after ``Call.verdict`` on every rank.
    ``agreed``: a header-only exchange already agreed on ``num_experts`` (else one runs first)."""
    world, rank = shim.group_size(group), shim.group_rank(group)
    dev = counts_E.device
    if shim.dist.get_backend(group) == "nccl" and dev.type != "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
    hdr = call.header()
    if not agreed:
        probe = Call([("num_experts", num_experts, "build every rank's operator with the same num_experts")])
        probe.verdict(_gathered(torch.tensor(probe.header(), dtype=torch.int64, device=dev), world, group), rank)
    payload = torch.cat([torch.tensor(hdr, dtype=torch.int64, device=dev), counts_E.to(dev, torch.int64)])
    pay_WP = _gathered(payload, world, group)
    call.verdict(pay_WP[:, :HEADER_SLOTS], rank)
    return pay_WP[:, HEADER_SLOTS:], int(pay_WP[:, 1].max())


def _gathered(payload: torch.Tensor, world: int, group) -> np.ndarray:
    """All-gather of equal ``payload`` rows; the output starts as this rank's row tiled (what the
    fake process group, whose collectives write nothing, leaves)."""
    out = payload.repeat(world)
    shim.all_gather(out, payload, group=group)
    return out.cpu().numpy().reshape(world, -1).astype(np.int64)


def call_of(op, x_NH, ids_Nk, weights_Nk) -> Call:
    """The ``Call`` of ``op(x_NH, ids_Nk, weights_Nk)``: its local checks run (recorded, not
    raised) and the fields every rank must agree on, for ``op``'s operator."""
    from planner.runtime.expert_mlp import grad_dtype
    from planner.runtime.validation import check_dispatch_inputs, check_not_meta

    sh, grad = op.shard, torch.is_grad_enabled()
    call = Call([], want_chunks=op._want_chunks(x_NH.shape[0] if x_NH.dim() else 0))
    call.check("shard", check_dispatch_call_shard, sh, op.num_experts, shim.group_size(op.group),
               shim.group_rank(op.group), op.built_group_size)
    hid = sh.w_up_nHJ.shape[1] if call.error is None else (x_NH.shape[-1] if x_NH.dim() else 0)
    call.check(None, check_dispatch_inputs, x_NH, ids_Nk, weights_Nk, hidden_size=hid,
               num_experts=op.num_experts, top_k=op.top_k)
    call.check(None, check_not_meta, x_NH=x_NH, ids_Nk=ids_Nk, weights_Nk=weights_Nk)
    if call.error is None and x_NH.dtype != sh.w_up_nHJ.dtype and not torch.is_autocast_enabled():
        call.check("x_NH", _raise, f"x_NH ({x_NH.dtype}) must have the expert weights' dtype "
                   f"({sh.w_up_nHJ.dtype}): cast one of them")
    same = "pass the same value on every rank"
    f = [("operator", op.operator, "build the same dispatch operator on every rank"),
         ("num_experts", op.num_experts, same), ("top_k", op.top_k, same),
         ("x_NH.dtype", x_NH.dtype, "cast x_NH to one dtype on every rank"),
         ("x_NH.requires_grad", grad and x_NH.requires_grad,
          "make x_NH require grad on every rank or on none (detach it everywhere or nowhere)")]
    if sh is not None and call.arg != "shard":
        f += [("hidden_size", hid, "give every rank's shard the same hidden size"),
              ("expert_ffn", sh.expert_ffn, "give every rank's shard the same expert_ffn"),
              ("shard dtype", sh.w_up_nHJ.dtype, "cast every rank's shard to one dtype")]
        for name in ("w_up_nHJ", "w_down_nIH"):
            p = getattr(sh, name)
            f += [(f"{name}.requires_grad", grad and p.requires_grad,
                   f"freeze {name} on every rank or on none"),
                  (f"{name}.grad_dtype", grad_dtype(p), f"set {name}.grad_dtype alike on every rank")]
    if op.operator != "ep":
        f += [(k, op.knobs[k], same) for k in ("alpha", "lam", "min_tokens", "max_imports")]
    if op.operator == "pipelined_llep":
        f += [(k, op.knobs[k], same) for k in ("max_chunks", "membership", "residue")]
        f += [("weights_Nk.dtype", weights_Nk.dtype, "cast weights_Nk to one dtype on every rank"),
              ("weights_Nk.requires_grad", grad and weights_Nk.requires_grad,
               "make weights_Nk require grad on every rank or on none")]
    call.fields = f
    call.choices = {"operator": OPERATORS, "membership": MEMBERSHIPS, "residue": RESIDUES}
    return call


def _raise(msg: str) -> None:
    raise ValueError(msg)


def check_dispatch_call_shard(shard, num_experts: int, group_size: int, rank: int, built_size: int) -> None:
    """At a dispatch operator's call: a shard is there, holds data, and still fits the group (a
    group set up after the operator was built has another size, or puts this rank elsewhere)."""
    if shard is None:
        raise InvalidPlan("shard", None, "is needed to run the operator (one without a shard only plans: "
                          "plan_from_counts)", "build the operator with this rank's ExpertShard")
    for name in ("w_up_nHJ", "w_down_nIH"):
        if getattr(shard, name).device.type == "meta":
            raise InvalidPlan(f"shard.{name}.device", "meta", "holds no data",
                              "move the shard to a real device first (shard.to_empty(device=...), then "
                              "initialise or load it)")
    n, first = shard.num_local, shard.first_expert
    if num_experts % group_size or n != num_experts // group_size or first != rank * n:
        per = num_experts // group_size
        want = (f"num_experts / group size = {num_experts} / {group_size} = {per} experts from expert {rank * per}"
                if num_experts % group_size == 0 else f"num_experts ({num_experts}) / group size ({group_size}) experts")
        built = f"; the operator was built for a group of {built_size}" if built_size != group_size else ""
        raise InvalidPlan("shard", f"{n} experts from expert {first}", f"must hold {want} (rank {rank}){built}",
                          "build the operator and its shard after init_process_group, for this group")


def check_given_plan(plan, group_size: int, num_experts: int, top_k: int) -> None:
    """A ``plan=`` given to a dispatch operator is a ``DispatchPlan`` of this group and shape."""
    if not isinstance(plan, DispatchPlan):
        raise InvalidPlan("plan", plan, "must be a planner.plans.dispatch.DispatchPlan",
                          "pass op.plan_from_counts(counts_WE), or leave plan out to plan from the routes")
    got = (plan.num_ranks, plan.counts_WE.shape[1], plan.top_k)
    if got != (group_size, num_experts, top_k):
        raise InvalidPlan("plan", f"W={got[0]}, E={got[1]}, k={got[2]}",
                          f"must be planned for this operator's W={group_size}, E={num_experts}, k={top_k}",
                          "plan with op.plan_from_counts on this group's counts")
