"""``planner validate`` on one H200: gpt-oss-20b, Qwen3-30B-A3B and DeepSeek-V2-Lite, truncated in
depth, at W = 1 for real and W = 8 and 64 emulated (one rank under the fake process group), each at
several N up to the largest the planner says fits, under both gradient lifetimes (issue 11).

    python3 bench/validate.py --out "$OUT"             # on the GPU (< 8 min: a wall-clock budget)
    python3 bench/validate.py --dry-run --out /tmp/v   # anywhere: the matrix and the predictions

Every case runs in this one process (``planner.runtime.validate.validate``, the code path of the
command), ``--steps 2`` by default: first the largest N of every (model, W), then the next N (W = 1
up to S = 65536, two lengths; W = 8 and 64 three), the emulated cases of each pass first. A case that would start after
``--budget-s`` is recorded as skipped, so the script always ends in time; a CUDA out-of-memory is
recorded as such (the planner predicted a fit, so it is a miss). Writes ``validate.json`` (every
case: the command, the rows, the phases) and ``validate.md`` (one line per case) under ``--out``,
plus the plan file of each case under ``--out/plans``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _validate_runner import finish, parser, run_case, write_plan  # noqa: E402

from planner.api import build_planfile  # noqa: E402
from planner.runtime.validate_plan import predict, truncate  # noqa: E402
from planner.units import GiB  # noqa: E402

MODELS = {"gpt-oss-20b": 2, "qwen3-30b-a3b": 2, "deepseek-v2-lite": 2}
"""Model → layers kept (DeepSeek-V2-Lite's layer 0 is dense, layer 1 MoE)."""
WORLDS = (1, 8, 64)
LIFETIMES = ("freed", "accumulate")
SEQ_LENS = (4096, 8192, 16384, 32768, 65536, 131072)
"""Context lengths tried; per (model, W) the largest ``N_PER_CASE[W]`` that the planner says fit."""
MAX_SEQ_REAL = 65536
"""Longest context run for real (W = 1): DeepSeek-V2-Lite's W = 1 step at S = 131072 takes 14.5 s on
the H200, a third of the matrix's budget, and checks nothing S = 65536 does not."""
N_PER_CASE = {1: 2, 8: 3, 64: 3}
"""Context lengths per (model, W): two for the real W = 1 runs (the expensive ones), three emulated."""
FILL = 0.85
"""Cases whose predicted peak exceeds this share of the usable capacity are left out (headroom for
the measurement to exceed the prediction without an out-of-memory)."""
BUDGET_S = 390.0
"""Wall-clock budget: no case starts after it (the GPU machine's per-command limit is 10 minutes)."""
STEPS = 2
"""Steps per case: the first builds the optimizer state and the library workspaces, the second is
compared (and timed)."""


def cases(fill: float = FILL, worlds=WORLDS, lifetimes=LIFETIMES, per_case=None, max_seq_real: int = MAX_SEQ_REAL):
    """``(model, W, S, layers, lifetime, planfile, prediction)`` in run order: the largest N of
    every (model, W) under both lifetimes, then the next N, and so on; within a pass the emulated
    (fast) cases first, so a budget cut drops the smallest real runs. ``per_case`` overrides
    ``N_PER_CASE`` (context lengths per (model, W)); ``max_seq_real`` caps the W = 1 contexts."""
    n_per_case = {**N_PER_CASE, **(per_case or {})}
    passes: list[list] = [[] for _ in range(max(n_per_case.values()))]
    for model, layers in MODELS.items():
        for W in worlds:
            fits = []
            for S in SEQ_LENS:
                if W == 1 and S > max_seq_real:
                    continue
                pf = truncate(build_planfile(model=model, gpus=W, seq_len=S), layers).planfile
                pred = predict(pf, "accumulate", timing=False)
                if pred.peak_bytes <= fill * pred.capacity_bytes:
                    fits.append((S, pf))
            for i, (S, pf) in enumerate(reversed(fits[-n_per_case[W]:])):
                for lt in lifetimes:
                    passes[i].append((model, W, S, layers, lt, pf, predict(pf, lt, timing=(W == 1))))
    return [c for p in passes for c in sorted(p, key=lambda c: c[1] == 1)]


def summary_line(c: dict) -> str:
    if c["status"] != "ran":
        return f"| {c['model']} | {c['W']} | {c['S']} | {c['N']} | {c['lifetime']} | {c['status']} | | | |"
    o = c["result"]
    worst = max((r for r in o["rows"] if r["judged"] and r["unit"] == "bytes" and r["ratio"]),
                key=lambda r: abs(r["ratio"] - 1))
    t = o["step_s"]
    tp = o["predicted_step_s"]
    time_txt = f"{t:.3f} s (pred {tp:.3f})" if t is not None and tp is not None else (f"{t:.3f} s" if t else "")
    return (f"| {c['model']} | {c['W']} | {c['S']} | {c['N']} | {c['lifetime']} | "
            f"{'ok' if o['ok'] else 'MISS'} | {o['predicted_peak_bytes'] / GiB:.2f} / "
            f"{o['measured_peak_bytes'] / GiB:.2f} | {worst['phase']} {worst['what']}: {worst['ratio']:.4f} | {time_txt} |")


def main(argv=None) -> int:
    ap = parser(__doc__, "bench/results/validate", BUDGET_S, STEPS)
    ap.add_argument("--worlds", type=int, nargs="+", choices=WORLDS, default=list(WORLDS),
                    help="world sizes to run (default: all)")
    ap.add_argument("--lifetimes", nargs="+", choices=LIFETIMES, default=list(LIFETIMES),
                    help="gradient lifetimes to run (default: both)")
    ap.add_argument("--lengths", type=int, default=None,
                    help="context lengths per (model, W), overriding N_PER_CASE for every W")
    ap.add_argument("--max-seq-len", type=int, default=MAX_SEQ_REAL,
                    help=f"longest context run for real at W = 1 (default {MAX_SEQ_REAL})")
    args = ap.parse_args(argv)
    if args.lengths is not None and args.lengths < 1:
        ap.error(f"--lengths ({args.lengths}) must be >= 1 (context lengths per model and W)")
    if args.max_seq_len < SEQ_LENS[0]:
        ap.error(f"--max-seq-len ({args.max_seq_len}) must be >= {SEQ_LENS[0]}, the shortest context tried")
    out = Path(args.out)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    per_case = {W: args.lengths for W in WORLDS} if args.lengths is not None else None
    for model, W, S, layers, lt, pf, pred in cases(worlds=args.worlds, lifetimes=args.lifetimes, per_case=per_case,
                                                   max_seq_real=args.max_seq_len):
        name = f"{model}-W{W}-S{S}-L{layers}"
        c = {"model": model, "W": W, "S": S, "N": int(pred.ctx.tokens_per_rank), "layers": layers, "lifetime": lt,
             "command": write_plan(out, name, pf, lt, args.steps), "predicted_peak_bytes": pred.peak_bytes,
             "predicted_binding_phase": pred.binding_phase, "capacity_bytes": pred.capacity_bytes,
             "predicted_step_s": pred.step_s}
        run_case(c, pf, lt, args, t0)
        results.append(c)
        print(f"{name} {lt}: {c['status']}" + (f" ({c['wall_s']:.1f} s)" if "wall_s" in c else "")
              + f"  predicted peak {pred.peak_bytes / GiB:.2f} GiB at {pred.binding_phase}", flush=True)
    return finish(out, "validate", "planner validate on one GPU",
                  "W = 1 runs for real; W = 8 and 64 run one rank under the fake process group (real memory, "
                  "no-op communication).",
                  ["| model | W | S | N | gradients | verdict | peak GiB pred / meas | worst row (pred/meas) | step time |",
                   "|---|---|---|---|---|---|---|---|---|"], [summary_line(c) for c in results], results, args, t0)


if __name__ == "__main__":
    sys.exit(main())
