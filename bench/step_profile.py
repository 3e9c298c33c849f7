"""Where a short FSDP2 step's time goes on the GPU: busy kernels by kind, and the idle time in
which the GPU waits for the host (issue 15: the W = 1 steps at 4k–16k are predicted 9–42% short).

    python3 bench/step_profile.py --out "$OUT"            # one H200: ~1 min
    python3 bench/step_profile.py --dry-run --out /tmp/p  # CPU: tiny widths, gloo, same code path

For each case (``bench/validate_fsdp2.py``'s W = 1 cases of ``CASES``) the step of the plan the
bench builds (``planner.runtime.validate``'s path: the same plan, ``plan_dispatch``, the synthetic
batch) runs ``WARMUP`` steps, then ``STEPS`` steps under ``torch.profiler`` (CPU and CUDA
activities). From the trace: the wall time of the profiled steps; the union of the GPU's kernel,
memcpy and memset intervals (``busy``) and ``wall − busy`` (``idle``: the GPU waiting for the
host, whatever the host was doing); kernel seconds by kind (GEMM, attention, NCCL, memcpy/memset,
other), and the host-side CPU seconds of the top-level ops. Writes ``step_profile.json`` and
``step_profile.md`` under ``--out``. The time model's host floor (``planner/timing/baseline_host.py``)
says the idle time is the host's beyond the GPU's; this measures it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

CASES = ("qwen3-W1-S4096", "gptoss-W1-S4096", "dsv2-W1-S4096", "qwen3-W1-S16384")
WARMUP, STEPS = 2, 2
KINDS = (("nccl", ("nccl",)), ("attention", ("flash", "fmha", "attention", "efficient")),
         ("gemm", ("gemm", "cutlass", "sm90_", "cublas", "xmma", "nvjet")),
         ("memcpy", ("memcpy", "memset")))


def kind_of(name: str, cat: str) -> str:
    n = name.lower()
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy"
    for k, keys in KINDS:
        if any(x in n for x in keys):
            return k
    return "other"


def union_s(intervals) -> float:
    """Seconds covered by ``[(start_us, dur_us)]``."""
    total, end = 0.0, None
    for s, d in sorted(intervals):
        e = s + d
        if end is None or s > end:
            total += d
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e6


def summarise(trace: dict, wall_s: float, steps: int) -> dict:
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by = {}
    for e in gpu:
        k = kind_of(e.get("name", ""), e.get("cat", ""))
        by[k] = by.get(k, 0.0) + e["dur"] / 1e6
    busy = union_s([(e["ts"], e["dur"]) for e in gpu])
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    return {"wall_s": wall_s / steps, "gpu_busy_s": busy / steps, "gpu_idle_s": max(0.0, wall_s - busy) / steps,
            "kernel_s_by_kind": {k: v / steps for k, v in sorted(by.items())}, "kernels": len(gpu) // steps,
            "cpu_ops": len(ops) // steps}


def profile_case(pf, ctx, device, steps: int = STEPS, warmup: int = WARMUP) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from planner.runtime.validate import build_step, plan_dispatch, synthetic_batch

    step = build_step(pf, device=device, grad_lifetime=ctx.grad_lifetime)
    plan_dispatch(step.model, ctx)
    tokens, targets = synthetic_batch(ctx, device, torch)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step.step(tokens, targets)
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step.step(tokens, targets)
        sync()
        wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    del step
    return summarise(trace, wall, steps)


def planned(dry: bool):
    """``(name, planfile, ctx)`` of the cases; ``dry``: widths shrunk (``calibration.step_host.tiny_spec``)."""
    import dataclasses

    import validate_fsdp2 as vf

    from calibration.step_host import tiny_spec
    from planner.context.derive import derive_context

    out = []
    for name, model, W, S, knobs, lt, pf, pred, note in vf.planned():
        if name not in CASES or pf is None:
            continue
        if dry:
            pf = pf.model_copy(update={"model": tiny_spec(pf.model),
                                       "workload": pf.workload.model_copy(update={"seq_len": 256})})
            ctx = derive_context(pf.model, pf.cluster, pf.workload, pf.plan)[0]
        else:
            ctx = pred.ctx
        out.append((name, pf, dataclasses.replace(ctx, grad_lifetime=lt)))
    return out


def markdown(doc: dict) -> str:
    lines = [f"# Short FSDP2 steps on the GPU ({doc['provenance']['device']})", "",
             f"`{doc['provenance']['command']}`", "",
             "| case | wall ms | GPU busy ms | GPU idle ms | kernels ms by kind | kernels | CPU ops |",
             "|---|---|---|---|---|---|---|"]
    for name, r in doc["cases"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:100]} | | | | | |")
            continue
        kinds = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in r["kernel_s_by_kind"].items())
        lines.append(f"| {name} | {r['wall_s'] * 1e3:.1f} | {r['gpu_busy_s'] * 1e3:.1f} | {r['gpu_idle_s'] * 1e3:.1f} | "
                     f"{kinds} | {r['kernels']} | {r['cpu_ops']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny widths, gloo: the code path only")
    args = ap.parse_args(argv)
    import shlex

    import torch
    import torch.distributed as dist

    from calibration.step_host import _start_world
    from planner.runtime.measure import provenance
    from planner.schema.io import write_text_atomic

    dry = args.dry_run or not torch.cuda.is_available()
    device = torch.device("cpu") if dry else torch.device("cuda", torch.cuda.current_device())
    cmd = " ".join(shlex.quote(a) for a in ["python3", "bench/step_profile.py", *(sys.argv[1:] if argv is None else argv)])
    _start_world(device)
    cases = {}
    try:
        for name, pf, ctx in planned(dry):
            try:
                cases[name] = profile_case(pf, ctx, device, steps=1 if dry else STEPS, warmup=1 if dry else WARMUP)
            except Exception as e:  # noqa: BLE001 - a failed case is recorded, the others still run
                cases[name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    doc = {"provenance": provenance(cmd), "dry_run": dry, "cases": cases}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "step_profile.json", json.dumps(doc, indent=1))
    write_text_atomic(out / "step_profile.md", markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
