"""Measurement harness shared by ``calibration/`` and ``bench/`` (DESIGN §6, §8).

- ``provenance()``: device, torch/CUDA/NCCL versions, date, command, GPUs on the machine.
- ``peak_memory(fn)``: run ``fn`` once and return the allocator's peak allocated and reserved bytes
  above the state before the call, plus the absolute peaks.
- ``time_fn(fn)``: median wall time of ``fn`` with CUDA events (or ``perf_counter`` on the CPU).
- ``nvml_used_bytes()``: device memory NVML reports as used (context + allocator + NCCL).
- ``time_reps(fn, reps)`` / ``time_rep(fn)``: median seconds per call with ``reps`` back-to-back
  calls inside each timed window (``time_rep`` picks ``reps`` so a window lasts ``min_time_s``),
  for calls too short to time one by one (calibration).
- ``device_used_bytes()``: NVML's used bytes, or ``cudaMemGetInfo``'s total − free without NVML.
- ``host_rss_bytes()``: resident set size of this process.
"""

from __future__ import annotations

import datetime as _dt
import math
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch


def host_instance() -> str:
    """This machine's boot id: host-CPU measurements compare only within one instance."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def error_line(e: BaseException, limit: int = 300) -> str:
    """A failed case's error as one line: its type and its first ``limit`` characters, whitespace
    folded (the benches and calibrations record it and go on with the other cases)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def provenance(command: str | None = None) -> dict:
    """Where this measurement ran: keys match ``planner.schema.Provenance``."""
    cuda = torch.cuda.is_available()
    nccl = ""
    if cuda:
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - NCCL absent on some builds
            nccl = ""
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "nccl": nccl,
        "date": _dt.date.today().isoformat(),
        "command": command if command is not None else " ".join(shlex.quote(a) for a in sys.argv),
        "gpus_on_machine": _gpus_on_machine() if cuda else 0,
        "host_instance": host_instance(),
    }


def _gpus_on_machine() -> int:
    """GPUs on the machine (NVML sees them all, whatever ``CUDA_VISIBLE_DEVICES`` hides)."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - NVML missing or not permitted
        return torch.cuda.device_count()


@dataclass
class PeakMemory:
    """Peak memory of one call, bytes."""

    allocated_bytes: int
    """``max_memory_allocated`` during the call (absolute)."""
    reserved_bytes: int
    """``max_memory_reserved`` during the call (absolute)."""
    allocated_before_bytes: int
    """``memory_allocated`` just before the call."""
    reserved_before_bytes: int
    """``memory_reserved`` just before the call."""

    def asdict(self) -> dict:
        return asdict(self)


def peak_memory(fn: Callable[[], object], device: torch.device | str | None = None) -> PeakMemory:
    """Run ``fn`` once on a synchronised device and report the allocator peaks.

    Raises:
        RuntimeError: no CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("peak_memory needs a CUDA device")
    dev = torch.device(device or "cuda")
    torch.cuda.synchronize(dev)
    before_a = torch.cuda.memory_allocated(dev)
    before_r = torch.cuda.memory_reserved(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    fn()
    torch.cuda.synchronize(dev)
    return PeakMemory(torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev),
                      before_a, before_r)


def time_fn(fn: Callable[[], object], *, warmup: int = 2, iters: int = 5) -> float:
    """Median seconds per call of ``fn`` (CUDA events on a GPU, ``perf_counter`` on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = torch.cuda.is_available()
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def extra_allocated_bytes(fn: Callable[[], object], out_bytes: int) -> int:
    """Allocator bytes ``fn`` holds, persistently or at its peak, beyond its ``out_bytes`` output
    (how cuBLAS/cuBLASLt workspaces are measured: the first GEMM on a handle allocates one)."""
    sync()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    sync()
    persistent = torch.cuda.memory_allocated() - before - out_bytes
    transient = torch.cuda.max_memory_allocated() - before - out_bytes
    del out
    return max(0, persistent, transient)


def wall_time(fn: Callable[[], object], *, iters: int, warmup: int = 0) -> float:
    """Median wall seconds of ``fn`` with the device synchronised around each call (host work,
    such as a CPU optimizer step between GPU copies, counts)."""
    cuda = torch.cuda.is_available()
    out = []
    for i in range(warmup + iters):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def nvml_used_bytes(index: int | None = None) -> int | None:
    """Device memory in use as NVML sees it (context + allocator + NCCL), or ``None`` without NVML."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        idx = torch.cuda.current_device() if index is None else index
        h = pynvml.nvmlDeviceGetHandleByIndex(idx)
        return int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:  # noqa: BLE001 - NVML missing or not permitted
        return None


def sync(device: torch.device | str | None = None) -> None:
    """Wait for the device (no-op on the CPU)."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize(device)


def time_reps(fn: Callable[[], object], reps: int, *, iters: int = 3, warmup: int = 1,
              device: torch.device | str | None = None) -> float:
    """Median seconds per call over ``iters`` windows of ``reps`` back-to-back calls.

    Uses CUDA events on a CUDA ``device`` (default: CUDA when available), ``perf_counter`` otherwise.
    """
    cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync(device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def pick_reps(one_call_s: float, min_time_s: float, max_reps: int = 256) -> int:
    """Calls per timed window so that a window lasts at least ``min_time_s`` (1..``max_reps``)."""
    if one_call_s <= 0:
        return max_reps
    return int(min(max_reps, max(1, math.ceil(min_time_s / one_call_s))))


def time_rep(fn: Callable[[], object], *, min_time_s: float = 1e-3, iters: int = 3,
             max_reps: int = 256, device: torch.device | str | None = None) -> float:
    """Median seconds per call; one untimed warm-up call, one call to size the window, then
    ``iters`` windows of enough calls to last ``min_time_s``."""
    one = time_reps(fn, 1, iters=1, warmup=1, device=device)
    return time_reps(fn, pick_reps(one, min_time_s, max_reps), iters=iters, warmup=0, device=device)


def device_used_bytes(index: int | None = None) -> tuple[int, str]:
    """Bytes in use on the device and how they were read (``nvml`` or ``cudaMemGetInfo``).

    ``cudaMemGetInfo`` counts every process on the device; on a dedicated GPU that is this one.

    Raises:
        RuntimeError: no CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("device_used_bytes needs a CUDA device")
    used = nvml_used_bytes(index)
    if used is not None:
        return used, "nvml"
    free, total = torch.cuda.mem_get_info(torch.cuda.current_device() if index is None else index)
    return int(total - free), "cudaMemGetInfo"


def host_rss_bytes() -> int:
    """Resident set size of this process, bytes (``/proc/self/status`` VmRSS, else ru_maxrss)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
