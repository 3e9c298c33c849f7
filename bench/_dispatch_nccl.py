"""``bench/dispatch.py --nccl``: real process group of ``WORLD_SIZE`` ranks at ``E_p = WORLD_SIZE``.

Every operator on ``balanced`` and ``80/16`` (the plan from the real all-gathered route counts),
then PipelinedLLEP's chunk-count curve ``K ∈ {1, 2, 3, 5, 10, 20}`` (``c = ceil(N/K)``,
``K_max = max(K, 10)``). Peaks and times are the maximum over ranks; formulas the maximum over the
plan's ranks. No resident pad: the inventory is x, ids, router, bf16 expert weights and grads.
"""

from __future__ import annotations

import dataclasses

PROFILES = ("balanced", "80/16")
KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "fwd_s", "fwdbwd_s", "oom")


def _max_over_ranks(row: dict, world: int) -> dict:
    import torch.distributed as dist

    got = [None] * world
    dist.all_gather_object(got, {k: row.get(k) for k in KEYS})
    out = {}
    for k in KEYS:
        vals = [g[k] for g in got if g.get(k) is not None]
        if vals:
            out[k] = max(vals) if k != "oom" else vals[0]
    return out


def run_nccl(args, s, device, world, rank, formulas, measure, k_curve) -> list[dict]:
    """Rows of the real-NCCL runs (see module docstring)."""
    import torch
    import torch.distributed as dist

    from planner.runtime.dispatch_trace import make_plan

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    runs = [(op, p, s) for p in PROFILES for op in args.ops]
    for p in PROFILES:
        for K in k_curve:
            c = -(-s.N // K)
            runs.append(("pipelined_llep", p, dataclasses.replace(s, c=c, K_max=max(K, 10))))
    rows = []
    for op, profile, sk in runs:
        plan = make_plan(op, sk, profile)
        f = [formulas(op, sk, plan, d) for d in plan.rank_classes()]
        row = dict(shape=f"A/E_p={world}", op=op, profile=profile, rank="max", K=plan.num_chunks,
                   pad_bytes=0, binding=False, trace_bytes=None,
                   formula_bytes=max(x["formula_bytes"] for x in f),
                   guarantee_bytes=max(x["guarantee_bytes"] for x in f))
        mine = measure(op, sk, profile, None, device, None, 0, args.iters)
        row.update(_max_over_ranks(mine, world))
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if rank == 0:
            print({k: v for k, v in row.items() if k != "checks"}, flush=True)
    return rows
