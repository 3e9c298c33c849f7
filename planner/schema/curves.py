"""Schema of the measured time-model curves stored under ``ClusterSpec.curves`` (DESIGN §4, §6).

Two kinds of curve:

- **Latency-bandwidth curves** (``BandwidthCurve``, ``ParamRateCurve``): measured points
  ``(x_i, t_i)`` and the fit ``t = latency_s + x / rate`` (``planner.timing.curves`` fits it by
  non-negative least squares). The measured times must not decrease with ``x`` beyond
  ``MONOTONE_NOISE_FRACTION``.
- **Rate tables** (``RateTable``): achieved FLOP/s on a regular grid of shapes, read by multilinear
  interpolation in log2 of every axis. They are not monotone (wave quantisation), so no monotonicity
  is imposed.

Every curve has a ``status`` and, when ``measured``, a ``provenance``; ``check_devices`` rejects a
curve measured on another device than the topology's ``gpu_name``. Lookups live in
``planner.timing.curves``; they raise ``ProfileGap`` outside the measured range.

The schema is torch-free and lives in ``planner/schema`` so that ``ClusterSpec`` can type its
``curves`` field without the schema importing ``planner.timing``.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_serializer, model_validator

from planner.schema.base import Frozen
from planner.schema.provenance import Provenance

MONOTONE_NOISE_FRACTION = 0.05
"""A latency-bandwidth curve is rejected when a measured time is more than 5% below the time
measured at a smaller size (``t[i+1] < (1 - 0.05) · max(t[:i+1])``): transfers never get faster
by moving more bytes, and medians of repeated runs are steadier than 5%."""

TABLE_AXES = {
    "gemm": ("m", "n", "k"),
    "gemm_fp32": ("m", "n", "k"),
    "grouped_gemm": ("tokens_per_group", "groups", "n", "k"),
    "attention_fwd": ("seq_len", "heads", "head_dim"),
    "attention_bwd": ("seq_len", "heads", "head_dim"),
}
"""Axis names each rate table of ``Curves`` must carry, in order."""

COLLECTIVES = ("all_to_all", "all_gather", "reduce_scatter", "p2p_ring")
"""Collectives measured under ``torchrun`` (``calibration.collectives``)."""


class Curve(Frozen):
    """Common fields of every curve: status, provenance and a note."""

    status: Literal["measured", "assumed"] = "measured"
    """``measured`` (with provenance) or ``assumed`` until it is."""
    provenance: Provenance | None = None
    """How it was measured; required when ``status == "measured"``."""
    note: str = ""
    """What was measured and how (backend, dtype, layout)."""

    @model_validator(mode="after")
    def _needs_provenance(self):
        if self.status == "measured" and self.provenance is None:
            raise ValueError("a measured curve must carry provenance (device, versions, date, command)")
        return self


def _check_points(x: list, t: list, x_name: str) -> None:
    if len(x) != len(t):
        raise ValueError(f"{x_name} has {len(x)} points but time_s has {len(t)}")
    if len(x) < 2:
        raise ValueError(f"{x_name} must hold at least 2 points for a latency-bandwidth fit")
    if any(b <= a for a, b in zip(x, x[1:])):
        raise ValueError(f"{x_name} must be strictly increasing")
    if any(not (v > 0 and math.isfinite(v)) for v in t):
        raise ValueError("time_s must be finite and > 0")
    worst = t[0]
    for xi, ti in zip(x[1:], t[1:]):
        if ti < (1.0 - MONOTONE_NOISE_FRACTION) * worst:
            raise ValueError(
                f"time_s must not decrease with {x_name} beyond {MONOTONE_NOISE_FRACTION:.0%} noise "
                f"({ti:.4g} s at {xi} is below {worst:.4g} s measured at a smaller size)")
        worst = max(worst, ti)


class BandwidthCurve(Curve):
    """Time to move ``size_bytes`` (a copy or a collective): ``t = latency_s + size / bytes_per_s``.

    ``size_bytes`` is per rank, in the convention the owning field states (``Curves``,
    ``CollectiveCurves``).
    """

    size_bytes: list[int]
    """Measured message sizes, bytes, strictly increasing."""
    time_s: list[float]
    """Median time at each size, seconds."""
    latency_s: float = Field(ge=0)
    """Fitted latency α, seconds (≥ 0)."""
    bytes_per_s: float = Field(gt=0)
    """Fitted bandwidth β, bytes/s (> 0)."""
    max_rel_residual: float = Field(ge=0)
    """Largest |fit − measured| / measured over the points."""
    group_size: int = Field(default=1, ge=1)
    """Ranks in the group (1 for host-device copies)."""

    @model_validator(mode="after")
    def _points(self):
        _check_points(self.size_bytes, self.time_s, "size_bytes")
        return self


class ParamRateCurve(Curve):
    """Time of an optimizer step over ``num_params`` parameters: ``t = latency_s + n / params_per_s``."""

    num_params: list[int]
    """Measured parameter counts, strictly increasing."""
    time_s: list[float]
    """Median step time at each count, seconds."""
    latency_s: float = Field(ge=0)
    """Fitted fixed cost per step, seconds."""
    params_per_s: float = Field(gt=0)
    """Fitted throughput, parameters/s."""
    max_rel_residual: float = Field(ge=0)
    """Largest |fit − measured| / measured over the points."""

    @model_validator(mode="after")
    def _points(self):
        _check_points(self.num_params, self.time_s, "num_params")
        return self


def _grid_shape(values) -> list[int]:
    shape = []
    while isinstance(values, list):
        shape.append(len(values))
        values = values[0] if values else None
    return shape


def _flatten(values) -> list:
    if isinstance(values, list):
        return [v for sub in values for v in _flatten(sub)]
    return [values]


class RateTable(Curve):
    """Achieved FLOP/s on a regular grid of shapes (``flops_per_s[i0][i1]...`` over ``axes``).

    FLOP conventions (``planner.timing.curves``): GEMM ``2·m·n·k``; grouped GEMM
    ``2·tokens_per_group·groups·n·k``; causal attention forward ``2·S²·h·d`` and backward
    ``5·S²·h·d`` (DESIGN §4: causal FLOPs grow with ``S²/2``).
    """

    axis_names: list[str]
    """Name of each axis, e.g. ``[m, n, k]``."""
    axes: list[list[int]]
    """Grid points of each axis, strictly increasing, all > 0."""
    flops_per_s: list
    """Nested lists of achieved FLOP/s, one level per axis."""
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Operand dtype."""
    backend: str = ""
    """Kernel path, e.g. ``torch.mm``, ``torch._grouped_mm``, ``SDPA flash``."""

    @model_validator(mode="after")
    def _grid(self):
        if len(self.axis_names) != len(self.axes):
            raise ValueError(f"axis_names has {len(self.axis_names)} names but axes has {len(self.axes)}")
        for name, pts in zip(self.axis_names, self.axes):
            if not pts or any(p <= 0 for p in pts) or any(b <= a for a, b in zip(pts, pts[1:])):
                raise ValueError(f"axis {name} must be non-empty, > 0 and strictly increasing")
        want = [len(p) for p in self.axes]
        got = _grid_shape(self.flops_per_s)
        flat = _flatten(self.flops_per_s)
        if got != want or len(flat) != math.prod(want):
            raise ValueError(f"flops_per_s must be a full grid of shape {want} (got {got})")
        if any(not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)) for v in flat):
            raise ValueError("flops_per_s must be finite and > 0 everywhere")
        return self


class CpuAdamWTable(Curve):
    """Host AdamW (torch fused CPU AdamW, fp32) seconds per parameter by thread count."""

    threads: list[int]
    """Thread counts measured (``torch.set_num_threads``), strictly increasing."""
    s_per_param: list[float]
    """Median seconds per parameter per step at each thread count."""
    num_params: int = Field(gt=0)
    """Parameters in the measured optimizer (its state far exceeds the last-level cache)."""

    @model_validator(mode="after")
    def _points(self):
        if len(self.threads) != len(self.s_per_param) or not self.threads:
            raise ValueError("threads and s_per_param must be non-empty and of equal length")
        if any(b <= a for a, b in zip(self.threads, self.threads[1:])) or self.threads[0] < 1:
            raise ValueError("threads must be ≥ 1 and strictly increasing")
        if any(not (v > 0 and math.isfinite(v)) for v in self.s_per_param):
            raise ValueError("s_per_param must be finite and > 0")
        return self


class ChunkCurve(Curve):
    """PipelinedLLEP step time against the chunk count ``K`` at one measured shape."""

    num_chunks: list[int]
    """Chunk counts ``K`` measured, strictly increasing."""
    time_s: list[float]
    """Median forward+backward time at each ``K``, seconds."""
    shape: dict[str, int] = Field(default_factory=dict)
    """The measured shape (tokens_per_rank, hidden_size, expert_ffn, num_experts, top_k,
    expert_parallel)."""
    fill_bytes: list[float] | None = None
    """Per ``K``: bytes read and written per forward+backward by the emulation's filled all-to-all
    outputs (``planner.runtime.emulated_fill``), which ``time_s`` includes and the operator does not
    (the time model takes them out at the ``copy`` class rate); None where nothing was filled."""

    @model_validator(mode="after")
    def _points(self):
        if len(self.num_chunks) != len(self.time_s) or not self.num_chunks:
            raise ValueError("num_chunks and time_s must be non-empty and of equal length")
        if self.fill_bytes is not None and (len(self.fill_bytes) != len(self.num_chunks)
                                            or any(not (b >= 0 and math.isfinite(b)) for b in self.fill_bytes)):
            raise ValueError("fill_bytes must have one finite value ≥ 0 per num_chunks entry")
        if any(b <= a for a, b in zip(self.num_chunks, self.num_chunks[1:])) or self.num_chunks[0] < 1:
            raise ValueError("num_chunks must be ≥ 1 and strictly increasing")
        if any(not (v > 0 and math.isfinite(v)) for v in self.time_s):
            raise ValueError("time_s must be finite and > 0")
        return self


DISPATCH_KERNEL_CLASSES = ("gather_dup", "gather_perm", "index_add_bf16", "index_add_bf16_perm", "index_add_fp32",
                           "index_copy", "zero", "route_weight", "row_sum", "copy", "silu", "mul_strided",
                           "silu_bwd", "cat", "add", "sort")
"""Memory-bound kernel classes of the dispatch operators (``planner.timing.dispatch_kernels``)."""
DISPATCH_GEMM_ROLES = ("up", "down", "g_down", "gh", "g_up", "gx")
"""Expert GEMMs as the runtime calls them: forward ``x@Wu``, ``h@Wd``; backward ``h.t()@go``,
``go@Wd.t()``, ``x.t()@ggu``, ``ggu@Wu.t()``."""
DISPATCH_HOST_LOOPS = ("grouped_fwd", "grouped_bwd", "chunk_fwd", "chunk_recompute", "chunk_bwd")
"""Per-block host loops: ``GroupedMLP`` forward/backward, ``ExpertChunk`` forward/recompute/backward."""


class KernelRate(Frozen):
    """One memory-bound kernel class timed at one shape."""

    kernel: str
    """What was timed (e.g. ``index_add_ bf16, k-dup (combine)``)."""
    seconds: float = Field(gt=0)
    """Median seconds of one call."""
    model_bytes: float = Field(gt=0)
    """Bytes the time model counts for that call (reads + writes)."""
    bytes_per_s: float = Field(gt=0)
    """``model_bytes / seconds``."""
    vs_reference: float = Field(gt=0)
    """``bytes_per_s`` over the curve's ``reference_bytes_per_s`` (same run)."""


class GemmLayout(Frozen):
    """One expert GEMM as the runtime calls it against ``A @ B`` (both row-major) at the same shape."""

    role: Literal["up", "down", "g_down", "gh", "g_up", "gx"]
    """Which expert GEMM (``DISPATCH_GEMM_ROLES``)."""
    m: int = Field(gt=0)
    """Rows of ``C[m,n] = A[m,k] @ B[k,n]``."""
    n: int = Field(gt=0)
    """Columns of ``C``."""
    k: int = Field(gt=0)
    """Reduction length."""
    runtime_s: float = Field(gt=0)
    """Seconds of the runtime's call (its operand layouts)."""
    nn_s: float = Field(gt=0)
    """Seconds of ``A[m,k] @ B[k,n]`` with fresh row-major operands (the GEMM table's layout)."""


class SustainedGemm(Frozen):
    """One bf16 GEMM timed in the calibration's short windows and in one long continuous run."""

    m: int = Field(gt=0)
    """Rows of ``C[m,n] = A[m,k] @ B[k,n]``."""
    n: int = Field(gt=0)
    """Columns of ``C``."""
    k: int = Field(gt=0)
    """Reduction length."""
    short_window_s: float = Field(gt=0)
    """Seconds per call in windows of ``short_window_len_s``."""
    short_window_len_s: float = Field(gt=0)
    """Length of one short window (the GEMM table's ``min_time_s``)."""
    continuous_s: float = Field(gt=0)
    """Seconds per call over a continuous run of ``continuous_len_s``."""
    continuous_len_s: float = Field(gt=0)
    """Length of the continuous run, seconds."""


class HostLoop(Frozen):
    """Host seconds of one block of a runtime loop (tiny rows: the host binds)."""

    s_per_block: float = Field(gt=0)
    """Wall seconds per block."""
    launches: int = Field(ge=1)
    """Kernel-launching torch calls per block in the time model."""


class DispatchKernelsCurve(Curve):
    """What the dispatch operators' kernels cost beyond the GEMM table (``calibration.dispatch_kernels``):
    memory-bound kernel classes relative to a fused GPU AdamW timed in the same run, the runtime's
    expert-GEMM layouts against ``NN``, the sustained-GEMM clock factor, and host seconds per block
    of each runtime loop and per kernel-launching call."""

    reference_bytes_per_s: float = Field(gt=0)
    """Fused GPU AdamW at 28 B/param, measured in the same run (the reference of ``vs_reference``)."""
    memory: dict[str, KernelRate]
    """By kernel class (``DISPATCH_KERNEL_CLASSES``)."""
    gemm_layouts: list[GemmLayout]
    """Runtime layouts vs ``NN`` at the measured ``(m, n, k)``."""
    sustained: SustainedGemm
    """Short windows vs a continuous run."""
    host_loops: dict[str, HostLoop]
    """By loop (``DISPATCH_HOST_LOOPS``)."""
    host_call_s: float = Field(gt=0)
    """Host seconds of one kernel-launching call (a tiny ``torch.mm`` loop)."""
    widths: dict[str, int] = Field(default_factory=dict)
    """Widths of the memory and GEMM rows (``H``, ``I``, ``k``, routes ``R``)."""

    @model_validator(mode="after")
    def _keys(self):
        bad = sorted(set(self.memory) - set(DISPATCH_KERNEL_CLASSES))
        if bad:
            raise ValueError(f"memory classes {bad} are not in {DISPATCH_KERNEL_CLASSES}")
        bad = sorted(set(self.host_loops) - set(DISPATCH_HOST_LOOPS))
        if bad:
            raise ValueError(f"host_loops {bad} are not in {DISPATCH_HOST_LOOPS}")
        return self


class MemorySizePoint(KernelRate):
    """One memory-bound kernel class timed at one size (``calibration.memory_sizes``); its
    ``vs_reference`` is over the fused GPU AdamW timed in the same call."""

    cls: str
    """Kernel class (``DISPATCH_KERNEL_CLASSES``)."""
    N: int = Field(ge=1)
    """Tokens of the timed call (``R = k·N`` routed rows)."""
    H: int = Field(ge=1)
    """Hidden width of the rows."""
    I: int = Field(ge=1)
    """Expert FFN width (the SiLU / cat classes' rows)."""
    k: int = Field(ge=1)
    """Routes per token."""


class MemorySizesCurve(Curve):
    """The dispatch's memory-bound kernel classes timed at several sizes in one process: what the
    time model scales a class's rate by between the bytes a call moves and the bytes its
    ``dispatch_kernels`` row was timed at (``planner.timing.memory_sizes``)."""

    points: list[MemorySizePoint]
    """Every class at every timed size."""

    @model_validator(mode="after")
    def _classes(self):
        bad = sorted({p.cls for p in self.points} - set(DISPATCH_KERNEL_CLASSES))
        if bad:
            raise ValueError(f"memory_sizes classes {bad} are not in {DISPATCH_KERNEL_CLASSES}")
        return self


class LongAttentionTable(Curve):
    """Causal attention seconds at long ``S`` for one runtime variant (``bench/calibrate_coverage.py``):
    forward and backward on a grid ``seq_len × heads`` (query heads per rank; ``kv_div`` query heads
    per key/value head), at the variant's exact widths, window and sink channels, through the
    kernel the runtime picks."""

    variant: str
    """``flash128``, ``mla``, ``sinks64``, ``sliding64`` …"""
    d_qk: int = Field(gt=0)
    """Query/key head width."""
    d_v: int = Field(gt=0)
    """Value head width."""
    window: int | None = None
    """Sliding window ``w`` (None: global causal)."""
    sinks: bool = False
    """gpt-oss's learned sink logit per head (sink channels)."""
    kv_div: int = Field(default=1, ge=1)
    """Query heads per key/value head (GQA)."""
    backend: str = ""
    """The kernel path timed."""
    seq_len: list[int]
    """Strictly increasing."""
    heads: list[int]
    """Strictly increasing."""
    fwd_s: list[list[float]]
    """``[seq][heads]`` forward seconds (no grad)."""
    bwd_s: list[list[float]]
    """``[seq][heads]`` backward seconds (gradients of q, k, v and the sinks)."""

    @model_validator(mode="after")
    def _grid(self):
        for name, ax in (("seq_len", self.seq_len), ("heads", self.heads)):
            if not ax or any(b <= a for a, b in zip(ax, ax[1:])) or ax[0] < 1:
                raise ValueError(f"{name} must be non-empty, ≥ 1 and strictly increasing")
        for name, t in (("fwd_s", self.fwd_s), ("bwd_s", self.bwd_s)):
            if len(t) != len(self.seq_len) or any(len(r) != len(self.heads) for r in t):
                raise ValueError(f"{name} must be [len(seq_len)][len(heads)]")
            if any(not (v > 0 and math.isfinite(v)) for r in t for v in r):
                raise ValueError(f"{name} must be finite and > 0")
        return self


class SCORow(Frozen):
    """Plain checkpointing against SCO (every boundary offloaded) on one decoder shape."""

    config: str
    """Name of the decoder interior (``copy-bound``, ``balanced``, ``compute-bound``)."""
    boundary_bytes: int = Field(gt=0)
    """Bytes of one region boundary ``b_h``."""
    num_boundaries: int = Field(gt=0)
    """``L_b``, every one offloaded."""
    plain_step_s: float = Field(gt=0)
    """Forward + backward under plain per-region checkpointing."""
    sco_step_s: float = Field(gt=0)
    """The same under SCO."""
    forward_s: float = Field(gt=0)
    """The forward under no_grad (≈ the recompute of every region)."""
    d2h_s: float = Field(ge=0)
    """One boundary's D2H into pinned memory."""
    h2d_s: float = Field(ge=0)
    """One boundary's H2D from pinned memory."""


class SCOCurve(Curve):
    """SCO's step-time cost against plain checkpointing (``bench/calibrate_coverage.py``'s ``sco``)."""

    rows: list[SCORow]
    """One row per decoder interior."""


class BaselineHostRow(Frozen):
    """Host seconds of one FSDP2 baseline step outside the expert loops (``calibration.step_host``)."""

    model: str
    """The shipped model whose structure was run (widths shrunk, counts kept)."""
    ac: Literal["full", "selective", "none"]
    """The baseline's activation checkpointing in the run."""
    tokens: int = Field(gt=0)
    """Tokens of the step (one sequence)."""
    attention: str
    """The model's attention kind (``gqa``, ``mla``): the nearest-structure lookup's first key after ``ac``."""
    num_experts: int = Field(ge=0)
    """``E`` of the model (every expert one block of the loops)."""
    top_k: int = Field(ge=0)
    """``k`` of the model."""
    layer_fwd_s: dict[str, float]
    """One layer's forward by layer kind (``moe``, ``dense``), FSDP2's hooks included."""
    layer_bwd_s: dict[str, float]
    """One layer's backward by layer kind, its recompute included."""
    head_s: float = Field(ge=0)
    """The head phase: final norm, head GEMM, loss and their backward."""
    optimizer_s: float = Field(ge=0)
    """``optimizer.step()`` + ``zero_grad``."""
    embedding_s: float = Field(ge=0)
    """The step's start to the first layer (the embedding and its FSDP unit)."""
    loop_fwd_s_per_block: float = Field(ge=0)
    """``GroupedMLP.forward`` seconds per block in the same step (for comparison with
    ``dispatch_kernels.host_loops``)."""
    loop_bwd_s_per_block: float = Field(ge=0)
    """``GroupedMLP.backward`` seconds per block in the same step."""
    launches: dict[str, int] = Field(default_factory=dict)
    """Kernel-launching calls counted outside the expert loops per phase (``layer_fwd:<kind>``,
    ``layer_bwd:<kind>``, ``head``, ``optimizer``, ``embedding``; ``planner.timing.baseline_host``):
    empty in a profile calibrated before they were counted."""

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """Left out of the dump while empty, so a profile calibrated before the count keeps its
        checksum (plan files name it, ``planner.schema.cluster_ref``)."""
        out = handler(self)
        if not self.launches:
            out.pop("launches", None)
        return out


class BaselineHostCurve(Curve):
    """The FSDP2 baseline step's host seconds at tiny widths (``planner.timing.baseline_host``: added
    to each segment's GPU seconds)."""

    rows: list[BaselineHostRow]
    """One row per (model structure, ``ac``) measured."""


class CollectiveCurves(Frozen):
    """NCCL collective curves by group size (the dict key). ``size_bytes`` conventions:

    - ``all_to_all``: bytes each rank sends (its whole input buffer, its own share included);
    - ``all_gather``: bytes of the gathered output on each rank (group size × shard);
    - ``reduce_scatter``: bytes of the input on each rank (group size × shard);
    - ``p2p_ring``: bytes each rank sends to its next neighbour while receiving as many from its
      previous one (one ring hop, ``batch_isend_irecv``).
    """

    all_to_all: dict[int, BandwidthCurve] = Field(default_factory=dict)
    """``all_to_all_single`` with even splits."""
    all_gather: dict[int, BandwidthCurve] = Field(default_factory=dict)
    """All-gather into one tensor."""
    reduce_scatter: dict[int, BandwidthCurve] = Field(default_factory=dict)
    """Sum reduce-scatter from one tensor (bf16)."""
    p2p_ring: dict[int, BandwidthCurve] = Field(default_factory=dict)
    """One simultaneous send to the next rank and receive from the previous rank."""

    @model_validator(mode="after")
    def _keys(self):
        for name in COLLECTIVES:
            for g, curve in getattr(self, name).items():
                if g < 2 or curve.group_size != g:
                    raise ValueError(f"{name}[{g}] must be keyed by its group_size ({curve.group_size}) ≥ 2")
        return self


class Curves(Frozen):
    """All time-model curves of a cluster profile; ``None`` means not measured (a ``ProfileGap``
    when the time model needs it)."""

    gemm: RateTable | None = None
    """Dense GEMM ``C[m,n] = A[m,k] @ B[k,n]``, axes ``m, n, k`` (bf16 on a GPU; fp32 in the CPU
    profile, whose ``dtype`` says so)."""
    gemm_fp32: RateTable | None = None
    """Dense fp32 GEMM with TF32 off (``torch.backends.cuda.matmul.allow_tf32 = False``), axes
    ``m, n, k``: the rate of the fp32 vocabulary heads (``calibration.compute.gemm_fp32_table``)."""
    grouped_gemm: RateTable | None = None
    """Grouped expert GEMM, axes ``tokens_per_group, groups, n, k``."""
    attention_fwd: RateTable | None = None
    """Causal SDPA flash forward, axes ``seq_len, heads, head_dim`` (batch 1, heads = kv heads)."""
    attention_bwd: RateTable | None = None
    """Causal SDPA flash backward (dq, dk, dv), same axes."""
    h2d: BandwidthCurve | None = None
    """Pinned host-to-device copy, bytes per copy."""
    d2h: BandwidthCurve | None = None
    """Device-to-pinned-host copy, bytes per copy."""
    bidir: BandwidthCurve | None = None
    """H2D and D2H at once on two streams; ``size_bytes`` moved each way, time until both end."""
    gpu_adamw: ParamRateCurve | None = None
    """``torch.optim.AdamW(fused=True)`` on fp32 device parameters."""
    cpu_adamw: CpuAdamWTable | None = None
    """``torch.optim.AdamW(fused=True)`` on fp32 host parameters, by thread count."""
    cpu_cast: CpuAdamWTable | None = None
    """Host bf16→fp32 upcast + fp32→bf16 downcast (CPUOffloadAdamW's casts), seconds per element,
    by thread count."""
    collectives: CollectiveCurves = Field(default_factory=CollectiveCurves)
    """NCCL collectives by group size (``torchrun``, W > 1)."""
    chunk_count: ChunkCurve | None = None
    """PipelinedLLEP time against chunk count (``calibration.chunks``)."""
    dispatch_kernels: DispatchKernelsCurve | None = None
    """Dispatch operators' kernel rates, layouts and host loops (``calibration.dispatch_kernels``)."""
    dispatch_kernels_widths: list[DispatchKernelsCurve] = Field(default_factory=list)
    """The same at other ``(H, I, k)`` (each curve's ``widths``): the time model reads the one of the
    layer's widths (``planner.timing.kernel_rates.at_width``)."""
    memory_sizes: MemorySizesCurve | None = None
    """Memory-bound dispatch kernels at several sizes (``calibration.memory_sizes``)."""
    attention_long: dict[str, LongAttentionTable] = Field(default_factory=dict)
    """Long-``S`` causal attention by runtime variant (``planner.timing.compute.attention_s``)."""
    sco: SCOCurve | None = None
    """SCO against plain checkpointing (``planner.timing.offload.sco_exposed_s``)."""
    baseline_host: BaselineHostCurve | None = None
    """Host seconds of the FSDP2 baseline step outside the expert loops (``calibration.step_host``)."""

    @model_validator(mode="after")
    def _axes(self):
        for name, want in TABLE_AXES.items():
            table = getattr(self, name)
            if table is not None and tuple(table.axis_names) != want:
                raise ValueError(f"{name}.axis_names must be {list(want)} (got {table.axis_names})")
        if self.gemm_fp32 is not None and self.gemm_fp32.dtype != "fp32":
            raise ValueError(f"gemm_fp32.dtype must be fp32 (got {self.gemm_fp32.dtype})")
        return self

    def named(self) -> list[tuple[str, Curve]]:
        """Every present curve with its dotted path (``collectives.all_to_all.2``)."""
        out: list[tuple[str, Curve]] = []
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, Curve):
                out.append((name, v))
        out += [(f"dispatch_kernels_widths.{i}", c) for i, c in enumerate(self.dispatch_kernels_widths)]
        out += [(f"attention_long.{k}", c) for k, c in sorted(self.attention_long.items())]
        for coll in COLLECTIVES:
            for g, curve in sorted(getattr(self.collectives, coll).items()):
                out.append((f"collectives.{coll}.{g}", curve))
        return out


def check_devices(curves: Curves, gpu_name: str) -> None:
    """Every measured curve must come from ``gpu_name`` (``topology.gpu_name``).

    Raises:
        InvalidPlan: ``curves.<name>.provenance.device (...) must equal topology.gpu_name (...)``.
    """
    from planner.errors import InvalidPlan

    for name, curve in curves.named():
        if curve.provenance is not None and curve.provenance.device != gpu_name:
            raise InvalidPlan(f"curves.{name}.provenance.device", curve.provenance.device,
                              f"must equal topology.gpu_name ({gpu_name!r})",
                              "calibrate on this GPU model, or fix topology.gpu_name")
