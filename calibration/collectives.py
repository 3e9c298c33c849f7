"""Collective bandwidth by message size and group size, under ``torchrun`` with W ≥ 2.

Usage (on the GPU machine; NCCL, one process per GPU)::

    torchrun --nproc_per_node=2 -m calibration.collectives --out $OUT/coll.yaml
    torchrun --nproc_per_node=2 -m calibration.collectives --smoke --out /tmp/coll.yaml   # CPU, gloo

For each group size ``g`` (powers of two from 2 to W that divide W) the ranks split into W/g
consecutive groups that all run at once, and each collective is timed at every message size:
``all_to_all`` (even splits), ``all_gather``, ``reduce_scatter`` (sum) and ``p2p_ring`` (one hop: send
to the next rank, receive from the previous, ``batch_isend_irecv``), all through
``planner.runtime.shim``. Sizes follow ``CollectiveCurves``'s conventions. A point's time is the
median over windows of the **maximum over ranks** of the mean per-call time in the window.

Also measured: ``nccl_buffer_bytes``, the device bytes outside the allocator that the first NCCL
communicator adds (world group; each further subgroup communicator adds its own).

Rank 0 writes a profile *fragment* (``schema_version``, ``curves.collectives``,
``memory.nccl_buffer_bytes``) atomically; ``calibration.merge`` folds it into a profile.
"""

from __future__ import annotations

import argparse
import datetime
import traceback
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from pydantic import ValidationError

from calibration.io import command_line, summary_path, write_text_atomic, write_yaml_atomic
from calibration.report import summary_markdown
from planner.errors import InvalidPlan
from planner.runtime import shim
from planner.runtime.measure import pick_reps, provenance, time_reps
from planner.schema.base import SCHEMA_VERSION
from planner.schema.io import validation_error
from planner.timing.curves import COLLECTIVES, bandwidth_curve, parse_curves

FULL_BYTES = tuple(1 << e for e in range(15, 32, 2))   # 32 KiB .. 2 GiB
SMOKE_BYTES = tuple(1 << e for e in range(18, 25, 3))  # 256 KiB .. 16 MiB (gloo: bandwidth-bound)
MIN_TIME_S = 2e-3
ITERS = 3


def _timed(fn, reps: int, device: torch.device) -> float:
    """Max over ranks of the mean seconds per call over ``reps`` back-to-back calls."""
    dist.barrier()
    dt = time_reps(fn, reps, iters=1, warmup=0, device=device)
    t = torch.tensor([dt], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _ops(name: str, n_bytes: int, g: int, rank_in_group: int, group, bufs, elt: int):
    a, b = bufs
    n = n_bytes // elt
    if name == "all_to_all":
        return lambda: shim.all_to_all_single(b[:n], a[:n], None, None, group=group)
    if name == "all_gather":
        return lambda: shim.all_gather(b[:n], a[: n // g], group=group)
    if name == "reduce_scatter":
        return lambda: shim.reduce_scatter(b[: n // g], a[:n], group=group)
    nxt, prv = (rank_in_group + 1) % g, (rank_in_group - 1) % g
    return lambda: shim.wait_all(shim.send_recv([(a[:n], nxt)], [(b[:n], prv)], group=group))


def _point(fn, device: torch.device) -> float:
    fn()
    fn()
    reps = pick_reps(_timed(fn, 1, device), MIN_TIME_S)
    return statistics.median(_timed(fn, reps, device) for _ in range(ITERS))


def measure(sizes, device: torch.device, prov: dict, log=print) -> tuple[dict, dict, list[str]]:
    """Curves ``{collective: {g: BandwidthCurve}}``, the NCCL buffer constant and the failures.

    A curve that does not validate (noise breaking monotonicity) is measured once more; if it
    still fails, it is left out and its raw times are reported in the failures.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elt = torch.finfo(dtype).bits // 8
    nccl = None
    if device.type == "cuda":
        from calibration.constants import context_bytes

        before, method = context_bytes()
        dist.all_reduce(torch.ones(1, device=device))  # creates the world communicator
        after, _ = context_bytes()
        t = torch.tensor([after - before], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        nccl = {"value": float(t.item()), "status": "measured", "provenance": prov,
                "note": f"device bytes outside the allocator added by the first NCCL communicator "
                        f"(W={world}, max over ranks, {method})"}
    bufs = tuple(torch.ones(max(sizes) // elt, dtype=dtype, device=device) for _ in range(2))
    curves: dict[str, dict[int, object]] = {c: {} for c in COLLECTIVES}
    failed: list[str] = []
    group_sizes = [g for g in (1 << e for e in range(1, world.bit_length())) if world % g == 0]
    for g in group_sizes:
        group = None if g == world else dist.new_subgroups(group_size=g)[0]
        rig = rank % g
        for name in COLLECTIVES:
            note = (f"{name} in {world // g} concurrent group(s) of {g} consecutive ranks, "
                    f"{str(dtype).removeprefix('torch.')}, backend {dist.get_backend()}")
            for attempt in range(2):
                times = [_point(_ops(name, n, g, rig, group, bufs, elt), device) for n in sizes]
                try:
                    curves[name][g] = bandwidth_curve(sizes, times, provenance=prov, group_size=g, note=note)
                    break
                except (ValidationError, InvalidPlan) as err:
                    if attempt == 1:
                        why = validation_error(err, 'curve') if isinstance(err, ValidationError) else err
                        failed.append(f"{name} g={g}: times {times} at sizes {list(sizes)}: {why}")
            if rank == 0 and g in curves[name]:
                c = curves[name][g]
                log(f"{name:>14} g={g}: latency {c.latency_s * 1e6:8.1f} us, "
                    f"bandwidth {c.bytes_per_s / 1e9:7.1f} GB/s, max residual {c.max_rel_residual:.1%}")
    return curves, nccl, failed


def fragment(curves: dict, nccl: dict | None) -> dict:
    """The profile fragment written by rank 0 (validated)."""
    coll = {name: {g: c.model_dump(mode="json") for g, c in per.items()} for name, per in curves.items()}
    parse_curves({"collectives": coll})
    out = {"schema_version": SCHEMA_VERSION, "curves": {"collectives": coll}}
    if nccl is not None:
        out["memory"] = {"nccl_buffer_bytes": nccl}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.collectives", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="profile fragment to write (YAML)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU/gloo code-path check)")
    args = ap.parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        print("calibration.collectives needs W ≥ 2: run it under torchrun --nproc_per_node=W", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=120))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    command = command_line(f"torchrun --nproc_per_node={dist.get_world_size()} -m calibration.collectives", argv)
    prov = provenance(command)
    t0 = time.perf_counter()
    failed: list[str] = ["did not finish"]
    try:
        curves, nccl, failed = measure(SMOKE_BYTES if args.smoke else FULL_BYTES, device, prov)
        if dist.get_rank() == 0:
            try:
                frag = fragment(curves, nccl)
            except Exception:  # noqa: BLE001 - report now: rank 1 waits in the barrier below
                traceback.print_exc()
                sys.stderr.flush()
                failed = [*failed, "writing the fragment failed (traceback above)"]
                frag = None
        if dist.get_rank() == 0 and frag is not None:
            path = write_yaml_atomic(args.out, frag)
            write_text_atomic(summary_path(args.out), summary_markdown(
                f"Collectives at W={dist.get_world_size()} on {prov['device']}", prov,
                parse_curves(frag["curves"]), frag.get("memory"),
                {"total": time.perf_counter() - t0}, failed))
            print(f"wrote {path} in {time.perf_counter() - t0:.1f} s")
            for msg in failed:
                print(f"FAILED: {msg}", file=sys.stderr)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
