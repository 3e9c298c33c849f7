"""One rank's head step (forward + backward) for the trace, the per-rank GPU emulation and the bench.

``head_step(kind, shape, device=...)`` builds the inputs of one rank of a head (``make_inputs``)
and the step that runs it (``loss_fn`` then backward): ``kind`` is ``"ring_dtp"``, ``"dense"`` or ``"vocab_parallel"``. The same function runs
inside ``FakeTensorMode`` (``trace_head``, DESIGN §8) and on real CUDA tensors under the fake
process group (``bench/vocab.py``), so the trace and the measurement see the same code.

What the step holds besides the head's own live set (state it explicitly when comparing with the
planner's ``vocab`` terms, ``resident_weight_bytes``):

- ``ring_dtp`` / ``vocab_parallel``: the weight shard (``ceil(V/P)`` rows, rank 0) and its
  gradient, allocated before the step as in training, where the persistent grad buffer exists
  across micro-steps (the budget's ``persistent`` live set);
- ``dense``: the full ``V × H`` head weight (``gathered`` when ZeRO-3 sharded); its gradient is a
  fresh transient of the step, as under ZeRO-3 before the reduce-scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from planner.plans.ring import shard_bounds
from planner.schema.knobs import default as knob_default

KINDS = ("ring_dtp", "dense", "vocab_parallel")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class HeadShape:
    """One rank's head problem: ``N`` tokens (the group's ``N_max``), ``H``, ``V``, ``P``, ``B_v``."""

    N: int
    H: int
    V: int
    P: int = 1
    vocab_blocks: int = knob_default("vocab_blocks")
    dtype: str = "fp32"
    mode: str | None = None
    rank: int = 0

    @property
    def shard_rows(self) -> int:
        """Rows of this rank's shard."""
        lo, hi = shard_bounds(self.V, self.P)[self.rank]
        return hi - lo

    @property
    def b(self) -> int:
        """Bytes per input scalar."""
        return 2 if self.dtype == "bf16" else 4


def resident_weight_bytes(kind: str, s: HeadShape) -> int:
    """Bytes of the head weight (and, for a shard, its persistent gradient) the step holds that the
    planner counts outside the ``vocab`` live set (``persistent`` or ``gathered``)."""
    if kind == "dense":
        return s.V * s.H * s.b
    return 2 * s.shard_rows * s.H * s.b


def make_inputs(kind: str, s: HeadShape, *, device, seed: int | None = None) -> list:
    """``[x_NH, t_N, w, (w.grad)]`` of one rank; random with ``seed``, else uninitialised (trace
    and memory/time emulation only)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    dt = DTYPES[s.dtype]
    rows = s.V if kind == "dense" else s.shard_rows
    x_NH = torch.empty(s.N, s.H, dtype=dt, device=device)
    w = torch.empty(rows, s.H, dtype=dt, device=device)
    t_N = torch.empty(s.N, dtype=torch.int64, device=device)
    if seed is not None:
        g = torch.Generator(device=device).manual_seed(seed)
        x_NH.normal_(generator=g)
        w.normal_(std=s.H ** -0.5, generator=g)
        t_N.random_(0, s.V, generator=g)
    else:
        t_N.zero_()
    x_NH.requires_grad_()
    w.requires_grad_()
    inputs = [x_NH, t_N, w]
    if kind != "dense":
        w.grad = torch.zeros_like(w)
        inputs.append(w.grad)
    return inputs


def loss_fn(kind: str, s: HeadShape, inputs: list, group=None):
    """``() -> loss`` of one rank's head on ``inputs`` (from ``make_inputs``)."""
    from planner.runtime.ring_dtp import ring_dtp_cross_entropy
    from planner.runtime.vocab_baselines import dense_cross_entropy, vocab_parallel_cross_entropy

    x_NH, t_N, w = inputs[:3]
    start = 0 if kind == "dense" else shard_bounds(s.V, s.P)[s.rank][0]
    if kind == "ring_dtp":
        return lambda: ring_dtp_cross_entropy(x_NH, t_N, w, group=group, vocab_start=start,
                                              vocab_blocks=s.vocab_blocks, mode=s.mode, vocab_size=s.V,
                                              n_max=s.N)
    if kind == "dense":
        return lambda: dense_cross_entropy(x_NH, t_N, w)
    return lambda: vocab_parallel_cross_entropy(x_NH, t_N, w, group=group, vocab_start=start)


def head_step(kind: str, s: HeadShape, *, device, group=None, seed: int | None = None):
    """Inputs of one rank and ``step()`` = ``loss.backward()`` (forward + backward)."""
    inputs = make_inputs(kind, s, device=device, seed=seed)
    f = loss_fn(kind, s, inputs, group)

    def step() -> None:
        f().backward()

    return inputs, step


def trace_head(kind: str, s: HeadShape):
    """Fake-tensor trace (``planner.runtime.trace.trace_rank``) of one rank's head step."""
    from planner.runtime import trace

    def build():
        return head_step(kind, s, device=trace.DEVICE)

    return trace.trace_rank(build, rank=s.rank, world_size=s.P)
