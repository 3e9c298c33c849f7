"""Spawn one gloo world per test module and collect every rank's results (tests/dist harness).

Each worker is ``worker(rank, W, store_path, queue)``: it runs every case of its module and puts
``(rank, results, traceback_or_None)`` on the queue once. Spawning is slow on 2 cores, so a module
spawns each world size once and its tests read the collected results.
"""

from __future__ import annotations

import os
import queue as queue_mod
import tempfile
import time
import traceback


def serve(rank: int, W: int, store_path: str, queue, cases) -> None:
    """A worker's body: join the gloo world, fill ``out`` with ``cases(rank, W, out)``, report
    ``(rank, out, traceback or None)`` once, leave the world."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, W), rank=rank, world_size=W)
    out: dict = {}
    try:
        cases(rank, W, out)
        queue.put((rank, out, None))
    except Exception:  # noqa: BLE001 - report the traceback to the parent
        queue.put((rank, out, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def collect(queue, procs, W: int, timeout_s: float) -> list:
    """Every worker's result; fails fast when a worker dies without reporting."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < W:
        try:
            got.append(queue.get(timeout=1.0))
        except queue_mod.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
                raise RuntimeError(f"gloo workers failed (exit codes {dead}) or timed out")
    return got


def run_world(worker, W: int, timeout_s: float) -> dict:
    """``{"error": first traceback or None, "ranks": {rank: results}}`` of one spawned world."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=worker, args=(r, W, os.path.join(tmp, "store"), queue)) for r in range(W)]
        for p in procs:
            p.start()
        got = collect(queue, procs, W, timeout_s)
        for p in procs:
            p.join(timeout=30)
    errors = [e for _, _, e in got if e]
    return {"error": errors[0] if errors else None, "ranks": {r: o for r, o, _ in got}}


def world_fixture(worker, worlds, timeout_s: float):
    """A module-scoped pytest fixture ``world`` → ``(W, {rank: results})``, spawning each world size
    of ``worlds`` once for the module (and failing with the first worker traceback)."""
    import pytest

    cache: dict[int, dict] = {}

    @pytest.fixture(scope="module", params=list(worlds), ids=lambda w: f"W{w}")
    def world(request):
        W = request.param
        if W not in cache:
            cache[W] = run_world(worker, W, timeout_s)
        assert cache[W]["error"] is None, cache[W]["error"]
        return W, cache[W]["ranks"]

    return world
