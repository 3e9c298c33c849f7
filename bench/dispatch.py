"""Bench: standard EP, LLEP and PipelinedLLEP (both residue variants) — formula, trace and measurement.

Usage (H200):

    python3 bench/dispatch.py --out bench/results                               # one GPU, ~5 min
    python3 bench/dispatch.py --ops llep pipelined_llep pipelined_llep_source \
        --binding-only llep pipelined_llep --out $OUT            # issue 13, one GPU, ~5 min
    torchrun --nproc_per_node=2 bench/dispatch.py --nccl --out bench/results    # two GPUs, real NCCL
    python3 bench/dispatch.py --shapes A B --ops ep llep pipelined_llep --binding-only ep llep pipelined_llep \
        --no-trace --fill --out $OUT                                            # real-data operands, one GPU
    python3 bench/dispatch.py --smoke --out /tmp/dispatch                       # CPU, tiny shapes
    torchrun --nproc_per_node=2 bench/dispatch.py --nccl --smoke --out /tmp/dispatch   # CPU, gloo

- Default (one GPU): every rank class of the plan of every (shape A/B, operator, profile) runs the
  very operator code on real CUDA tensors under the fake process group (real memory, no-op
  communication); the step is ``out = op(x); out.backward(torch.randn_like(out))`` with the router
  (a dense ``N×H`` upstream gradient, as a decoder layer's backward delivers). Standard EP's skewed
  profiles at shape A run out of memory: recorded. Then a real ``E_p = 1`` run at A and B.
- ``--fill``: the emulated ranks' all-to-alls are no-ops, so every received buffer is unwritten
  memory (zeros, or stale values of earlier runs) and the GEMMs run on it; with ``--fill`` each one
  fills its output from a random buffer (``planner.runtime.emulated_fill``), as real communication would, and
  the row records the fill's bytes (``fill_bytes`` per step, ``fill_fwd_bytes`` in the forward: the
  copies the times include). The peaks are taken without the fill.
- ``--nccl``: a real NCCL group of ``WORLD_SIZE`` (2) ranks at ``E_p = 2`` (shape A's per-rank
  sizes), every operator on ``balanced`` and ``80/16``, and PipelinedLLEP's chunk-count curve
  ``K ∈ {1, 2, 3, 5, 10, 20}`` (the time model's input). Peaks and times are the max over ranks.

Resident inventory, stated with every peak: ``x`` (N·H bf16), the ids, the router weight, the
rank's bf16 expert weights and bf16 gradients (4 B per local expert parameter), plus a pad of
``--resident-bytes-per-param`` − 4 B per parameter standing for fp32 master/m/v, so that the
default 16.5 B/param matches the paper's harness (reference/paper-figures.md). ``peak − pad`` is
the peak with our own 4 B/param inventory. The real ``E_p = 1`` and NCCL runs keep no pad.

Columns: formula (expected: the plan on the profile, this rank; guarantee: DESIGN §3.2 bounds),
the fake-tensor trace, measured peak allocated (the step's peak: absolute − before + inputs) and
reserved, forward and forward+backward time (emulated runs have no communication: times there
are compute only; speed comparisons come from ``--nccl``), with % differences and the checks.
Operators: ``pipelined_llep`` is the destination-residue variant, ``pipelined_llep_source`` the
source-side one (``dispatch_residue = source``). Results are written per shape
(``dispatch_A``, ``dispatch_B``), each with a summary: the source variant's guarantee against the
largest measured peak over profiles (target ≤ ``GUARANTEE_RATIO``×), and the binding rank's
fwd+bwd time of each PipelinedLLEP variant and LLEP per profile.
"""

from __future__ import annotations

import os
import shlex
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TRACE_TOL, FORMULA_TOL, FORMULA_BELOW_TOL = 0.01, 0.02, 0.01
"""DESIGN §8: measured vs trace 1%; formula vs measured 2%, never below it by more than 1%."""
TARGET_GIB = {"balanced": 21.43, "80/16": 22.86}
"""PipelinedLLEP per-rank peak at shape A with the paper's inventory (reference/paper-figures.md)."""
TARGET_REDUCTION = 0.569
"""PipelinedLLEP's peak at least this far below LLEP's at shape A (same inventory)."""
GUARANTEE_RATIO = 1.5
"""Issue 13: the source variant's guarantee within this factor of the largest peak over profiles."""
PROFILES = ("balanced", "30/16", "80/16", "95/16", "50/4", "one_expert", "one_rank")
OPS = ("ep", "llep", "pipelined_llep", "pipelined_llep_source")
CHUNKED = ("pipelined_llep", "pipelined_llep_source")
K_CURVE = (1, 2, 3, 5, 10, 20)


def shapes(smoke: bool, nccl: bool, world: int) -> dict:
    from planner.runtime.dispatch_trace import DispatchShape

    if smoke:
        a = dict(N=512, H=64, I=32, E=16, k=4, E_p=4, c=52, m=8)
        b = dict(N=256, H=64, I=64, E=16, k=2, E_p=4, c=86, m=8)
    else:
        a = dict(N=65536, H=7168, I=2048, E=128, k=8, E_p=8, c=6554)
        b = dict(N=32768, H=4096, I=4096, E=128, k=4, E_p=8, c=10923)
    if nccl:
        return {"A": DispatchShape(**{**a, "E_p": world})}
    return {"A": DispatchShape(**a), "B": DispatchShape(**b)}


def formulas(op, s, plan, rank, nested=False) -> dict:
    """Expected (this rank, standalone), guarantee and worst-case peaks incl. inputs, bytes."""
    from planner.budget import dispatch as bd
    from planner.budget import dispatch_inventory as inv
    from planner.runtime.dispatch_trace import input_bytes

    shp = inv.Shape(s.N, s.H, s.I, s.E, s.k, 2)
    mom = bd.moments(op, shp, bd.rank_sizes(plan, rank), s.n_local, standalone=True)
    g = dict(N=s.N, k=s.k, E=s.E, E_p=s.E_p, c=s.c, K_max=s.K_max, alpha=s.alpha, lam=s.lam, m=s.m,
             n_imp=s.n_imp)
    gm = bd.worst_ep_moments(shp, s.E_p, standalone=True) if op == "ep" else \
        bd.guarantee_moments(op, shp, g, standalone=True)
    base = input_bytes(s)
    return {"formula_bytes": base + bd.peak(mom["forward"] + mom["backward"])[0],
            "guarantee_bytes": base + bd.peak(gm["forward"] + gm["backward"])[0]}


def _trace(args):
    import torch

    from planner.runtime.dispatch_trace import make_plan, trace_layer

    op, s, profile, ranks = args
    torch.set_num_threads(1)
    return trace_layer(op, s, make_plan(op, s, profile), profile, ranks).per_rank


def measure(op, s, profile, plan, device, group, pad_bytes, iters, *, timed=True, fill=False, **over) -> dict:
    """One rank's step: peak memory (the warm-up run) and median fwd / fwd+bwd times. ``fill``
    (emulated ranks, ``--fill``): the times with every emulated all-to-all filling its output from a
    random buffer (``planner.runtime.emulated_fill``), the peak without it; the row records ``fill`` and the
    fill's bytes per step and in the forward (``fill_bytes``, ``fill_fwd_bytes``)."""
    import contextlib

    import torch

    from _common import time_fwd_bwd
    from planner.runtime.dispatch_trace import build_layer, input_bytes
    from planner.runtime.measure import peak_memory

    row: dict = {}
    try:
        inputs, run = build_layer(op, s, plan, profile, device=device, group=group,
                                  pad_bytes=pad_bytes, init=True, **over)
        if device.type == "cuda":
            pk = peak_memory(run, device)
            row.update(peak_allocated_bytes=pk.allocated_bytes - pk.allocated_before_bytes
                       + input_bytes(s, pad_bytes=pad_bytes),
                       abs_peak_allocated_bytes=pk.allocated_bytes, peak_reserved_bytes=pk.reserved_bytes)
        else:
            run()
        if timed:
            filler = None
            if fill:
                from planner.runtime.emulated_fill import FilledAllToAll

                filler = FilledAllToAll(device)
            with filler or contextlib.nullcontext():
                if filler is not None:
                    marks: list = []
                    run(lambda: marks.append(filler.nbytes))     # warm-up; counts one step's fill
                    row.update(fill=True, fill_bytes=filler.nbytes, fill_fwd_bytes=marks[0])
                row["fwd_s"], row["fwdbwd_s"] = time_fwd_bwd(run, iters, device.type == "cuda")
    except torch.cuda.OutOfMemoryError as e:
        row["oom"] = str(e).splitlines()[0][:160]
    finally:
        inputs = run = None  # noqa: F841 - drop the layer and its inputs before emptying the cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def checks(rows: list[dict]) -> None:
    """Attach the targets to each row (``checks``: name → bool)."""
    peak = {}
    for r in rows:
        c, m = {}, r.get("peak_allocated_bytes")
        if m is not None:
            if r.get("trace_bytes"):
                c["measured≈trace (1%)"] = abs(m - r["trace_bytes"]) <= TRACE_TOL * r["trace_bytes"]
            d = (r["formula_bytes"] - m) / m
            c["formula vs measured (2%, ≥ −1%)"] = abs(d) <= FORMULA_TOL and d >= -FORMULA_BELOW_TOL
            if r["op"] != "ep":
                c["guarantee ≥ measured"] = r["guarantee_bytes"] >= m
            key = (r["shape"], r["op"], r["profile"])
            peak[key] = max(peak.get(key, 0), m)
        r["checks"] = c
    for r in rows:
        key = (r["shape"], r["op"], r["profile"])
        if r.get("binding") and r["shape"] == "A" and r["op"] in CHUNKED and key in peak:
            if r["profile"] in TARGET_GIB:
                lim = TARGET_GIB[r["profile"]]
                r["checks"][f"≤ {lim} GiB"] = peak[key] <= lim * 2**30
            ll = peak.get(("A", "llep", r["profile"]))
            if ll:
                r["reduction_vs_llep"] = 1 - peak[key] / ll
                r["checks"]["≥ 56.9% below LLEP"] = r["reduction_vs_llep"] >= TARGET_REDUCTION


def summary(rows: list[dict]) -> tuple[str, dict]:
    """Per shape: guarantee / largest measured peak over profiles, per operator, and the binding
    rank's fwd+bwd time of every operator per profile (markdown, and the same as a dict)."""
    out, lines = {}, []
    for sh in sorted({r["shape"] for r in rows if "/" not in r["shape"]}):
        rs = [r for r in rows if r["shape"] == sh]
        for op in sorted({r["op"] for r in rs}):
            meas = [r["peak_allocated_bytes"] for r in rs if r["op"] == op and r.get("peak_allocated_bytes")]
            g = max((r["guarantee_bytes"] for r in rs if r["op"] == op), default=None)
            if meas and g and op != "ep":
                ratio = g / max(meas)
                out[f"{sh}|{op}|guarantee_over_peak"] = ratio
                ok = "" if op != "pipelined_llep_source" else (
                    f" ({'ok' if ratio <= GUARANTEE_RATIO else 'FAIL'}: target ≤ {GUARANTEE_RATIO}×)")
                lines.append(f"- shape {sh}, {op}: guarantee {g / 2**30:.3f} GiB, largest measured peak "
                             f"{max(meas) / 2**30:.3f} GiB over profiles: {ratio:.2f}×{ok}")
        ops = [o for o in ("llep", "pipelined_llep", "pipelined_llep_source") if any(r["op"] == o for r in rs)]
        if ops:
            lines += ["", f"| shape {sh} profile | " + " | ".join(f"{o} fwd+bwd ms" for o in ops)
                      + " | source / destination |", "|" + "---|" * (len(ops) + 2)]
            for prof in PROFILES:
                t = {o: next((r.get("fwdbwd_s") for r in rs if r["op"] == o and r["profile"] == prof
                              and r.get("binding")), None) for o in ops}
                if not any(t.values()):
                    continue
                rel = (t.get("pipelined_llep_source") / t["pipelined_llep"]
                       if t.get("pipelined_llep_source") and t.get("pipelined_llep") else None)
                out.update({f"{sh}|{o}|{prof}|fwdbwd_s": v for o, v in t.items() if v})
                lines.append(f"| {prof} | " + " | ".join("—" if not t[o] else f"{t[o] * 1e3:.1f}" for o in ops)
                             + f" | {'—' if rel is None else f'{rel:.3f}'} |")
        lines.append("")
    return "\n".join(lines), out


def table(rows: list[dict], pad_bpp: float) -> str:
    gib = lambda v: "—" if v is None else f"{v / 2**30:.3f}"  # noqa: E731
    pct = lambda a, b: "—" if a is None or not b else f"{(a - b) / b:+.2%}"  # noqa: E731
    ms = lambda v: "—" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
    lines = [f"Resident inventory: x, ids, router, bf16 expert weights + grads (4 B/param) + pad to "
             f"{pad_bpp} B/param (columns 'peak'); 'peak−pad' is our 4 B/param inventory.\n",
             "| shape | op | profile | rank | K | formula | guarantee | trace | peak | peak−pad | reserved "
             "| f−t | m−t | f−m | fwd ms | fwd+bwd ms | checks |", "|" + "---|" * 17]
    for r in rows:
        m = r.get("peak_allocated_bytes")
        fails = [k for k, ok in r.get("checks", {}).items() if not ok]
        state = r.get("oom") and "OOM" or ("ok" if not fails else "FAIL: " + ", ".join(fails))
        lines.append(
            f"| {r['shape']} | {r['op']} | {r['profile']} | {r['rank']}{'*' if r.get('binding') else ''} | "
            f"{r['K']} | {gib(r['formula_bytes'])} | {gib(r['guarantee_bytes'])} | "
            f"{gib(r.get('trace_bytes'))} | {gib(m)} | {gib(m - r['pad_bytes'] if m else None)} | "
            f"{gib(r.get('peak_reserved_bytes'))} | {pct(r['formula_bytes'], r.get('trace_bytes'))} | "
            f"{pct(m, r.get('trace_bytes'))} | {pct(r['formula_bytes'], m)} | {ms(r.get('fwd_s'))} | "
            f"{ms(r.get('fwdbwd_s'))} | {state} |")
    return "\n".join(lines)


def emulate(args, cases, device, pad_bpp) -> list[dict]:
    """Per-rank emulation of every rank class of every case (fake process group); operators in
    ``--binding-only`` at the formula's binding rank only."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.runtime.dispatch_trace import make_plan

    def classes(op, s, plan):
        ranks = plan.rank_classes()
        f_all = {d: formulas(op, s, plan, d) for d in ranks}
        binding = max(ranks, key=lambda d: f_all[d]["formula_bytes"])
        return ([binding] if op in args.binding_only else ranks), f_all, binding

    traces = {}
    if not args.no_trace:
        jobs = [(op, s, p, classes(op, s, make_plan(op, s, p))[0]) for (_, op, p), s in cases.items()]
        with ProcessPoolExecutor(max_workers=max(1, min(len(jobs), (os.cpu_count() or 2) - 1)),
                                 mp_context=__import__("multiprocessing").get_context("spawn")) as ex:
            traces = dict(zip(cases, ex.map(_trace, jobs)))
    rows = []
    for (shape, op, profile), s in cases.items():
        plan = make_plan(op, s, profile)
        pad = int((pad_bpp - 4) * s.n_local * 3 * s.H * s.I)
        ranks, f_all, binding = classes(op, s, plan)
        for d in ranks:
            row = dict(shape=shape, op=op, profile=profile, rank=d, K=plan.num_chunks, pad_bytes=pad,
                       binding=d == binding, trace_bytes=traces.get((shape, op, profile), {}).get(d),
                       **{k: v + pad for k, v in f_all[d].items()})
            row["trace_bytes"] = row["trace_bytes"] + pad if row["trace_bytes"] else None
            dist.init_process_group("fake", store=FakeStore(), rank=d, world_size=s.E_p)
            row.update(measure(op, s, profile, plan, device, None, pad, args.iters, timed=d == binding,
                               fill=args.fill))
            dist.destroy_process_group()
            rows.append(row)
            print({k: v for k, v in row.items() if k != "checks"}, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    from _common import operator_parser, use_allocator

    ap = operator_parser(__doc__, iters=2)
    ap.add_argument("--shapes", nargs="+", default=["A", "B"])
    ap.add_argument("--ops", nargs="+", default=list(OPS))
    ap.add_argument("--profiles", nargs="+", default=list(PROFILES))
    ap.add_argument("--resident-bytes-per-param", type=float, default=16.5)
    ap.add_argument("--no-trace", action="store_true", help="skip the fake-tensor traces")
    ap.add_argument("--binding-only", nargs="*", default=[], metavar="OP",
                    help="operators measured (and traced) at the formula's binding rank only")
    ap.add_argument("--fill", action="store_true",
                    help="emulated ranks: time with the all-to-all outputs filled from random data (real-data "
                         "GEMM operands; bench/dispatch_fill.py), the fill's bytes recorded per row")
    args = ap.parse_args(argv)
    use_allocator(args)
    import torch
    import torch.distributed as dist

    from _common import blas_workspaces, context_bytes
    from planner.runtime.dispatch_trace import DispatchShape

    cuda = torch.cuda.is_available()
    world = int(os.environ.get("WORLD_SIZE", "1")) if args.nccl else 1
    rank = int(os.environ.get("RANK", "0")) if args.nccl else 0
    shp = shapes(args.smoke, args.nccl, world)
    constants: dict = {}
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        constants["context"] = context_bytes()
        constants["workspace"] = blas_workspaces()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    if args.nccl:
        from _dispatch_nccl import run_nccl

        rows = run_nccl(args, shp["A"], device, world, rank, formulas, measure, K_CURVE)
        pad_bpp = 4.0
        report(args, rows, rank, world, shp, constants, pad_bpp, "dispatch_nccl")
    else:
        pad_bpp = args.resident_bytes_per_param
        for sh in args.shapes:                     # written shape by shape
            cases = {(sh, op, p): shp[sh] for op in args.ops for p in args.profiles}
            rows = emulate(args, cases, device, pad_bpp)
            s1 = DispatchShape(**{**shp[sh].__dict__, "E_p": 1})   # the real E_p = 1 run (no pad)
            for op in args.ops:
                from planner.runtime.dispatch_trace import make_plan

                plan = make_plan(op, s1, "balanced")
                row = dict(shape=sh + "/E_p=1", op=op, profile="balanced", rank=0, K=plan.num_chunks,
                           pad_bytes=0, binding=False, trace_bytes=None, **formulas(op, s1, plan, 0))
                row.update(measure(op, s1, "balanced", plan, device, None, 0, args.iters))
                rows.append(row)
                print({k: v for k, v in row.items() if k != "checks"}, flush=True)
            report(args, rows, rank, world, {sh: shp[sh]}, constants, pad_bpp, f"dispatch_{sh}")
    if args.nccl and dist.is_initialized():
        dist.destroy_process_group()
    return 0


def report(args, rows, rank, world, shp, constants, pad_bpp, name) -> None:
    """Checks, summary and the results files (rank 0)."""
    from _common import write_results

    checks(rows)
    if rank == 0:
        name += "_smoke" if args.smoke else ""
        cmd = " ".join(shlex.quote(a) for a in ["python3", *sys.argv])
        if args.nccl:
            cmd = f"torchrun --nproc_per_node={world} " + " ".join(shlex.quote(a) for a in sys.argv)
        summ, summ_d = summary(rows)
        md = summ + "\n" + table(rows, pad_bpp)
        if constants:
            md += "\n\n## Constants\n\n```\n" + "\n".join(f"{k}: {v}" for k, v in constants.items()) + "\n```"
        shape_defs = {k: v.__dict__ for k, v in shp.items()}
        j, m = write_results(args.out, name, {"command": cmd, "constants": constants, "rows": rows,
                                              "summary": summ_d, "shapes": shape_defs,
                                              "resident_bytes_per_param": pad_bpp}, md, command=cmd)
        print(md)
        print(f"wrote {j} and {m}")


if __name__ == "__main__":
    raise SystemExit(main())
