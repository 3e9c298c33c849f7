"""One MoE dispatch layer as the traces, tests and ``bench/dispatch.py`` run it (DESIGN §8).

Legend: ``DispatchShape`` holds N, H, I, E, k, E_p and the plan knobs (c, K_max, α, m, λ,
n_import_max); ``op`` is ``ep`` | ``llep`` | ``pipelined_llep`` | ``pipelined_llep_source``.

The step: a ``TopKRouter`` gives the route weights for the profile's expert ids, the operator
runs, and ``out.backward(torch.randn_like(out))``: a dense ``N×H`` upstream gradient, as a decoder
layer's backward delivers (a ``.sum()`` loss would hide it behind an expanded scalar), inside a
non-reentrant checkpoint when ``nested``. The output and that gradient stay resident through
backward. Registered inputs (``input_bytes``): ``x_NH``, the ids
``N·k`` int64, the router weight ``E·H``, the rank's bf16 expert weights and their gradients
(allocated up front), and an optional resident pad (``pad_bytes``, e.g. fp32 optimizer state).
The plan is computed outside fake mode from the profile's counts (``make_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from planner.plans import routing as plans_routing
from planner.runtime import trace
from planner.runtime.expert_mlp import ExpertShard
from planner.runtime.expert_parallel import ExpertParallel
from planner.runtime.llep import LLEP
from planner.runtime.pipelined_llep import PipelinedLLEP
from planner.runtime.pipelined_llep_source import PipelinedLLEPSource
from planner.runtime.routing import TopKRouter, profile_ids
from planner.schema.knobs import default as knob_default

OPERATORS = {"ep": ExpertParallel, "llep": LLEP, "pipelined_llep": PipelinedLLEP,
             "pipelined_llep_source": PipelinedLLEPSource}
"""Trace/bench names: ``pipelined_llep`` is the destination-residue variant,
``pipelined_llep_source`` the source-side one (``dispatch_residue = source``)."""


@dataclass(frozen=True)
class DispatchShape:
    """Sizes of one MoE layer on one rank and the dispatch knobs (DESIGN §1 symbols)."""

    N: int
    H: int
    I: int
    E: int
    k: int
    E_p: int
    c: int = knob_default("token_budget")
    K_max: int = knob_default("max_chunks")
    alpha: float = knob_default("llep_alpha")
    m: int = knob_default("llep_min_tokens")
    lam: float = knob_default("llep_lambda")
    n_imp: int = knob_default("max_imports")

    @property
    def n_local(self) -> int:
        return self.E // self.E_p

    def knobs(self, **over) -> dict:
        kw = dict(token_budget=self.c, max_chunks=self.K_max, alpha=self.alpha, min_tokens=self.m,
                  lam=self.lam, max_imports=self.n_imp)
        kw.update(over)
        return kw


def make_plan(op: str, s: DispatchShape, profile: str, **over):
    """The layer's plan for ``profile`` on every rank (torch-free, outside fake mode)."""
    counts = plans_routing.profile_counts(profile, s.N, s.E, s.k, s.E_p)
    return OPERATORS[op](None, s.E, s.k, None, **s.knobs(**over)).plan_from_counts(counts)


def input_bytes(s: DispatchShape, b: int = 2, pad_bytes: int = 0) -> int:
    """Bytes of the registered inputs (module docstring)."""
    return (s.N * s.H * b + s.N * s.k * 8 + s.E * s.H * b + 2 * s.n_local * 3 * s.H * s.I * b
            + pad_bytes)


def build_layer(op: str, s: DispatchShape, plan, profile: str, *, device, group=None,
                nested: bool = False, pad_bytes: int = 0, init: bool = False, **over):
    """``(inputs, run)``: ``run(after_forward)`` does one forward and backward of the layer.

    ``plan=None`` lets the operator plan from real counts (a real process group).
    """
    dt = torch.bfloat16
    rank = 0 if group is None and not torch.distributed.is_initialized() else \
        torch.distributed.get_rank(group)
    shard = ExpertShard(s.n_local, s.H, s.I, dtype=dt, device=device,
                        first_expert=rank * s.n_local)
    shard.ensure_grads()
    router = TopKRouter(s.H, s.E, s.k, dtype=dt, device=device)
    op_mod = OPERATORS[op](shard, s.E, s.k, group, **s.knobs(**over))
    x = (torch.randn if init else torch.empty)(s.N, s.H, dtype=dt, device=device).requires_grad_()
    ids = (profile_ids(profile, s.N, s.E, s.k, s.E_p, device=device) if init
           else torch.empty(s.N, s.k, dtype=torch.int64, device=device))
    pad = torch.empty(pad_bytes, dtype=torch.uint8, device=device)

    def layer(x_):
        return op_mod(x_, ids, router(x_, ids)[1], plan=plan)

    def run(after_forward=lambda: None):
        x.grad = None
        out = (checkpoint(layer, x, use_reentrant=False, context_fn=op_mod.plan_reuse) if nested
               else layer(x))
        after_forward()
        out.backward(torch.randn_like(out))      # a dense N×H upstream gradient, as in a decoder

    inputs = [x, ids, router.w_EH, shard.w_up_nHJ, shard.w_down_nIH, shard.w_up_nHJ.grad,
              shard.w_down_nIH.grad, pad]
    return inputs, run


def trace_layer(op: str, s: DispatchShape, plan, profile: str, ranks, *, nested: bool = False,
                pad_bytes: int = 0) -> trace.TraceResult:
    """Fake-tensor trace of ``ranks`` (one per plan signature) at full scale; the max over them."""

    def build_for(rank):
        def build():
            inputs, run = build_layer(op, s, plan, profile, device=trace.DEVICE, nested=nested,
                                      pad_bytes=pad_bytes)
            return inputs, run
        return build

    return trace.trace_ranks(build_for, ranks, world_size=s.E_p)
