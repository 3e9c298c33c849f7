"""Bench: where one EP layer step's GPU time goes, kernel class by kernel class, beside the time model's parts.

Usage (H200, ~1 min; CPU: ``--smoke``, tiny shapes, same code paths):

    python3 bench/dispatch_profile.py --out $OUT

Each case is a ``bench/dispatch.py`` step (``dispatch_trace.build_layer``: router, operator, a dense
upstream gradient) of standard EP, balanced routing, at shape A and B: the emulated rank 0 of
``E_p = 8`` with unwritten receive buffers (``fill=False``, as ``bench/dispatch.py``), the same with
every emulated all-to-all filled from random data (``fill=True``, ``dispatch_fill.Filler``), and the
real ``E_p = 1`` run. After ``WARMUP`` steps one step runs under ``torch.profiler``; its GPU kernels
are summed by class (``step_profile.classify``: ``gemm`` and the rest) and by name (the CPU smoke
sums the top-level aten ops instead). Beside them the time model's parts
of the same configuration (``planner.timing.dispatch.moe_dispatch_s``: expert GEMM seconds,
memory-bound + exposed host seconds; the router and loss of ``dispatch_kernels.router_and_loss``
apart), so that a miss of the held-out rows is placed in the GEMMs or in the memory-bound kernels.
Writes ``$OUT/dispatch_profile.json`` and ``.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = (("A", 8, False), ("A", 8, True), ("A", 1, False), ("B", 8, False), ("B", 8, True), ("B", 1, False))
"""(shape, E_p, fill) of standard EP at balanced routing, rank 0."""
WARMUP = 2
TOP = 30
"""Kernels listed per case (by total time)."""


def model_parts(s, E_p: int) -> dict:
    """The time model's seconds of the configuration (module docstring)."""
    from planner.schema.io import load_cluster
    from planner.timing import dispatch as D
    from planner.timing import kernel_rates as KR
    from planner.timing.dispatch_kernels import router_and_loss
    from planner.timing.ops import _lk

    lk = _lk(load_cluster("h200"))
    r = D.moe_dispatch_s(lk, "ep", s.N, s.E, s.k, E_p, 1, s.H, s.I, 2, profile="balanced", comm=False, rank=0,
                         dense_grad=True)
    with KR.at_width(lk, s.H, s.I, s.k):
        rl = router_and_loss(lk, s.N, s.H, s.E, s.k, 2)
    return {"gemm_fwd_s": float(r["compute_fwd"]), "gemm_bwd_s": float(r["compute_bwd"]),
            "elem_fwd_s": float(r["elem_fwd"]), "elem_bwd_s": float(r["elem_bwd"]),
            "router_loss_fwd_s": float(sum(rl["fwd"])), "router_loss_bwd_s": float(sum(rl["bwd"]))}


def profile_step(run, cuda: bool) -> dict:
    """One profiled step: kernel seconds by class and by name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from step_profile import busy_seconds, classify

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    events = list(prof.events())
    if cuda:
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                   and not getattr(e, "is_user_annotation", False)]
    else:   # CPU smoke: the aten ops stand in for kernels
        kernels = [e for e in events if e.name.startswith("aten::")
                   and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    by_class: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for e in kernels:
        dur = e.time_range.elapsed_us() / 1e6
        c = classify(e.name)
        by_class[c] = by_class.get(c, 0.0) + dur
        agg = by_name.setdefault(e.name, [0.0, 0])
        agg[0] += dur
        agg[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP]
    return {"kernel_s_by_class": by_class, "kernel_s": sum(by_class.values()),
            "gpu_busy_s": busy_seconds([(e.time_range.start, e.time_range.end) for e in kernels]),
            "kernels": len(kernels),
            "top_kernels": [{"name": n[:160], "class": classify(n), "s": t, "calls": c} for n, (t, c) in top]}


def main(argv: list[str] | None = None) -> int:
    from _common import operator_parser, time_fwd_bwd, use_allocator, write_results

    ap = operator_parser(__doc__, iters=3)
    args = ap.parse_args(argv)
    use_allocator(args)
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dispatch import shapes
    from dispatch_fill import Filler
    from planner.runtime import exchange
    from planner.runtime.dispatch_trace import DispatchShape, build_layer, make_plan

    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    shp = shapes(args.smoke, False, 1)
    rows = []
    for shape, E_p, fill in CASES:
        s = shp[shape] if E_p > 1 else DispatchShape(**{**shp[shape].__dict__, "E_p": 1})
        plan = make_plan("ep", s, "balanced")
        fake = s.E_p > 1
        if fake:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=s.E_p)
        filler = Filler(exchange, device)
        try:
            _, run = build_layer("ep", s, plan, "balanced", device=device, init=True)
            if fill:
                filler.__enter__()
            for _ in range(WARMUP):
                run()
            fwd, fb = time_fwd_bwd(run, args.iters, cuda)
            prof = profile_step(run, cuda)
        finally:
            if fill:
                filler.__exit__()
            run = None
            if fake:
                dist.destroy_process_group()
            if cuda:
                torch.cuda.empty_cache()
        row = dict(shape=shape, op="ep", profile="balanced", rank=0, E_p=s.E_p, fill=fill, fwd_s=fwd, fwdbwd_s=fb,
                   **prof, model=model_parts(s, s.E_p))
        rows.append(row)
        print({k: v for k, v in row.items() if k != "top_kernels"}, flush=True)
    lines = ["| shape | E_p | fill | fwd ms | fwd+bwd ms | GPU busy ms | GEMM kernels ms | other kernels ms | "
             "model GEMM ms | model other ms |", "|" + "---|" * 10]
    for r in rows:
        m = r["model"]
        mg = (m["gemm_fwd_s"] + m["gemm_bwd_s"]) * 1e3
        mo = sum(m[k] for k in ("elem_fwd_s", "elem_bwd_s", "router_loss_fwd_s", "router_loss_bwd_s")) * 1e3
        kc = r["kernel_s_by_class"]
        lines.append(f"| {r['shape']} | {r['E_p']} | {r['fill']} | {r['fwd_s'] * 1e3:.2f} | {r['fwdbwd_s'] * 1e3:.2f} | "
                     f"{r['gpu_busy_s'] * 1e3:.2f} | {kc.get('gemm', 0) * 1e3:.2f} | "
                     f"{(r['kernel_s'] - kc.get('gemm', 0)) * 1e3:.2f} | {mg:.2f} | {mo:.2f} |")
    for r in rows:
        lines += ["", f"### {r['shape']} E_p={r['E_p']} fill={r['fill']}: top kernels", "",
                  "| kernel | class | calls | ms |", "|---|---|---|---|"]
        lines += [f"| `{k['name'][:90]}` | {k['class']} | {k['calls']} | {k['s'] * 1e3:.3f} |" for k in r["top_kernels"]]
    write_results(args.out, "dispatch_profile", {"rows": rows, "smoke": args.smoke}, "\n".join(lines))
    print("\n".join(lines[:2 + len(rows)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
