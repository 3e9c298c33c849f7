"""Optimizer-step rates: fused GPU AdamW by parameter count, fused CPU AdamW by thread count.

- GPU: ``torch.optim.AdamW([p], fused=True)`` on one flat fp32 parameter of ``n`` elements with an
  fp32 gradient (state: exp_avg, exp_avg_sq), timed per ``step()``; fitted ``t = α + n/β``.
- CPU: ``torch.optim.AdamW([p], fused=True)`` on a host fp32 parameter of ``grid.cpu_adamw_params``
  elements (state ≫ last-level cache) with ``torch.set_num_threads(T)`` for each ``T``; stored as
  seconds per parameter. Sanity reference (16 threads of one H200 host, measured before, not used
  by the code): 0.229 s per 10⁹ parameters.
"""

from __future__ import annotations

from typing import Callable

import torch
from pydantic import ValidationError

from calibration.config import Grid
from planner.errors import InvalidPlan
from planner.runtime.measure import time_rep
from planner.timing.curves import CpuAdamWTable, ParamRateCurve, param_rate_curve

Tick = Callable[[int], None]


def _adamw(n: int, device: torch.device) -> torch.optim.Optimizer:
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32, device=device))
    p.grad = torch.randn_like(p)
    return torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)


def gpu_adamw_curve(grid: Grid, device: torch.device, prov: dict, tick: Tick) -> ParamRateCurve:
    """Fused AdamW step time against parameter count on ``device``."""
    def run_all():
        times = []
        for n in grid.gpu_adamw_params:
            opt = _adamw(n, device)
            times.append(time_rep(opt.step, min_time_s=grid.min_time_s, iters=grid.iters, device=device))
            del opt
            tick(1)
        return times

    where = "device" if device.type == "cuda" else "host (no CUDA: smoke only)"
    note = f"torch.optim.AdamW(fused=True), one flat fp32 parameter on the {where}"
    times = run_all()
    try:
        return param_rate_curve(grid.gpu_adamw_params, times, provenance=prov, note=note)
    except (ValidationError, InvalidPlan):  # a noisy run: one retry, then the error stands
        return param_rate_curve(grid.gpu_adamw_params, run_all(), provenance=prov, note=note)


def cpu_adamw_table(grid: Grid, prov: dict, tick: Tick) -> CpuAdamWTable:
    """Fused CPU AdamW seconds per parameter at each thread count of ``grid.cpu_threads``."""
    n = grid.cpu_adamw_params
    opt = _adamw(n, torch.device("cpu"))
    prev = torch.get_num_threads()
    spp = []
    try:
        for threads in grid.cpu_threads:
            torch.set_num_threads(threads)
            spp.append(time_rep(opt.step, min_time_s=grid.min_time_s, iters=grid.iters,
                                device="cpu") / n)
            tick(1)
    finally:
        torch.set_num_threads(prev)
    return CpuAdamWTable(threads=list(grid.cpu_threads), s_per_param=spp, num_params=n,
                         provenance=prov,
                         note=f"torch.optim.AdamW(fused=True) on one host fp32 parameter of {n} elements")


def cpu_cast_table(grid: Grid, prov: dict, tick: Tick) -> CpuAdamWTable:
    """Host cast seconds per element at each thread count: a bf16→fp32 upcast plus an fp32→bf16
    downcast of the same length, the two passes ``CPUOffloadAdamW`` makes around its host AdamW."""
    n = grid.cpu_adamw_params
    lo = torch.zeros(n, dtype=torch.bfloat16)
    hi = torch.zeros(n, dtype=torch.float32)

    def casts():
        hi.copy_(lo)
        lo.copy_(hi)

    prev = torch.get_num_threads()
    spp = []
    try:
        for threads in grid.cpu_threads:
            torch.set_num_threads(threads)
            spp.append(time_rep(casts, min_time_s=grid.min_time_s, iters=grid.iters, device="cpu") / n)
            tick(1)
    finally:
        torch.set_num_threads(prev)
    return CpuAdamWTable(threads=list(grid.cpu_threads), s_per_param=spp, num_params=n, provenance=prov,
                         note=f"host bf16→fp32 copy_ then fp32→bf16 copy_ of {n} elements (pageable)")


def counts(grid: Grid) -> dict[str, int]:
    """Progress units of the optimizer sections."""
    return {"gpu_adamw": len(grid.gpu_adamw_params), "cpu_adamw": len(grid.cpu_threads),
            "cpu_cast": len(grid.cpu_threads)}
