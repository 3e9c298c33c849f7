"""Helpers of ``bench/vocab.py`` on top of ``planner.runtime.measure``: the runtime-fixed constants
every verdict uses (DESIGN §3.1) and the result writer.

- ``context_bytes()``: device bytes in use outside the caching allocator right after CUDA starts
  (NVML, else ``cudaMemGetInfo``) — the CUDA context and driver state.
- ``blas_workspaces()``: allocator bytes the first ``torch.mm`` on the default stream (cuBLAS),
  the first ``addmm`` with a 1-D bias (cuBLASLt epilogue) and the first ``mm`` on a fresh side
  stream take beyond their outputs. Call it before any other matmul of the process.
- ``nccl_buffers(group)``: device bytes outside the allocator that the first NCCL collective and
  the first ``batch_isend_irecv`` add (communicator init, p2p channels).
- ``time_fwd_bwd(run, iters, cuda)``: median forward and forward+backward seconds, the forward
  marked inside each run (CUDA events, else ``perf_counter``).
- ``write_results(out, name, payload, table)``: ``name.json`` and ``name.md``, with provenance.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from planner.runtime.measure import device_used_bytes, extra_allocated_bytes, provenance, sync


def allocator_conf() -> str:
    """The caching allocator's settings from the environment (``planner.runtime.allocator.env_settings``)."""
    from planner.runtime.allocator import env_settings

    return env_settings()


def outside_allocator_bytes() -> tuple[int, str]:
    """Device bytes in use minus the allocator's reserved bytes, and how ``used`` was read."""
    sync()
    used, how = device_used_bytes()
    return used - torch.cuda.memory_reserved(), how


def context_bytes() -> dict:
    """CUDA context + driver bytes outside the allocator, read right after CUDA starts."""
    torch.zeros(1, device="cuda")
    val, how = outside_allocator_bytes()
    return {"cuda_context_bytes": val, "method": how,
            "note": "device used − allocator reserved after torch.zeros(1, device='cuda')"}


def blas_workspaces() -> dict:
    """cuBLAS / cuBLASLt / side-stream workspace bytes in the allocator (see the module docstring)."""
    n = 1024
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    ab, bb = a.bfloat16(), b.bfloat16()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = {
        "cublas_workspace_bytes": extra_allocated_bytes(lambda: torch.mm(a, b), 4 * n * n),
        "cublaslt_workspace_bytes": extra_allocated_bytes(lambda: torch.addmm(bias, ab, bb), 2 * n * n),
    }
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out["side_stream_workspace_bytes"] = extra_allocated_bytes(lambda: torch.mm(a, b), 4 * n * n)
    torch.cuda.current_stream().wait_stream(side)
    out["note"] = ("allocator bytes beyond the output of the first fp32 mm (default stream), the first "
                   "bf16 addmm with bias (cuBLASLt), and the first fp32 mm on a fresh stream")
    return out


def nccl_buffers(group=None) -> dict:
    """Bytes outside the allocator added by the first all-reduce and the first ring p2p hop."""
    import torch.distributed as dist

    from planner.runtime import shim

    P, r = shim.group_size(group), shim.group_rank(group)
    base, how = outside_allocator_bytes()
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t, group=group)
    after_coll, _ = outside_allocator_bytes()
    buf = torch.ones(1024, device="cuda")
    got = torch.empty_like(buf)
    shim.wait_all(shim.send_recv([(buf, (r + 1) % P)], [(got, (r - 1) % P)], group=group))
    after_p2p, _ = outside_allocator_bytes()
    return {"nccl_collective_init_bytes": after_coll - base, "nccl_p2p_init_bytes": after_p2p - after_coll,
            "nccl_buffer_bytes": after_p2p - base, "method": how,
            "note": "device used − reserved, before and after the first all_reduce and batch_isend_irecv"}


def time_fwd_bwd(run, iters: int, cuda: bool) -> tuple[float, float]:
    """Median (forward, forward+backward) seconds over ``iters`` calls of ``run(after_forward)``,
    which must call ``after_forward()`` between its forward and its backward."""
    import statistics
    import time

    fwd, tot = [], []
    for _ in range(iters):
        sync()
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
            run(ev[1].record)
            ev[2].record()
            torch.cuda.synchronize()
            fwd.append(ev[0].elapsed_time(ev[1]) / 1e3)
            tot.append(ev[0].elapsed_time(ev[2]) / 1e3)
        else:
            mark = []
            t0 = time.perf_counter()
            run(lambda: mark.append(time.perf_counter()))
            t1 = time.perf_counter()
            fwd.append(mark[0] - t0)
            tot.append(t1 - t0)
    return statistics.median(fwd), statistics.median(tot)


def matmul_precision() -> dict:
    """fp32 matmul settings in effect (TF32 changes the fp32 GEMM rate)."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)}


def write_results(out: str | Path, name: str, payload: dict, table: str,
                  command: str | None = None) -> tuple[Path, Path]:
    """Write ``name.json`` (payload + provenance) and ``name.md`` (provenance + table)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance(command)
    prov["allocator_conf"] = allocator_conf()
    prov.update(matmul_precision())
    payload = {"provenance": prov, **payload}
    jpath, mpath = out / f"{name}.json", out / f"{name}.md"
    jpath.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    head = (f"# {name}\n\n- command: `{prov['command']}`\n- device: {prov['device']} "
            f"({prov.get('gpus_on_machine', '')} GPUs on the machine)\n- torch {prov['torch']}, CUDA "
            f"{prov['cuda']}, NCCL {prov['nccl']}\n- date: {prov['date']}\n- allocator: "
            f"`{prov['allocator_conf'] or 'default'}`\n\n")
    mpath.write_text(head + table + "\n")
    return jpath, mpath


def operator_parser(doc: str, iters: int) -> argparse.ArgumentParser:
    """The options every operator bench shares: ``--out``, ``--smoke``, ``--nccl``, ``--iters`` and
    ``--default-allocator`` (see ``use_allocator``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--smoke", action="store_true", help="CPU-sized shapes, same code paths")
    ap.add_argument("--nccl", action="store_true", help="real process group of WORLD_SIZE ranks (torchrun)")
    ap.add_argument("--iters", type=int, default=iters, help="timed iterations after the warm-up")
    ap.add_argument("--default-allocator", action="store_true",
                    help="leave PYTORCH_CUDA_ALLOC_CONF alone (default: expandable_segments:True)")
    return ap


def use_allocator(args) -> None:
    """``expandable_segments:True`` (the setting the profile's fragmentation was measured with) unless
    ``--default-allocator``; must run before the first CUDA allocation."""
    if not args.default_allocator:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
