"""``calibration.collectives`` under gloo with 2 CPU processes: every timed collective moves the
bytes its size convention says (checked element by element), and ``measure`` + ``fragment``
produce a profile fragment that validates. One process group for the whole module."""

from __future__ import annotations

import os
import tempfile
import traceback

import pytest
import torch

WORLD = 2
WORKER_TIMEOUT_S = 180
"""Wall-clock limit for the workers."""
ELEMS = 48
"""Elements per rank buffer (divisible by the group size)."""

pytestmark = pytest.mark.dist


def _value(rank: int, i):
    return rank * 1000.0 + i


def _worker(rank: int, init_file: str, queue) -> None:
    try:
        import torch.distributed as dist

        from calibration import collectives as coll

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
        g, elt, n = WORLD, 4, ELEMS
        idx = torch.arange(n, dtype=torch.float32)
        out = {}
        for name in ("all_to_all", "all_gather", "reduce_scatter", "p2p_ring"):
            a = _value(rank, idx).clone()
            b = torch.full((n,), -1.0)
            coll._ops(name, n * elt, g, rank, None, (a, b), elt)()
            s = n // g
            if name == "all_to_all":  # chunk j of the output is rank j's chunk `rank`
                want = torch.cat([_value(j, idx[rank * s:(rank + 1) * s]) for j in range(g)])
                got = b
            elif name == "all_gather":  # the first n/g elements of every rank, in rank order
                want = torch.cat([_value(j, idx[:s]) for j in range(g)])
                got = b
            elif name == "reduce_scatter":  # the sum over ranks of chunk `rank`
                want = sum(_value(j, idx[rank * s:(rank + 1) * s]) for j in range(g))
                got = b[:s]
            else:  # the previous rank's buffer
                want, got = _value((rank - 1) % g, idx), b
            out[name] = bool(torch.equal(got, want))
        prov = {"device": "cpu", "date": "2026-11-29", "command": "pytest", "gpus_on_machine": 0}
        curves, nccl, failed = coll.measure((1 << 12, 1 << 16, 1 << 20), torch.device("cpu"), prov,
                                            log=lambda m: None)
        frag = coll.fragment(curves, nccl)
        covered = {name: (2 in curves[name]) or any(f.startswith(f"{name} g=2") for f in failed)
                   for name in curves}
        queue.put((rank, out, covered, sorted(frag["curves"]["collectives"])))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - report to the parent
        queue.put((rank, traceback.format_exc(), None, None))


@pytest.fixture(scope="module")
def results():
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    fd, init_file = tempfile.mkstemp()
    os.close(fd)
    os.unlink(init_file)
    procs = [ctx.Process(target=_worker, args=(r, init_file, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=WORKER_TIMEOUT_S) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return sorted(got, key=lambda x: x[0])


def test_collectives_move_the_stated_bytes(results):
    for rank, out, _, _ in results:
        assert isinstance(out, dict), out  # a traceback otherwise
        assert all(out.values()), (rank, out)


def test_measure_and_fragment(results):
    for rank, _, covered, names in results:
        assert covered is not None and all(covered.values()), (rank, covered)
        assert names == ["all_gather", "all_to_all", "p2p_ring", "reduce_scatter"]
