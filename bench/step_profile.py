"""Where a real W = 1 step's time goes, beside the time model's components (issue 15).

    python3 bench/step_profile.py --out "$OUT"            # on the GPU: every case, < 4 min
    python3 bench/step_profile.py --dry-run --out /tmp/p  # anywhere: the cases and the predictions

Each case builds ``planner validate``'s own step (``planner.runtime.validate.build_step``, the
routing of the plan's profile), runs ``WARMUP`` steps, then one step under ``torch.profiler``
(CUDA and CPU activity). Every GPU kernel is put in one class by its name (``KERNEL_CLASSES``: attention,
GEMM, optimizer, copies, elementwise/other) and the GPU's busy time is the union of the kernel
intervals; ``idle_s`` = the step's wall time − busy time (the GPU waiting on the host: launch
overhead, synchronisations). Writes ``step_profile.json``: per case the measured classes, the
predicted ``step_components`` (``planner.timing.step``), the step's wall time and the 25 kernels
that took the most time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.api import build_planfile  # noqa: E402
from planner.runtime.validate import COMPARED_BOUND  # noqa: E402
from planner.runtime.validate_plan import predict, truncate  # noqa: E402
from planner.schema.io import write_text_atomic  # noqa: E402

CASES = [
    # (name, model, S, layers, overrides): the composed stack's W = 1 runs of bench/validate.py and
    # the FSDP2 baseline's of bench/validate_fsdp2.py, at the lengths where the time model is farthest off
    ("composed-qwen3-S65536", "qwen3-30b-a3b", 65536, 2, None),
    ("composed-qwen3-S16384", "qwen3-30b-a3b", 16384, 2, None),
    ("composed-gptoss-S65536", "gpt-oss-20b", 65536, 2, None),
    ("composed-dsv2-S65536", "deepseek-v2-lite", 65536, 2, None),
    ("fsdp2-qwen3-S8192", "qwen3-30b-a3b", 8192, 2, {"stack": "fsdp2"}),
    ("fsdp2-dsv2-S4096", "deepseek-v2-lite", 4096, 2, {"stack": "fsdp2"}),
]
BUDGET_S = 240.0
"""Wall-clock budget: no case starts after it."""
WARMUP = 2
"""Steps before the profiled one: the first builds the optimizer state and the library workspaces."""
KERNEL_CLASSES = (
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm100_", "splitk")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("copies", ("memcpy", "memset", "copy_", "copykernel", "direct_copy", "cat_", "catarray")),
)
"""Kernel name substrings (lower case) per class, tried in order; the rest is ``other``
(elementwise, reductions, indexing, sort)."""


def classify(name: str) -> str:
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end)`` intervals (µs in, s out)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e6


def profile_case(pf, ctx, lifetime: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from planner.runtime import validate as v

    mode, rank = v._world(ctx.world_size, 0, torch)
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(v.SEED)
    step = v.build_step(pf, device=device, grad_lifetime=lifetime, rank=rank)
    try:
        v.plan_dispatch(step.model, ctx)
        tokens, targets = v.synthetic_batch(ctx, device, torch)
        step.on_phase = lambda *a, **k: None
        for _ in range(WARMUP):
            step.step(tokens, targets)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            step.step(tokens, targets)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        torch.cuda.synchronize()
        t0 = time.perf_counter()   # the same step without the profiler's overhead
        step.step(tokens, targets)
        torch.cuda.synchronize()
        wall_plain = time.perf_counter() - t0
    finally:
        if hasattr(step, "close"):
            step.close()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)]   # record_function ranges are not kernels
    by_class: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for e in kernels:
        dur = e.time_range.elapsed_us() / 1e6
        by_class[classify(e.name)] = by_class.get(classify(e.name), 0.0) + dur
        agg = by_name.setdefault(e.name, [0.0, 0])
        agg[0] += dur
        agg[1] += 1
    busy = busy_seconds([(e.time_range.start, e.time_range.end) for e in kernels])
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    return {"mode": mode, "wall_s_profiled": wall, "wall_s": wall_plain, "gpu_busy_s": busy,
            "idle_s": max(0.0, wall_plain - busy), "kernel_s_by_class": by_class, "kernels": len(kernels),
            "top_kernels": [{"name": n[:160], "class": classify(n), "s": s, "calls": c} for n, (s, c) in top]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results/step_profile"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--cases", nargs="+", default=None, help="case names (default: all)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="no case starts after this many seconds")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, start = [], time.perf_counter()
    for name, model, S, layers, ov in CASES:
        if args.cases and name not in args.cases:
            continue
        if time.perf_counter() - start > args.budget_s:
            results.append({"case": name, "skipped": "time budget"})
            continue
        pf = truncate(build_planfile(model=model, gpus=1, seq_len=S, overrides=ov), layers).planfile
        pred = predict(pf, "freed", timing=True, dispatch_bound=COMPARED_BOUND)   # as validate compares
        comps = pred.step_components
        rec = {"case": name, "model": model, "S": S, "layers": layers, "overrides": ov or {},
               "predicted_step_s": pred.step_s, "predicted_components_s": comps}
        if not args.dry_run:
            t0 = time.perf_counter()
            try:
                rec["measured"] = profile_case(pf, pred.ctx, "freed")
            except Exception as err:  # noqa: BLE001 - one failed case must not lose the others
                rec["error"] = f"{type(err).__name__}: {err}"
            rec["wall_s"] = time.perf_counter() - t0
        results.append(rec)
        m = rec.get("measured", {})
        print(f"{name}: predicted {pred.step_s:.3f} s {({k: round(v, 3) for k, v in comps.items()})}"
              + (f"\n   measured {m['wall_s']:.3f} s busy {m['gpu_busy_s']:.3f} "
                 f"{({k: round(v, 3) for k, v in m['kernel_s_by_class'].items()})}" if m else f" {rec.get('error', '')}"),
              flush=True)
        write_text_atomic(out / "step_profile.json", json.dumps({"cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
