"""The step-time model (DESIGN §4): one optimizer step, built phase by phase, vectorised over the
search candidates of a ``Ctx``.

Legend (DESIGN §1): ``M`` micro-steps per optimizer step, ``F_x``/``R_x``/``B_x`` the forward,
recompute and backward seconds of a region of kind ``x`` (``attention``, ``moe``, ``dense_mlp``),
``G_x``/``RS_x`` the ZeRO-3 all-gather of its dense weights and the reduce-scatter of their
gradients (plus the expert replicas' reduce-scatter for ``moe``).

Composed stack, one micro-step (per layer ``ℓ`` with FFN kind ``f``):

    forward[ℓ]    max(F_attn, G_f) + max(F_f, G_attn)          ZeRO-3 prefetch of the next region
    head          max(T_head, G_head + RS_head)                 vocabulary operator (ops.py)
    backward[ℓ]   max(R_f + B_f, G_attn + RS_attn) + max(R_attn + B_attn, G_f + RS_f)
    + the embedding's gather and reduce-scatter (exposed), + SCO's exposed copies (offload.py)

``R_x = F_x`` under per-layer checkpointing and SCO (each region's forward runs twice, its
all-to-alls included), 0 without checkpointing; PipelinedLLEP's inner recompute is inside ``B_moe``
(``dispatch.py``), so its up projection runs 3 times. Then once per optimizer step the optimizer
(``offload.py``). ``total = M·micro_step + optimizer``. Every ``max(compute, comm)`` is booked as
the compute plus an exposed communication term, so the ``breakdown`` sums to ``total_s``.

The FSDP2 baseline (``baseline.py``) has the same outer shape with one region per layer.

Invariants checked on every evaluation (STYLE §9): ``E_p = 1`` means zero dispatch traffic; no
optimizer offload means zero host optimizer time; every component is ≥ 0 where finite.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.context.ctx import Ctx
from planner.timing.compute import Lookups


@dataclass
class StepTime:
    """Predicted time of one optimizer step, per candidate (arrays of the candidates' shape)."""

    total_s: np.ndarray
    """One optimizer step (all micro-steps + optimizer); NaN where a curve has a gap."""
    micro_step_s: np.ndarray
    """One micro-step (forward + head + backward)."""
    optimizer_s: np.ndarray
    """The optimizer step."""
    tokens_per_step: np.ndarray
    """Distinct tokens per rank per optimizer step."""
    model_flops: np.ndarray
    """Useful FLOPs per rank per step (no recompute), for TFLOP/s/GPU (``flops.model_flops``)."""
    breakdown: dict[str, np.ndarray] = field(default_factory=dict)
    """Named components in seconds per optimizer step; they sum to ``total_s``."""
    gaps: list[str] = field(default_factory=list)
    """``ProfileGap`` messages (curve, value, range) that made entries NaN."""
    assumed: list[str] = field(default_factory=list)
    """Assumed constants, curves and rules the prediction used."""
    recompute: dict[str, np.ndarray] = field(default_factory=dict)
    """The part of each ``breakdown`` compute entry that is recompute (checkpointed forwards run
    again), seconds per optimizer step."""
    phases: dict[str, np.ndarray] = field(default_factory=dict)
    """The same seconds by the phase kind they are booked in (``PHASES``: ``forward``, ``head``,
    ``backward`` with its recompute, ``optimizer``, ``other`` for the embedding's collectives), per
    optimizer step; they sum to ``total_s``. ``planner validate`` prints them beside the measured
    phase windows."""

    @property
    def components(self) -> dict[str, np.ndarray]:
        """``breakdown`` grouped as ``COMPONENTS`` plus ``recompute`` (taken out of the compute and
        attention entries it belongs to) and ``communication`` (every other entry); sums to
        ``total_s``."""
        out = {name: np.zeros(np.shape(self.total_s)) for name in (*COMPONENTS, "recompute", "communication")}
        where = {k: name for name, keys in COMPONENTS.items() for k in keys}
        for k, v in self.breakdown.items():
            rec = self.recompute.get(k, 0.0) if where.get(k) in ("compute", "attention") else 0.0
            out[where.get(k, "communication")] = out[where.get(k, "communication")] + v - rec
            out["recompute"] = out["recompute"] + rec
        return out

    @property
    def tokens_per_s(self) -> np.ndarray:
        """Tokens per second per GPU."""
        return self.tokens_per_step / self.total_s

    @property
    def tflops_per_gpu(self) -> np.ndarray:
        """Model TFLOP/s per GPU."""
        return self.model_flops / self.total_s / 1e12


COMPONENTS = {
    "compute": ("compute_dense", "compute_experts", "compute_head", "elementwise"),
    "attention": ("compute_attention",),
    "optimizer": ("optimizer_gpu", "optimizer_stream", "optimizer_cpu_host"),
    "copies": ("sco_exposed", "optimizer_cpu_copies", "cpu_offload_copies"),
    "host": ("host_exposed",),
}
"""``StepTime.components``: breakdown entries by component (the rest is ``communication``)."""


PHASES = ("forward", "head", "backward", "optimizer", "other")
"""Phase kinds of ``StepTime.phases`` (DESIGN §3.1's phases summed by kind; ``other``: what runs
outside every region, the embedding's collectives and host work), as
``planner.runtime.phase_times.grouped`` sums the measured windows."""


class Book:
    """Accumulates named seconds (arrays broadcast to the candidates' shape), and the same seconds by
    phase kind (``PHASES``): each booking names its phase, else the book's ``phase``."""

    def __init__(self, shape: tuple, phase: str = "other") -> None:
        assert phase in PHASES, phase
        self.shape = shape
        self.phase = phase
        self.parts: dict[str, np.ndarray] = {}
        self.recompute: dict[str, np.ndarray] = {}
        self.by_phase: dict[str, np.ndarray] = {}

    def note_recompute(self, pieces: dict, times=1.0) -> None:
        """Record the recompute share of booked compute pieces (already in ``parts``): the
        ``recompute`` component of ``components``."""
        for k, v in pieces.items():
            self.recompute[k] = self.recompute.get(k, np.zeros(self.shape)) + np.broadcast_to(
                np.asarray(v, dtype=float) * times, self.shape)

    def add(self, name: str, seconds, times=1.0, phase: str | None = None) -> None:
        """Book ``seconds × times`` under ``name``, in ``phase`` (default: the book's)."""
        phase = self.phase if phase is None else phase
        assert phase in PHASES, phase
        v = np.broadcast_to(np.asarray(seconds, dtype=float) * times, self.shape)
        self.parts[name] = self.parts.get(name, np.zeros(self.shape)) + v
        self.by_phase[phase] = self.by_phase.get(phase, np.zeros(self.shape)) + v

    def overlap(self, compute: dict, comm, name: str, times=1.0, phase: str | None = None) -> np.ndarray:
        """Book ``max(Σ compute, comm)`` in ``phase``: every compute piece, plus the exposed ``comm``
        under ``name``. Returns the phase's seconds."""
        total = sum(np.asarray(v, dtype=float) for v in compute.values())
        for k, v in compute.items():
            self.add(k, v, times, phase)
        self.add(name, np.maximum(0.0, np.asarray(comm, dtype=float) - total), times, phase)
        return np.maximum(total, comm)

    def total(self) -> np.ndarray:
        return sum(self.parts.values(), np.zeros(self.shape))


NUMERIC_FIELDS = ("tokens_per_rank", "seq_len", "seqs_per_microbatch", "seq_parallel", "expert_parallel",
                  "vocab_parallel", "vocab_blocks", "token_budget", "num_chunks", "chunk_tokens",
                  "bucket_params", "staging_slots", "sco_host_bytes", "num_offloaded", "tp", "cp",
                  "dp_shard", "ep", "max_imports")


def candidates_shape(ctx: Ctx) -> tuple:
    """Broadcast shape of the context's numeric fields (``()`` for one configuration)."""
    return np.broadcast(*[np.asarray(getattr(ctx, f)) for f in NUMERIC_FIELDS]).shape


def micro_steps(ctx: Ctx, tokens_per_micro_step) -> np.ndarray:
    """``M``: micro-steps per optimizer step, from ``ctx.notes["global_batch_tokens"]`` (1 when
    absent): ``ceil(T / (W·n))`` with ``n`` distinct tokens per rank per micro-step."""
    T = ctx.notes.get("global_batch_tokens") if ctx.notes else None
    if not T:
        return np.ones(np.shape(tokens_per_micro_step))
    per = ctx.world_size * np.asarray(tokens_per_micro_step, dtype=float)
    return np.maximum(1.0, np.ceil(T / per))


def step_time(ctx: Ctx, *, strict: bool = False, micro_steps_override=None) -> StepTime:
    """Predicted optimizer-step time of every candidate in ``ctx`` (module docstring).

    Args:
        ctx: the resolved context (numeric fields may be candidate arrays).
        strict: raise ``ProfileGap`` instead of returning NaN where a curve has no measurement.
        micro_steps_override: ``M`` (default from ``ctx.notes["global_batch_tokens"]``, else 1).
    Raises:
        ProfileGap: with ``strict``, the first shape outside a measured curve.
    """
    from planner.timing import baseline, composed

    lk = Lookups(ctx.cluster, strict=strict)
    shape = candidates_shape(ctx)
    micro, opt = Book(shape), Book(shape, phase="optimizer")
    if ctx.stack == "composed":
        tokens, flops = composed.build(ctx, lk, micro, opt)
    else:
        tokens, flops = baseline.build(ctx, lk, micro, opt)
    M = np.broadcast_to(np.asarray(micro_steps_override if micro_steps_override is not None
                                   else micro_steps(ctx, tokens), dtype=float), shape)
    breakdown = {k: v * M for k, v in micro.parts.items()}
    recompute = {k: v * M for k, v in micro.recompute.items()}
    for k, v in opt.parts.items():
        breakdown[k] = breakdown.get(k, np.zeros(shape)) + v
    phases = {p: M * micro.by_phase.get(p, 0.0) + opt.by_phase.get(p, 0.0) for p in PHASES}
    micro_s, opt_s = micro.total(), opt.total()
    total = M * micro_s + opt_s
    _check_invariants(ctx, breakdown)
    return StepTime(total_s=total, micro_step_s=micro_s, optimizer_s=opt_s,
                    tokens_per_step=np.broadcast_to(M * np.asarray(tokens, dtype=float), shape).copy(),
                    model_flops=np.broadcast_to(M * np.asarray(flops, dtype=float), shape).copy(),
                    breakdown=breakdown, gaps=list(lk.gaps), assumed=lk.assumed, recompute=recompute,
                    phases={p: np.broadcast_to(v, shape).copy() for p, v in phases.items()})


def _check_invariants(ctx: Ctx, breakdown: dict) -> None:
    """STYLE §9 invariants (bugs, so asserts)."""
    for name, v in breakdown.items():
        ok = np.isnan(v) | (v >= 0)
        assert np.all(ok), f"negative time component {name}"
    if "a2a_dispatch" in breakdown:       # models without MoE layers have no dispatch component
        a2a, ep = np.broadcast_arrays(np.asarray(breakdown["a2a_dispatch"]),
                                      np.asarray(ctx.expert_parallel if ctx.stack == "composed" else ctx.ep))
        assert np.all(a2a[ep == 1] == 0), "E_p = 1 must move no dispatch traffic"
    host = [k for k in ("optimizer_stream", "optimizer_cpu_host", "optimizer_cpu_copies", "cpu_offload_copies")
            if k in breakdown]
    offload = ctx.optimizer != "gpu" if ctx.stack == "composed" else bool(ctx.cpu_offload)
    if not offload:
        assert all(np.all(breakdown[k] == 0) for k in host), "no offload must mean no host optimizer time"
