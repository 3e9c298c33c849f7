"""Which cuBLAS / cuBLASLt workspaces one rank's step holds, case by case, each case in a process
of its own (nothing carried over from another case), beside the budget's ``n_hd`` and ``n_lt``
(``planner.budget.workspace``); and, in the same fresh process, whether every byte live at a phase
is one the allocator's history recorded (the DeepSeek-V2-Lite W = 64 FSDP2 step start is ~5 MiB
above an inventory that matched the recorded blocks to 112 B).

    python3 bench/blas_workspaces.py --out "$OUT"              # on the GPU: every case (< 2 min)
    python3 bench/blas_workspaces.py --out /tmp/bw --dry-run   # anywhere: the cases and the budget's n_lt
    python3 bench/blas_workspaces.py --out /tmp/bw --smoke     # anywhere: the child path without CUDA

Each case runs as ``python3 bench/blas_workspaces.py --child NAME --out OUT``: the allocator's history
recorder (C++ and Python frames) starts before any CUDA work, ``planner validate``'s own step runs
(``planner.runtime.validate.validate``, 2 steps, phase markers of ``bench/memory_snapshot.py``), then

- every active block of the allocator's snapshot allocated by ``getNewWorkspace`` (cuBLAS) or
  ``getNewCUDABlasLtWorkspace`` (cuBLASLt), with the op that asked for it (``gemm_and_bias``, …),
  the planner source line and the thread (autograd's engine thread or the caller's);
- the allocated bytes ``torch._C._cuda_clearCublasWorkspaces()`` frees (every workspace of the
  process: ``n_cublas`` 32 MiB blocks and ``n_lt`` 1 MiB ones);
- per phase, the measured peak less the recorded live bytes at that phase's peak (0 when the recorder
  saw every allocation) and the live blocks grouped by source line (``memory_snapshot.analyse``);
- at every phase start, the measured bytes less the live bytes replayed from the history with a free
  taken at ``free_requested`` and at ``free_completed`` (``marker_totals``), and the blocks freed but
  not yet released then: where the unrecorded bytes are, if they are deferred frees.

Writes ``OUT/<case>.json`` and ``OUT/blas_workspaces.json`` / ``.md`` (one line per case: measured
``n_cublas``/``n_lt`` against the budget's, the step start measured and predicted).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _process import run_child  # noqa: E402

from planner.api import build_planfile  # noqa: E402
from planner.budget import workspace  # noqa: E402
from planner.budget.build import make_context  # noqa: E402
from planner.runtime.validate_plan import truncate  # noqa: E402
from planner.schema.io import write_text_atomic  # noqa: E402

LAYERS = 2
STEPS = 2
CHILD_TIMEOUT_S = 100
BUDGET_S = 90.0
"""No case starts after this many seconds (cases in priority order; about 2 minutes on an H200, at most
BUDGET_S + CHILD_TIMEOUT_S)."""
# name: model, W, S, overrides, gradient lifetime. Expected n_lt from the budget's rule: gpt-oss
# (biased q/k/v/o and router) 2 / 1 / 1 under FSDP2 ac full / selective / none, 2 composed; 0 for the rest.
CASES = {
    "fsdp2-gptoss-W8-selective": ("gpt-oss-20b", 8, 8192, {"stack": "fsdp2", "ac": "selective"}, "freed"),
    "fsdp2-dsv2-W64-full": ("deepseek-v2-lite", 64, 32768, {"stack": "fsdp2"}, "accumulate"),
    "fsdp2-gptoss-W8-none": ("gpt-oss-20b", 8, 8192, {"stack": "fsdp2", "ac": "none"}, "freed"),
    "fsdp2-gptoss-W8-full": ("gpt-oss-20b", 8, 8192, {"stack": "fsdp2"}, "freed"),
    "fsdp2-qwen3-W8-full": ("qwen3-30b-a3b", 8, 8192, {"stack": "fsdp2"}, "freed"),
    "composed-gptoss-W8-S32768": ("gpt-oss-20b", 8, 32768, {}, "freed"),
    "fsdp2-qwen3-W1-full": ("qwen3-30b-a3b", 1, 8192, {"stack": "fsdp2"}, "freed"),   # W = 1: 4 MiB unrecorded
}
CUBLAS_FRAME, LT_FRAME = "getNewWorkspace", "getNewCUDABlasLtWorkspace"
"""C++ frames of the two allocations (aten/src/ATen/cuda/CublasHandlePool.cpp)."""
BACKWARD_FRAME = "autograd::Engine::thread_main"
"""A frame of autograd's device thread (the backward's own handle)."""


def planfile(name: str):
    model, W, S, ov, _ = CASES[name]
    return truncate(build_planfile(model=model, gpus=W, seq_len=S, overrides=ov or None), LAYERS).planfile


def budget(name: str) -> dict:
    """The budget's workspace handles for ``name``'s plan."""
    pf = planfile(name)
    ctx = make_context(pf.model, pf.cluster, pf.workload, pf.plan)
    mem = pf.cluster.memory
    return {"n_hd": workspace.BLAS_HANDLES, "n_lt": workspace.blaslt_handles(ctx),
            "cublas_bytes": int(mem.cublas_workspace_bytes.value), "cublaslt_bytes": int(mem.cublaslt_workspace_bytes.value)}


def _names(frames: list[dict]) -> list[str]:
    return [str(f.get("name", "")) for f in frames or []]


def workspace_blocks(snap: dict) -> list[dict]:
    """Active blocks of an allocator snapshot allocated by cuBLAS's or cuBLASLt's workspace getter:
    kind, size, the BLAS / aten function that asked (innermost ``at::cuda::blas`` / ``at::native``
    frame), the planner source line, and whether autograd's engine thread made it."""
    out = []
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            if b.get("state") != "active_allocated":
                continue
            frames = b.get("frames") or []
            names = _names(frames)
            kind = ("cublaslt" if any(LT_FRAME in n for n in names)
                    else "cublas" if any(CUBLAS_FRAME in n for n in names) else None)
            if kind is None:
                continue
            op = next((n for n in names if "at::cuda::blas::" in n or "at::native::" in n), "?")
            site = next((f"{f['filename'].split('/planner/')[-1]}:{f.get('line', 0)}" for f in frames
                         if "/planner/" in str(f.get("filename", ""))), "?")  # innermost planner line
            out.append({"kind": kind, "bytes": int(b["size"]), "op": op[:160], "site": site,
                        "thread": "backward" if any(BACKWARD_FRAME in n for n in names) else "caller"})
    return out


def marker_totals(snap: dict, labels: list[tuple[str, int]], mark_bytes: int, top: int = 12) -> dict:
    """Live bytes at each phase marker of the last step (``memory_snapshot``'s markers), replayed
    with two readings of a free: at ``free_requested`` (what ``memory_snapshot.analyse`` uses) and at
    ``free_completed`` (a block freed while another stream still used it stays allocated, and in
    ``memory_allocated``, until the allocator processes its events), with the largest blocks
    requested but not completed then (size and source line)."""
    events = [e for dev in snap.get("device_traces", []) for e in dev]
    req: dict[int, tuple[int, list]] = {}
    comp: dict[int, tuple[int, list]] = {}
    out: dict[str, dict] = {}
    k = 0
    for e in events:
        a = e.get("action")
        if a == "alloc":
            if k < len(labels) and e["addr"] == labels[k][1] and e["size"] == mark_bytes:
                pending = sorted(((sz, fr) for addr, (sz, fr) in comp.items() if addr not in req),
                                 key=lambda t: -t[0])
                out[labels[k][0]] = {  # the last occurrence of a label wins: the last step's
                    "live_bytes_free_requested": sum(sz for sz, _ in req.values()),
                    "live_bytes_free_completed": sum(sz for sz, _ in comp.values()),
                    "pending": [{"bytes": sz, "site": _site(fr)} for sz, fr in pending[:top]]}
                k += 1
            req[e["addr"]] = comp[e["addr"]] = (int(e["size"]), e.get("frames") or [])
        elif a == "free_requested":
            req.pop(e["addr"], None)
        elif a == "free_completed":
            req.pop(e["addr"], None)
            comp.pop(e["addr"], None)
    return out


def _site(frames: list[dict]) -> str:
    mine = [f"{f['filename'].split('/planner/')[-1]}:{f.get('line', 0)}" for f in frames
            if "/planner/" in str(f.get("filename", ""))]
    return " < ".join(mine[:2]) if mine else next((n[:120] for n in _names(frames) if "at::" in n or "torch::" in n), "?")


def counts(freed: int, cublas_bytes: int, cublaslt_bytes: int) -> dict:
    """``n_cublas`` and ``n_lt`` from the bytes clearing the workspaces freed (``n_lt`` blocks are
    smaller than one cuBLAS workspace, so the split is unique), and what neither explains."""
    n_cublas = freed // cublas_bytes
    n_lt = (freed - n_cublas * cublas_bytes) // cublaslt_bytes if cublaslt_bytes else 0
    return {"n_cublas": int(n_cublas), "n_lt": int(n_lt),
            "unexplained_bytes": int(freed - n_cublas * cublas_bytes - n_lt * cublaslt_bytes)}


def child(name: str, out: Path, smoke: bool) -> dict:
    """One case in this (fresh) process; writes ``out/<name>.json``."""
    res = {"case": name, "model": CASES[name][0], "W": CASES[name][1], "S": CASES[name][2],
           "overrides": CASES[name][3], "lifetime": CASES[name][4], "budget": budget(name)}
    if smoke:
        res["status"] = "smoke (no CUDA run)"
    else:
        res.update(_measure(name, res["budget"]))
    write_text_atomic(out / f"{name}.json", json.dumps(res, indent=1, default=str) + "\n")
    return res


def _measure(name: str, bud: dict) -> dict:
    import torch

    import memory_snapshot as ms
    from planner.runtime import validate as v

    ms._labels.clear()
    ms._install_markers(torch)
    torch.cuda.memory._record_memory_history(max_entries=ms.MAX_ENTRIES, context="alloc", stacks="all")
    t0 = time.perf_counter()
    try:
        o = v.validate(planfile(name), steps=STEPS, grad_lifetime=CASES[name][4])
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    wall = time.perf_counter() - t0
    result = o.to_json()
    phases = ms.analyse(snap, list(ms._labels))
    marks = marker_totals(snap, list(ms._labels), ms.MARK_BYTES)
    blocks = workspace_blocks(snap)
    del snap
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    freed = before - after if clear is not None else 0
    unseen = {lab: int(p["measured"]["peak_bytes"]) - int(phases[lab]["peak_bytes"])
              for lab, p in (result.get("phases") or {}).items()
              if p.get("measured") and lab in phases and "peak_bytes" in phases[lab]}
    ss = next((r for r in result["rows"] if r["phase"] == "step start"), {})
    starts = {lab: int(p["measured"]["start_bytes"]) for lab, p in (result.get("phases") or {}).items()
              if p.get("measured")}
    if ss.get("measured") is not None:
        starts["step_start"] = int(ss["measured"])
    start_gaps = {lab: {"measured_minus_live_free_requested": starts[lab] - m["live_bytes_free_requested"],
                        "measured_minus_live_free_completed": starts[lab] - m["live_bytes_free_completed"],
                        "pending": m["pending"]} for lab, m in marks.items() if lab in starts}
    return {"status": "ran", "wall_s": wall, "workspace_blocks": blocks, "start_gaps": start_gaps,
            "freed_by_clear_bytes": int(freed), "left_after_clear_bytes": int(after),
            "measured": counts(freed, bud["cublas_bytes"], bud["cublaslt_bytes"]),
            "blocks_by_kind": {k: sum(1 for b in blocks if b["kind"] == k) for k in ("cublas", "cublaslt")},
            "unrecorded_bytes_by_phase": unseen,
            "step_start": {"measured": ss.get("measured"), "predicted": ss.get("predicted")},
            "validate": result, "phases": phases}


def summary(results: list[dict]) -> str:
    lines = ["| case | budget n_hd / n_lt | measured n_cublas / n_lt (freed by clear) | Lt blocks: thread, op, site | "
             "step start meas − pred MiB | step start meas − recorded live MiB (free requested / completed) |",
             "|---|---|---|---|---|---|"]
    for r in results:
        b = r["budget"]
        if r.get("status") != "ran":
            lines.append(f"| {r['case']} | {b['n_hd']} / {b['n_lt']} | {r.get('status')} | | | |")
            continue
        m = r["measured"]
        lt = "; ".join(f"{x['thread']} {x['op'].split('(')[0]} {x['site']}" for x in r["workspace_blocks"]
                       if x["kind"] == "cublaslt")
        ss = r["step_start"]
        d = (ss["measured"] - ss["predicted"]) / 2**20 if ss.get("measured") is not None else float("nan")
        g = r.get("start_gaps", {}).get("step_start")
        gap = (f"{g['measured_minus_live_free_requested'] / 2**20:+.2f} / "
               f"{g['measured_minus_live_free_completed'] / 2**20:+.2f}") if g else ""
        lines.append(f"| {r['case']} | {b['n_hd']} / {b['n_lt']} | {m['n_cublas']} / {m['n_lt']} "
                     f"(+{m['unexplained_bytes']} B) | {lt or '—'} | {d:+.2f} | {gap} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/blas_workspaces"))
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--child", choices=sorted(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true", help="List the cases and the budget's n_lt; run nothing.")
    ap.add_argument("--smoke", action="store_true", help="Spawn every child without a CUDA run (CPU check).")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child, out, args.smoke)
        return 0
    names = args.case or list(CASES)
    if args.dry_run:
        for n in names:
            b = budget(n)
            print(f"{n}: budget n_hd {b['n_hd']}, n_lt {b['n_lt']}")
        return 0
    t0, results = time.perf_counter(), []
    for n in names:
        if time.perf_counter() - t0 > args.budget_s:
            results.append({"case": n, "budget": budget(n), "status": "skipped (time budget)"})
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", n, "--out", str(out)] + (
            ["--smoke"] if args.smoke else [])
        status, _ = run_child(cmd, CHILD_TIMEOUT_S)
        f = out / f"{n}.json"
        r = json.loads(f.read_text()) if status == "ok" and f.exists() else {"case": n, "budget": budget(n),
                                                                           "status": status}
        results.append(r)
        print(f"{n}: {r.get('status')} ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_text_atomic(out / "blas_workspaces.json", json.dumps(
        {"cases": [{k: v for k, v in r.items() if k not in ("validate", "phases")} for r in results]},
        indent=1, default=str) + "\n")
    md = summary(results)
    write_text_atomic(out / "blas_workspaces.md", "# cuBLAS / cuBLASLt workspaces per case, each in a fresh process\n\n"
                      "Command: `python3 bench/blas_workspaces.py --out $OUT`\n\n" + md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
