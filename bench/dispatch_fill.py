"""Bench: does the per-rank emulation's unwritten receive buffer make the expert GEMMs fast?

Usage (H200, ~1 min; CPU: ``--smoke``, tiny shapes, same code paths):

    python3 bench/dispatch_fill.py --out $OUT

``bench/dispatch.py`` times each rank of an ``E_p > 1`` plan under the fake process group: its
all-to-alls are no-ops, so every received buffer (rows, route weights, and in backward the
gradients) is ``new_empty`` memory the operator's GEMMs read unwritten (zeros or stale values),
while the ``E_p = 1`` runs copy real rows. GEMM rates depend on the data (the GEMM table is timed
on random operands: ``calibration.compute``). This bench times the same rank twice, in one process:
as ``bench/dispatch.py`` does (``fill=False``), and with every emulated all-to-all filling its
output from a random buffer (``fill=True``, ``planner.runtime.emulated_fill``; the fill is a ``copy_`` of ``fill_bytes`` per step,
whose seconds at the profile's HBM rate are ``fill_s``). ``pred_*`` is the time model's prediction
(``ops.dispatch_time``, dense upstream gradient, as this bench's step). If ``fill=True`` is slower
beyond ``fill_s`` by about the held-out misses of shape B's EP/LLEP rows (predicted 8–12% slow) and
shape A's PipelinedLLEP rows, the emulated rows are fast by their data, not the model.

Writes ``$OUT/dispatch_fill.json`` and ``.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = (("B", "ep", "balanced", 0), ("B", "llep", "balanced", 0), ("B", "llep", "30/16", 0),
         ("A", "ep", "balanced", 0), ("A", "pipelined_llep", "balanced", 1), ("A", "pipelined_llep", "95/16", 7),
         ("B", "pipelined_llep", "80/16", 3))
"""(shape, operator, routing profile, rank) of ``bench/dispatch.py``'s binding rows."""


def main(argv: list[str] | None = None) -> int:
    from _common import operator_parser, use_allocator, write_results

    ap = operator_parser(__doc__, iters=3)
    args = ap.parse_args(argv)
    use_allocator(args)
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dispatch import shapes
    from planner.plans.llep import LlepKnobs
    from planner.runtime.dispatch_trace import build_layer, make_plan
    from planner.runtime.emulated_fill import FilledAllToAll
    from planner.runtime.measure import sync
    from planner.schema.io import load_cluster
    from planner.timing import ops
    from planner.timing.compute import hbm_bytes_per_s
    from _common import time_fwd_bwd

    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    shp = shapes(args.smoke, False, 1)
    cluster = load_cluster("h200")
    hbm = float(hbm_bytes_per_s(ops._lk(cluster)))
    rows = []
    for shape, op, profile, rank in CASES:
        s = shp[shape]
        plan = make_plan(op, s, profile)
        rank = min(rank, s.E_p - 1)
        knobs = LlepKnobs(s.alpha, s.m, s.lam, s.n_imp)
        pf, pfb = ops.dispatch_time(op, s.N, s.H, s.I, s.E, s.k, s.E_p, s.c, profile, cluster, max_chunks=s.K_max,
                                    knobs=knobs, rank=rank, dense_grad=True)
        for fill in (False, True):
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=s.E_p)
            try:
                _, run = build_layer(op, s, plan, profile, device=device, init=True)
                filler = FilledAllToAll(device)
                if fill:
                    with filler:
                        run()                                        # warm-up; counts the fill once
                        per_step, filler.nbytes = filler.nbytes, 0
                        fwd, fb = time_fwd_bwd(run, args.iters, cuda)
                else:
                    run()
                    per_step = 0
                    fwd, fb = time_fwd_bwd(run, args.iters, cuda)
                sync(device)
            finally:
                run = None
                dist.destroy_process_group()
                if cuda:
                    torch.cuda.empty_cache()
            row = dict(shape=shape, op=op, profile=profile, rank=rank, K=plan.num_chunks, fill=fill, fwd_s=fwd,
                       fwdbwd_s=fb, fill_bytes=per_step, fill_s=per_step / hbm, pred_fwd_s=pf, pred_fwdbwd_s=pfb)
            rows.append(row)
            print(row, flush=True)
    lines = ["| shape | op | profile | rank | fill | fwd ms | fwd+bwd ms | fill ms | predicted fwd / fwd+bwd ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {r['op']} | {r['profile']} | {r['rank']} | {r['fill']} | {r['fwd_s'] * 1e3:.2f} | "
              f"{r['fwdbwd_s'] * 1e3:.2f} | {r['fill_s'] * 1e3:.2f} | {r['pred_fwd_s'] * 1e3:.2f} / "
              f"{r['pred_fwdbwd_s'] * 1e3:.2f} |" for r in rows]
    write_results(args.out, "dispatch_fill", {"rows": rows, "smoke": args.smoke}, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
