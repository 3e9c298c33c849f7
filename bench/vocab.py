"""Bench: the dense head and Ring-DTP — formula, trace and measurement side by side.

Usage (H200; one GPU: about 4 minutes at ~50 TFLOP/s fp32, peak ~80 GiB for the dense head at
N = 32768; ``--n 16384`` / ``--n 32768`` split it in two):

    python3 bench/vocab.py --out bench/results                         # per-rank emulation
    torchrun --nproc_per_node=2 bench/vocab.py --nccl --out bench/results   # real NCCL, P = 2
    python3 bench/vocab.py --smoke --out /tmp/vocab                    # CPU, tiny shapes
    torchrun --nproc_per_node=2 bench/vocab.py --nccl --smoke --out /tmp/vocab   # CPU, gloo

- Default (one GPU): rank 0 of a Ring-DTP group runs the very operator code on real CUDA tensors
  under the fake process group (real memory, no-op communication) at N ∈ {16384, 32768},
  H = 7168, V = 200000, fp32, P ∈ {4, 8}, B_v ∈ {1, 4}; the dense head at both N.
- ``--nccl``: every rank of a real NCCL group of ``WORLD_SIZE`` (2) runs Ring-DTP at ``P = 2`` and
  its own dense head; peaks are the maximum over ranks.

Per shape: peak allocated (the step's own peak: absolute peak − allocated before + the inputs) and
reserved, fragmentation (reserved − allocated at the peak), forward and forward+backward time
(median of ``--iters`` runs after one warm-up, which is also the memory run; the forward is timed by
an event inside each forward+backward run), the fake-tensor trace and
the planner's formula (``vocab`` terms + the head weight/grad the step holds). Also the constants:
CUDA context, cuBLAS / cuBLASLt / side-stream workspace, and (``--nccl``) the NCCL buffers.
Writes ``vocab[_nccl][_smoke].json`` and ``.md`` under ``--out``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TRACE_TOL, FORMULA_TOL, FORMULA_BELOW_TOL = 0.01, 0.02, 0.01
"""DESIGN §8: measured vs trace 1%; formula vs measured 2%, never below it by more than 1%."""
FWD_SLACK, FWDBWD_RATIO = 1.05, 4 / 3
"""Targets: Ring-DTP forward ≤ 1.05 × dense; forward+backward ≤ 4/3 × dense × 1.05."""
PAPER_RING_GIB = {(16384, 8): 7.322, (32768, 8): 10.622, (16384, 4): 11.519}
PAPER_DENSE_GIB = {16384: 42.462, 32768: 79.521}
DENSE_PAPER_TOL = 0.01


def shapes(args) -> list[tuple[str, dict]]:
    """(kind, HeadShape kwargs) in run order: dense first at each N, then Ring-DTP."""
    if args.smoke:
        Ns, H, V, Ps, Bs = (64, 300), 32, 1000, (2,) if args.nccl else (2, 4), (1, 3)
    else:
        Ns, H, V, Ps, Bs = args.n, 7168, 200000, (2,) if args.nccl else args.p, args.blocks
    out = []
    for N in Ns:
        out.append(("dense", dict(N=N, H=H, V=V)))
        out += [("ring_dtp", dict(N=N, H=H, V=V, P=P, vocab_blocks=B)) for P in Ps for B in Bs]
    return out


def formula_bytes(kind: str, s) -> int:
    """The planner's ``vocab`` terms at this shape + the head weight (and grad) the step holds."""
    from planner.budget import vocab
    from planner.runtime.vocab_trace import resident_weight_bytes

    if kind == "dense":
        subs = vocab.dense_substeps(s.N, s.H, s.V, s.V, s.b)
    else:
        subs = vocab.ring_substeps(s.N, s.H, s.V, s.P, s.vocab_blocks, s.b, move=s.mode)
    return sum(int(t.bytes) for t in vocab.binding_terms(subs, "bench")) + resident_weight_bytes(kind, s)


def measure(kind: str, s, device, group, iters: int) -> dict:
    """Peak memory (first run, also the warm-up) and median forward / forward+backward times (the
    forward timed inside each forward+backward run) of one rank's head step on ``device``."""
    import torch

    from _common import time_fwd_bwd
    from planner.runtime.measure import peak_memory
    from planner.runtime.vocab_trace import loss_fn, make_inputs

    inputs = make_inputs(kind, s, device=device, seed=0)
    x, w = inputs[0], inputs[2]
    in_bytes = sum(t.numel() * t.element_size() for t in inputs)
    f = loss_fn(kind, s, inputs, group)

    def run(after_forward=lambda: None):
        x.grad = None
        if kind == "dense":
            w.grad = None  # ZeRO-3: the head's gradient is a fresh transient each step
        loss = f()
        after_forward()
        loss.backward()

    row: dict = {}
    if device.type == "cuda":
        torch.cuda.empty_cache()
        pk = peak_memory(run, device)
        row.update(peak_allocated_bytes=pk.allocated_bytes - pk.allocated_before_bytes + in_bytes,
                   abs_peak_allocated_bytes=pk.allocated_bytes, peak_reserved_bytes=pk.reserved_bytes,
                   fragmentation_bytes=pk.reserved_bytes - pk.allocated_bytes)
    else:
        run()
    row["fwd_s"], row["fwdbwd_s"] = time_fwd_bwd(run, iters, device.type == "cuda")
    return row


def over_capacity(formula_bytes: int, free_bytes: int) -> str | None:
    """Why a row cannot run on this GPU (its formula peak above the free memory, as on an H100 for the
    dense head at N = 32768), or None: such a row is recorded as skipped instead of ending the run."""
    if formula_bytes <= free_bytes:
        return None
    return f"formula peak {formula_bytes / 2**30:.2f} GiB > {free_bytes / 2**30:.2f} GiB free on this GPU"


def checks(rows: list[dict]) -> None:
    """Attach the targets to each row (``checks``: name → bool)."""
    dense = {r["N"]: r for r in rows if r["kind"] == "dense"}
    for r in rows:
        c, m = {}, r.get("peak_allocated_bytes")
        if m is not None:
            c["measured≈trace (1%)"] = abs(m - r["trace_bytes"]) <= TRACE_TOL * r["trace_bytes"]
            d = (r["formula_bytes"] - m) / m
            c["formula vs measured (2%, ≥ −1%)"] = abs(d) <= FORMULA_TOL and d >= -FORMULA_BELOW_TOL
        if r["kind"] == "ring_dtp":
            key = (r["N"], r["P"])
            if key in PAPER_RING_GIB:
                c["≤ paper peak"] = (m if m is not None else r["trace_bytes"]) <= PAPER_RING_GIB[key] * 2**30
            d0 = dense.get(r["N"])
            if d0 is not None and "fwd_s" in d0 and m is not None:  # times only mean something on the GPU
                r["fwd_vs_dense"] = r["fwd_s"] / d0["fwd_s"]
                r["fwdbwd_vs_dense"] = r["fwdbwd_s"] / d0["fwdbwd_s"]
                c["fwd ≤ 1.05·dense"] = r["fwd_vs_dense"] <= FWD_SLACK
                c["fwd+bwd ≤ 4/3·dense·1.05"] = r["fwdbwd_vs_dense"] <= FWDBWD_RATIO * FWD_SLACK
        elif r["N"] in PAPER_DENSE_GIB and m is not None:
            c["dense within 1% of paper"] = abs(m / 2**30 / PAPER_DENSE_GIB[r["N"]] - 1) <= DENSE_PAPER_TOL
        r["checks"] = c


def verdict(row: dict, fails: list[str]) -> str:
    if "skipped" in row:
        return f"skipped: {row['skipped']}"
    return "ok" if not fails else "FAIL: " + ", ".join(fails)


def table(rows: list[dict]) -> str:
    gib = lambda v: "—" if v is None else f"{v / 2**30:.3f}"  # noqa: E731
    pct = lambda a, b: "—" if a is None or b is None else f"{(a - b) / b:+.2%}"  # noqa: E731
    ms = lambda v: "—" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
    head = ("| head | N | P | B_v | move | formula GiB | trace GiB | measured GiB | formula−trace | "
            "measured−trace | formula−measured | reserved GiB | frag GiB | fwd ms | fwd+bwd ms | "
            "fwd/dense | fwd+bwd/dense | checks |\n|" + "---|" * 18)
    lines = [head]
    for r in rows:
        m = r.get("peak_allocated_bytes")
        fails = [k for k, ok in r["checks"].items() if not ok]
        lines.append(
            f"| {r['kind']} | {r['N']} | {r['P']} | {r['vocab_blocks']} | {r['move']} | "
            f"{gib(r['formula_bytes'])} | {gib(r['trace_bytes'])} | {gib(m)} | "
            f"{pct(r['formula_bytes'], r['trace_bytes'])} | {pct(m, r['trace_bytes'])} | "
            f"{pct(r['formula_bytes'], m)} | {gib(r.get('peak_reserved_bytes'))} | "
            f"{gib(r.get('fragmentation_bytes'))} | {ms(r.get('fwd_s'))} | {ms(r.get('fwdbwd_s'))} | "
            f"{r.get('fwd_vs_dense', float('nan')):.3f} | {r.get('fwdbwd_vs_dense', float('nan')):.3f} | "
            f"{verdict(r, fails)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from _common import operator_parser, use_allocator

    ap = operator_parser(__doc__, iters=3)
    ap.add_argument("--n", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--p", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args(argv)
    use_allocator(args)
    import torch
    import torch.distributed as dist

    from _common import blas_workspaces, context_bytes, nccl_buffers, write_results
    from planner.plans.ring import ring_plan
    from planner.runtime.vocab_trace import HeadShape, trace_head

    cuda = torch.cuda.is_available()
    world = int(os.environ.get("WORLD_SIZE", "1")) if args.nccl else 1
    rank = int(os.environ.get("RANK", "0")) if args.nccl else 0
    plan = [(k, HeadShape(rank=rank if k != "dense" else 0, **kw)) for k, kw in shapes(args)]
    if args.nccl:
        plan = [(k, s if k == "dense" else HeadShape(**{**s.__dict__, "P": world})) for k, s in plan]
    rows = []
    for kind, s in plan:  # traces first: they need a process without a real process group
        mv = "—" if kind == "dense" else ring_plan(s.P, s.V, s.N, s.vocab_blocks, s.mode).move
        rows.append(dict(kind=kind, N=s.N, H=s.H, V=s.V, P=s.P, vocab_blocks=s.vocab_blocks, move=mv,
                         trace_bytes=trace_head(kind, s).peak_bytes, formula_bytes=formula_bytes(kind, s)))
    constants: dict = {}
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        constants["context"] = context_bytes()
        constants["workspace"] = blas_workspaces()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    group = None
    if args.nccl:
        dist.init_process_group("nccl" if cuda else "gloo")
        if cuda:
            constants["nccl"] = nccl_buffers()
    for (kind, s), row in zip(plan, rows):
        why = over_capacity(row["formula_bytes"], torch.cuda.mem_get_info()[0]) if cuda else None
        if why is not None:  # the same formula on every rank: all skip it together
            row["skipped"] = why
            if rank == 0:
                print(f"{kind} N={s.N} P={s.P} B_v={s.vocab_blocks}: skipped ({why})", flush=True)
            continue
        if not args.nccl:
            from torch.testing._internal.distributed.fake_pg import FakeStore
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=s.P)
        row.update(measure(kind, s, device, group, args.iters))
        if not args.nccl:
            dist.destroy_process_group()
        elif world > 1:  # the peak of the group is its largest rank's
            got = [None] * world
            dist.all_gather_object(got, {k: row.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes",
                                                                   "fwd_s", "fwdbwd_s")})
            for k in ("peak_allocated_bytes", "peak_reserved_bytes", "fwd_s", "fwdbwd_s"):
                vals = [g[k] for g in got if g[k] is not None]
                row[k] = max(vals) if vals else None
        if cuda:
            torch.cuda.empty_cache()
        if rank == 0:
            print(f"{kind} N={s.N} P={s.P} B_v={s.vocab_blocks}: " + ", ".join(
            f"{k}={v}" for k, v in row.items() if k.endswith(("_bytes", "_s"))), flush=True)
    checks(rows)
    if cuda:
        frag = [r["fragmentation_bytes"] for r in rows if "fragmentation_bytes" in r]
        constants["fragmentation"] = {"max_bytes": max(frag), "max_fraction": max(
            r["fragmentation_bytes"] / r["peak_reserved_bytes"] for r in rows if "fragmentation_bytes" in r)}
    if rank == 0:
        name = "vocab" + ("_nccl" if args.nccl else "") + ("_smoke" if args.smoke else "")
        cmd = " ".join(shlex.quote(a) for a in ["python3", *sys.argv])
        if args.nccl:
            cmd = f"torchrun --nproc_per_node={world} " + " ".join(shlex.quote(a) for a in sys.argv)
        md = table(rows)
        if constants:
            md += "\n\n## Constants\n\n```\n" + "\n".join(f"{k}: {v}" for k, v in constants.items()) + "\n```"
        j, m = write_results(args.out, name, {"command": cmd, "constants": constants, "rows": rows}, md,
                             command=cmd)
        print(md)
        print(f"wrote {j} and {m}")
    if args.nccl:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
