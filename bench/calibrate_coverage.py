"""Calibration coverage with held-out curves: one GPU, one command, a wall budget.

    python3 bench/calibrate_coverage.py --out $OUT [--budget-s 390]      # one H200, < 7 min
    python3 bench/calibrate_coverage.py --dry-run --out /tmp/cov         # CPU, tiny shapes, same code

``planner calibrate`` measures the profile's coverage sections itself
(``calibration.coverage_sections``); this script runs the same measurements under one shared wall
budget and adds what only the benches need. Sections (run order: ``SECTIONS``, attention last; each
has a share of the budget plus what earlier ones left; a point that would not fit is skipped and
listed under ``skipped``; every section's results are written as soon as it ends):

- ``attention``: ``calibration.attention_long`` (causal attention forward and backward at long
  ``S`` per variant and heads per rank).
- ``dispatch_widths``: ``calibration.dispatch_widths`` (the dispatch kernels at every shipped width).
- ``chunk_curves``: PipelinedLLEP forward+backward at ``K`` ∈ {1, 2, 3, 5, 10, 20} at bench shapes
  A and B (balanced, ``c = ceil(N/K)``) on rank 0 of ``E_p = 8`` emulated as the calibration hook
  does (``planner.runtime.pipelined_llep_calibration.emulation``): the held-out chunk curves.
- ``sco``: ``calibration.sco_overlap`` (plain checkpointing against SCO).
- ``host``: fused CPU AdamW and the bf16↔fp32 casts at 10⁹ parameters per thread count (the
  ``cpu_adamw``/``cpu_cast`` tables), then ``bench/offload.py --modes bw,opt`` on this instance
  (CPUOffloadAdamW rows with the same ``host_instance``).

Writes ``coverage.json`` (every section, provenance with ``host_instance``, ``skipped``, per-section
wall times) under ``--out`` and ``offload_opt/offload.json`` from the host section;
``python3 -m calibration.coverage`` turns it into a profile fragment.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from calibration import attention_long, dispatch_widths, sco_overlap  # noqa: E402
from calibration.config import HOST_TABLE_PARAMS  # noqa: E402
from calibration.io import command_line  # noqa: E402
from calibration.wall_budget import Clock, timed  # noqa: E402

SHARES = {"attention": 0.43, "dispatch_widths": 0.12, "chunk_curves": 0.09, "sco": 0.10, "host": 0.26}
"""Each section's share of ``--budget-s`` (a section may also use what earlier ones left)."""
BENCH_TIMEOUT_S = 120.0
"""The CPUOffloadAdamW bench subprocess (~45 s on an H200 host) is killed after this long."""
FULL = dict(attention=dict(attention_long.FULL, **attention_long.BEYOND), grid="full", chunk_ks=(1, 2, 3, 5, 10, 20),
            chunk_shapes={"A": dict(N=65536, H=7168, I=2048, E=128, k=8), "B": dict(N=32768, H=4096, I=4096, E=128, k=4)},
            host_params=HOST_TABLE_PARAMS, host_threads=(1, 2, 4, 8, 16))
DRY = dict(attention=attention_long.SMOKE, grid="smoke", chunk_ks=(1, 2),
           chunk_shapes={"A": dict(N=512, H=64, I=32, E=16, k=4)}, host_params=1 << 16, host_threads=(1, 2))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# chunk-count curves
# ------------------------------------------------------------------------------------------------
def chunk_curves(cfg, dev, clock: Clock, dry: bool) -> dict:
    import torch

    from planner.runtime.pipelined_llep_calibration import EMULATED_EXPERT_PARALLEL, calibration_case, emulation

    out = {}
    with emulation(dev) as filler:
        for tag, dims in cfg["chunk_shapes"].items():
            ks, times, fills, shape = [], [], [], {}
            for K in cfg["chunk_ks"]:
                guess = times[-1] * 2 if times else 0.0
                if not clock.fits(guess, margin=3.0):
                    clock.skip(f"chunk_curves {tag} K={K}: out of budget")
                    continue
                run, shape = calibration_case(K, smoke=dry, device=dev, dims=dims)
                filler.nbytes = 0
                run()  # warm-up; one call's fill bytes
                fills.append(float(filler.nbytes))
                t, _ = timed(run, dev, 0.0)
                ks.append(K)
                times.append(t)
                del run
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                log(f"chunk curve {tag} K={K:2d} (rank 0 of E_p = {EMULATED_EXPERT_PARALLEL}): {t * 1e3:.1f} ms")
            out[tag] = {"num_chunks": ks, "time_s": times, "fill_bytes": fills, "shape": shape}
    return {"curves": out, "note": f"PipelinedLLEP forward+backward on rank 0 of E_p = {EMULATED_EXPERT_PARALLEL} "
                                   "emulated on one GPU (the calibration hook, planner.runtime.pipelined_llep_calibration: "
                                   "fake process group, every all-to-all output filled from random data, fill_bytes per "
                                   "call), balanced routing, c = ceil(N/K), K_max = max(K, 10), router and out.backward "
                                   "of a random N×H gradient included"}


# ------------------------------------------------------------------------------------------------
# host AdamW and casts at the benches' parameter counts, then the CPUOffloadAdamW bench
# ------------------------------------------------------------------------------------------------
def host(cfg, clock: Clock, dry: bool, out: Path) -> dict:
    import torch

    n = cfg["host_params"]
    res: dict = {"num_params": n, "threads": [], "adamw_s_per_param": [], "cast_s_per_param": []}
    bench_s = 8.0 if dry else 70.0
    t0 = time.perf_counter()
    p = torch.nn.Parameter(torch.rand(n, dtype=torch.float32))
    p.grad = torch.rand(n, dtype=torch.float32)
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)
    opt.step()  # allocates exp_avg, exp_avg_sq
    lo = torch.zeros(n, dtype=torch.bfloat16)

    def casts():
        p.data.copy_(lo)
        lo.copy_(p.data)
    log(f"host: {n:.3g} parameters allocated in {time.perf_counter() - t0:.1f} s")
    prev = torch.get_num_threads()
    try:
        for T in sorted(cfg["host_threads"], reverse=True):   # fast ones first: a cut drops T = 1
            if not clock.fits(bench_s, margin=1.0):
                clock.skip(f"host tables at {T} threads: out of budget")
                continue
            torch.set_num_threads(T)
            ta, _ = timed(opt.step, torch.device("cpu"), 0.0)
            tc, _ = timed(casts, torch.device("cpu"), 0.0)
            res["threads"].insert(0, T)
            res["adamw_s_per_param"].insert(0, ta / n)
            res["cast_s_per_param"].insert(0, tc / n)
            log(f"host {T:2d} threads: AdamW {ta * 1e9 / n:.3f} s/1e9, casts {tc * 1e9 / n:.3f} s/1e9")
    finally:
        torch.set_num_threads(prev)
    del opt, p, lo
    res["note"] = (f"torch.optim.AdamW(fused=True) on one host fp32 parameter of {n} elements (state ≫ LLC); "
                   "casts: bf16→fp32 copy_ then fp32→bf16 copy_ of the same length; each ≥ 0.5 s call timed "
                   "once after a warm call, shorter ones the median of three")
    cmd = [sys.executable, str(ROOT / "bench" / "offload.py"), "--modes", "bw,opt", "--out", str(out / "offload_opt")]
    if dry:
        cmd.append("--smoke")
    if not clock.fits(bench_s - 30, margin=1.0):
        clock.skip("bench/offload.py --modes bw,opt: out of budget")
        return res
    log("host: " + " ".join(shlex.quote(c) for c in cmd))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run(cmd, env=env, timeout=min(BENCH_TIMEOUT_S, max(30.0, clock.left())),
                              capture_output=True, text=True)
        res["offload_bench_rc"] = proc.returncode
        print(proc.stdout[-4000:], proc.stderr[-2000:], flush=True)
    except subprocess.TimeoutExpired:
        clock.skip("bench/offload.py --modes bw,opt: timed out")
    return res


# ------------------------------------------------------------------------------------------------
def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float))
    os.replace(tmp, path)


SECTIONS = ("dispatch_widths", "chunk_curves", "sco", "host", "attention")
"""Run order: attention last, so that it gets every second the others left (its long-``S`` points are
the costliest and the most valuable)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for coverage.json and offload_opt/")
    ap.add_argument("--budget-s", type=float, default=390.0, help="wall budget of the whole run (default 390)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, same code paths")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of " + ", ".join(SECTIONS))
    ap.add_argument("--seqs", help="attention: comma list of S instead of the grid's (e.g. 524288,1048576,2097152)")
    ap.add_argument("--variants", help="attention: comma list of variants (default all)")
    ap.add_argument("--median-of", type=int, default=1,
                    help="time a point of ≥ 0.5 s as the median of this many calls (default 1)")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or args.budget_s <= 0:
        print(f"error: --sections {bad[0]!r} is not one of {', '.join(SECTIONS)}" if bad else
              f"error: --budget-s {args.budget_s} must be positive", file=sys.stderr)
        return 2
    import torch

    from calibration.dispatch_kernels import host_instance
    from planner.runtime.measure import provenance

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("error: no CUDA device; fix: run on the GPU, or pass --dry-run for the CPU code-path check",
              file=sys.stderr)
        return 2
    dev = torch.device("cuda" if cuda else "cpu")
    cfg = dict(DRY if args.dry_run else FULL)
    att = dict(cfg["attention"])
    try:
        if args.variants:
            bad_v = [v for v in args.variants.split(",") if v not in att["variants"]]
            if bad_v:
                raise ValueError(f"--variants {bad_v[0]!r} is not one of {', '.join(att['variants'])}")
            att["variants"] = {k: v for k, v in att["variants"].items() if k in args.variants.split(",")}
            att["beyond_variants"] = tuple(v for v in att["beyond_variants"] if v in att["variants"])
        if args.seqs:
            seqs = sorted(int(x) for x in args.seqs.split(","))
            if not seqs or seqs[0] < 1:
                raise ValueError(f"--seqs {args.seqs!r} must be positive integers")
            att["seqs"], att["beyond"] = tuple(seqs), ()
        if args.median_of < 1:
            raise ValueError(f"--median-of {args.median_of} must be ≥ 1")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = command_line("python3 bench/calibrate_coverage.py", argv)
    prov = {**provenance(command), "host_instance": host_instance()}
    skipped: list[str] = []
    doc = {"provenance": prov, "command": command, "budget_s": args.budget_s, "dry_run": args.dry_run,
           "skipped": skipped, "section_s": {}, "failed": {}}
    log(f"coverage on {prov['device']} (torch {torch.__version__}), budget {args.budget_s:.0f} s, "
        f"sections {', '.join(sections)}")
    min_time = attention_long.MIN_TIME_S[cfg["grid"]]

    def partial_attention(section: dict) -> None:
        write_json(out / "coverage.json", {**doc, "attention": section})

    runners = {"attention": lambda clock: attention_long.measure(att, dev, clock, min_time, median_of=args.median_of,
                                                                 partial=partial_attention, log=log),
               "dispatch_widths": lambda clock: dispatch_widths.measure(cfg["grid"], dev, clock, prov, command, log=log),
               "chunk_curves": lambda clock: chunk_curves(cfg, dev, clock, args.dry_run),
               "sco": lambda clock: sco_overlap.measure(sco_overlap.GRIDS[cfg["grid"]], dev, clock, log=log),
               "host": lambda clock: host(cfg, clock, args.dry_run, out)}
    t_run, done_shares = time.perf_counter(), 0.0
    for name in sections:
        elapsed = time.perf_counter() - t_run
        spare = max(0.0, done_shares * args.budget_s - elapsed)   # what earlier sections left
        done_shares += SHARES[name]
        budget = min(args.budget_s - elapsed, SHARES[name] * args.budget_s + spare)
        log(f"== {name} (budget {budget:.0f} s, run left {args.budget_s - elapsed:.0f} s)")
        if budget <= 0:
            skipped.append(f"{name}: the run's budget is spent")
            continue
        clock = Clock(budget, log=log)
        try:
            doc[name] = runners[name](clock)
        except Exception as err:  # noqa: BLE001 - one broken section must not lose the others
            import traceback

            traceback.print_exc()
            doc["failed"][name] = f"{type(err).__name__}: {err}"
        skipped += clock.skipped
        doc["section_s"][name] = time.perf_counter() - clock.t0
        doc["wall_s"] = time.perf_counter() - t_run
        write_json(out / "coverage.json", doc)
        if cuda:
            torch.cuda.empty_cache()
    log(f"wrote {out / 'coverage.json'} in {doc.get('wall_s', 0.0):.1f} s; skipped {len(skipped)}, "
        f"failed {list(doc['failed'])}")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
