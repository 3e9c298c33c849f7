"""Measurement grids of each calibration mode.

- ``FULL`` (GPU, default): the grids the planner's GEMMs need. Axes cover attention projections
  (tokens × H-sized weights, MLA ranks 512/1536), weight gradients (``k`` = tokens up to 65,536),
  expert grouped GEMMs from 16 to 16,384 tokens per expert, and vocabulary strips (``n`` up to
  32,768 = V/P for V ≈ 200k, P ≥ 8). Budget ≤ 3 minutes on one H200.
- ``QUICK`` (GPU, ``--quick``): a coarse subset, about a minute.
- ``CPU`` (no GPU, ``--quick``): the small CPU profile CI uses: CPU GEMM rates and CPU AdamW.
- ``SMOKE`` (``--smoke``): every section at tiny shapes on any device, to exercise the code paths.

The fp32 GEMM grid (``gemm_fp32_*``, TF32 off: the rate of the fp32 vocabulary heads) covers
``m`` 1k..16k, ``n`` 2k..32k, ``k`` 1k..16k; larger strips (``n = V/(P·B_v)`` up to 200k, ``m = N``
or ``V_b`` rows, ``k = N`` or ``V_b`` in the backward) are timed by ``planner.timing.compute`` as
blocks of the largest measured size (GEMMs are separable along every axis; the rate is saturated
there). It costs ``≈ 5 calls · 2·Σm·Σn·Σk ≈ 4.3·10^14`` FLOPs, about 9 s at the H200's ~48 TFLOP/s fp32.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

GPU_SECTIONS = ("constants", "gemm", "gemm_fp32", "grouped_gemm", "attention", "transfer", "gpu_adamw",
                "cpu_adamw", "cpu_cast", "fragmentation", "host_copy", "chunk_count", "dispatch_kernels",
                "memory_sizes", "dispatch_widths", "sco", "baseline_host", "attention_long")
"""Sections of a GPU calibration, in run order (constants first: before anything is cached).
``dispatch_kernels`` (``calibration.dispatch_kernels``, ~15 s on an H200) and ``memory_sizes``
(``calibration.memory_sizes``) run their own fixed shapes in every GPU grid; the last four are
``calibration.coverage_sections.SECTIONS`` (every width, SCO, the FSDP2 host rows, long-context
attention), each under a wall budget."""

CPU_SECTIONS = ("gemm", "cpu_adamw", "cpu_cast", "host_copy")
"""Sections of the CPU-only quick profile."""


def thread_counts(cores: int, smoke: bool = False) -> tuple[int, ...]:
    """Powers of two up to the host's cores, plus the core count itself."""
    cores = max(1, cores)
    out = {1, cores}
    t = 2
    while t < cores:
        out.add(t)
        t *= 2
    if smoke:
        out = {1, min(2, cores)}
    return tuple(sorted(out))


@dataclass(frozen=True)
class Grid:
    """Shapes and repetition settings of one calibration mode."""

    name: str
    sections: tuple[str, ...]
    gemm_m: tuple[int, ...]
    gemm_n: tuple[int, ...]
    gemm_k: tuple[int, ...]
    grouped_tokens: tuple[int, ...]
    grouped_groups: tuple[int, ...]
    grouped_nk: tuple[int, ...]
    attn_seq: tuple[int, ...]
    attn_heads: tuple[int, ...]
    attn_head_dim: tuple[int, ...]
    transfer_bytes: tuple[int, ...]
    gpu_adamw_params: tuple[int, ...]
    cpu_adamw_params: int
    cpu_threads: tuple[int, ...]
    pin_bytes: int
    host_copy_bytes: int
    frag_tokens: int
    frag_hidden: int
    frag_layers: int
    min_time_s: float = 1e-3
    """Each timed window lasts at least this long (repeated calls)."""
    iters: int = 3
    """Timed windows per point; the median is kept."""
    extra: dict = field(default_factory=dict)
    gemm_fp32_m: tuple[int, ...] = ()
    """fp32 GEMM (TF32 off) ``m`` axis; empty: not measured (``calibration.compute.gemm_fp32_table``)."""
    gemm_fp32_n: tuple[int, ...] = ()
    gemm_fp32_k: tuple[int, ...] = ()


HOST_TABLE_PARAMS = 10**9
"""Parameters of the full grid's host AdamW and cast tables: the count the CPUOffloadAdamW benches
run at, where the state is far larger than the last-level cache (at 3.4·10^7 the rate read off the
table was the cache's)."""

FP32_M = (1024, 4096, 16384)
FP32_N = (2048, 4096, 8192, 16384, 32768)
FP32_K = (1024, 2048, 4096, 8192, 16384)
"""The FULL fp32 GEMM grid (vocabulary strips; see the module docstring)."""

_CORES = os.cpu_count() or 1

FULL = Grid(
    name="full",
    sections=GPU_SECTIONS,
    gemm_m=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
    gemm_n=(256, 512, 1024, 2048, 4096, 7168, 8192, 16384, 32768),
    gemm_k=(256, 512, 1024, 2048, 4096, 7168, 8192, 16384, 32768, 65536),
    grouped_tokens=(16, 64, 256, 1024, 4096, 16384),
    grouped_groups=(1, 4, 16, 64),
    grouped_nk=(512, 1024, 2048, 4096, 7168),
    attn_seq=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
    attn_heads=(1, 4, 16, 64),
    attn_head_dim=(64, 128, 192),
    transfer_bytes=tuple(1 << e for e in range(16, 33, 2)),  # 64 KiB .. 4 GiB
    gpu_adamw_params=tuple(1 << e for e in range(20, 29, 2)),  # 1M .. 256M
    cpu_adamw_params=HOST_TABLE_PARAMS,
    cpu_threads=thread_counts(_CORES),
    pin_bytes=1 * GiB,
    host_copy_bytes=1 * GiB,
    frag_tokens=16384,
    frag_hidden=7168,
    frag_layers=8,
    gemm_fp32_m=FP32_M,
    gemm_fp32_n=FP32_N,
    gemm_fp32_k=FP32_K,
)

QUICK = Grid(
    name="quick",
    sections=GPU_SECTIONS,
    gemm_m=(256, 2048, 16384),
    gemm_n=(1024, 4096, 16384),
    gemm_k=(1024, 4096, 16384),
    grouped_tokens=(64, 1024, 8192),
    grouped_groups=(4, 16),
    grouped_nk=(2048, 7168),
    attn_seq=(2048, 8192, 32768),
    attn_heads=(4, 32),
    attn_head_dim=(64, 128),
    transfer_bytes=tuple(1 << e for e in range(18, 31, 4)),  # 256 KiB .. 1 GiB
    gpu_adamw_params=(1 << 20, 1 << 24, 1 << 27),
    cpu_adamw_params=1 << 24,
    cpu_threads=thread_counts(_CORES),
    pin_bytes=256 * MiB,
    host_copy_bytes=256 * MiB,
    frag_tokens=8192,
    frag_hidden=4096,
    frag_layers=4,
    gemm_fp32_m=(1024, 16384),
    gemm_fp32_n=(2048, 32768),
    gemm_fp32_k=(1024, 16384),
)

CPU = Grid(
    name="cpu-quick",
    sections=CPU_SECTIONS,
    gemm_m=(64, 256, 512),
    gemm_n=(128, 512),
    gemm_k=(128, 512),
    grouped_tokens=(16,),
    grouped_groups=(1,),
    grouped_nk=(64,),
    attn_seq=(128,),
    attn_heads=(1,),
    attn_head_dim=(64,),
    transfer_bytes=(),
    gpu_adamw_params=(),
    cpu_adamw_params=1 << 21,
    cpu_threads=thread_counts(_CORES),
    pin_bytes=0,
    host_copy_bytes=64 * MiB,
    frag_tokens=0,
    frag_hidden=0,
    frag_layers=0,
    min_time_s=5e-3,
)

SMOKE = Grid(
    name="smoke",
    sections=GPU_SECTIONS,
    gemm_m=(16, 64),
    gemm_n=(32, 64),
    gemm_k=(32, 64),
    grouped_tokens=(16, 32),
    grouped_groups=(1, 2),
    grouped_nk=(32, 64),
    attn_seq=(64, 128),
    attn_heads=(1, 2),
    attn_head_dim=(16, 32),
    transfer_bytes=(1 << 12, 1 << 16, 1 << 20),
    gpu_adamw_params=(1 << 12, 1 << 20),  # 256× apart: the fit needs time to grow with size under CPU load
    cpu_adamw_params=1 << 16,
    cpu_threads=thread_counts(_CORES, smoke=True),
    pin_bytes=1 * MiB,
    host_copy_bytes=4 * MiB,
    frag_tokens=64,
    frag_hidden=32,
    frag_layers=2,
    min_time_s=2e-4,
    iters=2,
    gemm_fp32_m=(16, 64),
    gemm_fp32_n=(32, 64),
    gemm_fp32_k=(32, 64),
)


API_NAMES = {"only": "only", "budget": "budgets[{section!r}]"}
"""How ``check_request`` names the arguments of ``calibration.run``."""
FLAG_NAMES = {"only": "--sections", "budget": "--attention-budget-s"}
"""How it names the command-line flags (``planner calibrate``, ``python3 -m calibration``; only the
long-context attention's budget has a flag)."""


def check_request(only, budgets, grid: Grid, cuda: bool, names: dict = API_NAMES) -> None:
    """Validate ``run``'s ``only`` and ``budgets`` before anything is measured or written.

    Args:
        only: ``None`` (every section of the grid) or a tuple/list of section names.
        budgets: ``None`` or a mapping ``{section: seconds or None}``.
        grid, cuda: the grid this machine runs; with it, every requested section must be one it
            measures here (a CUDA-only section needs CUDA).
        names: how the errors name the arguments (``API_NAMES`` or ``FLAG_NAMES``).
    Raises:
        InvalidPlan: naming the argument, the value and the fix.
    """
    import difflib
    import math

    from calibration.coverage_sections import BUDGETED
    from planner.errors import InvalidPlan

    oname = names["only"]
    if only is not None:
        if isinstance(only, (str, bytes)) or not isinstance(only, (tuple, list)):
            raise InvalidPlan(oname, only, f"must be a tuple of section names, not {type(only).__name__}",
                              "e.g. ('sco', 'attention_long')" if oname == "only" else "e.g. sco,attention_long")
        if not only:
            raise InvalidPlan(oname, "", "names no section", "give a comma-separated list, e.g. sco,attention_long")
        for s in only:
            if not isinstance(s, str) or s not in GPU_SECTIONS:
                near = difflib.get_close_matches(str(s).lower(), GPU_SECTIONS, n=1)
                raise InvalidPlan(oname, s, "is not a calibration section",
                                  (f"did you mean {near[0]}? " if near else "") + f"use some of {', '.join(GPU_SECTIONS)}")
        for s in only:
            if s not in grid.sections or (not cuda and s in CUDA_ONLY):
                here = [x for x in grid.sections if cuda or x not in CUDA_ONLY]
                raise InvalidPlan(oname, s, f"is not measured by the {grid.name} grid on this machine"
                                  + ("" if cuda else " (no CUDA device)"),
                                  f"use some of {', '.join(here)}" + ("" if cuda else ", or run on a GPU"))
    if budgets is None:
        return
    if not isinstance(budgets, dict):
        raise InvalidPlan("budgets", budgets, f"must be a mapping of section to seconds, not {type(budgets).__name__}",
                          "e.g. {'attention_long': 240}")
    for k, v in budgets.items():
        field = names["budget"].format(section=k)
        if k not in BUDGETED:
            raise InvalidPlan("budgets", k, "names no section with a wall budget", f"use one of {', '.join(BUDGETED)}")
        if v is None:
            continue
        try:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)) and v > 0
        except OverflowError:
            ok = False
        if not ok:
            raise InvalidPlan(field, v, "must be a positive finite number of seconds", "e.g. 240")
        if only is not None and k not in only:
            raise InvalidPlan(field, v, f"does not apply: {k} is not among the sections run",
                              f"add {k} to the sections, or drop the budget")


CUDA_ONLY = ("constants", "fragmentation", "dispatch_kernels", "memory_sizes")
"""Sections that need a CUDA device (the others run on the CPU too, at the smoke shapes)."""


def choose(*, quick: bool, smoke: bool, cuda: bool) -> Grid:
    """The grid for this run.

    Raises:
        InvalidPlan: a full calibration asked for on a machine without a CUDA device.
    """
    if smoke:
        return SMOKE
    if not cuda:
        if not quick:
            from planner.errors import InvalidPlan

            raise InvalidPlan("--quick", False, "must be set on a machine without a CUDA device",
                              "pass --quick for the small CPU profile, or run on a GPU")
        return CPU
    return QUICK if quick else FULL
