"""``planner validate`` on the FSDP2 baseline, on one H200 (issue 12): the baseline step of
``planner.runtime.fsdp2`` measured phase by phase against the planner's baseline budget.

    python3 bench/validate_fsdp2.py --out "$OUT"             # on the GPU (< 8 min: a wall-clock budget)
    python3 bench/validate_fsdp2.py --dry-run --out /tmp/v   # anywhere: the matrix and the predictions

Matrix (models truncated to 2 layers; DeepSeek-V2-Lite's layer 0 dense, layer 1 MoE):

- W = 1 for real; W = 8, 32, 64 emulated (one rank under the fake process group: real memory,
  no-op communication), ``dp_shard = W`` with ``ep`` the planner's default;
- AC full, selective, none; both gradient lifetimes (freed, accumulate);
- ``tp`` 2 and 4 on Qwen3-30B-A3B (8 KV heads... 4: tp ≤ 4) and 8 on gpt-oss-20b, loss parallel;
- ``cp = W = 8`` with CPU offload at long context, both rotate methods, on Qwen3-30B-A3B (plain
  causal attention: ``context_parallel`` cannot shard gpt-oss's sinks / sliding windows, and
  DeepSeek's MLA head widths differ between keys and values);
- the chunked head.

Every case runs in this process through ``planner.runtime.validate.validate`` (the command's code
path), in priority order; a case that would start after ``--budget-s`` is recorded as skipped, so
the script ends in time. A CUDA out-of-memory is recorded (the planner predicted a fit, so it is a
miss). Writes ``validate_fsdp2.json`` (every case, rows and phases), ``validate_fsdp2.md`` (one line
per case) and the plan files under ``--out``.
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

LAYERS = 2
BUDGET_S = 420.0
"""Wall-clock budget: no case starts after it (the limit is 8 minutes)."""
STEPS = 3
FILL = 0.85
"""Cases whose predicted peak exceeds this share of the usable capacity are left out."""

# name: model, W, S, baseline knobs, gradient lifetime — in priority order
CASES = [
    ("qwen3-W1-full", "qwen3-30b-a3b", 1, 8192, {}, "freed"),
    ("gptoss-W1-full", "gpt-oss-20b", 1, 8192, {}, "accumulate"),
    ("dsv2-W1-selective", "deepseek-v2-lite", 1, 8192, {"ac": "selective"}, "freed"),
    ("qwen3-W8-full", "qwen3-30b-a3b", 8, 16384, {}, "freed"),
    ("qwen3-W8-selective", "qwen3-30b-a3b", 8, 16384, {"ac": "selective"}, "accumulate"),
    ("qwen3-W8-none", "qwen3-30b-a3b", 8, 8192, {"ac": "none"}, "freed"),
    ("gptoss-W32-full", "gpt-oss-20b", 32, 32768, {}, "freed"),
    ("dsv2-W64-full", "deepseek-v2-lite", 64, 32768, {}, "accumulate"),
    ("qwen3-W64-full", "qwen3-30b-a3b", 64, 32768, {}, "freed"),
    ("qwen3-W8-cp8-offload-allgather", "qwen3-30b-a3b", 8, 131072,
     {"cp": 8, "cpu_offload": True, "cp_rotate": "allgather"}, "freed"),
    ("qwen3-W8-cp8-offload-alltoall", "qwen3-30b-a3b", 8, 131072,
     {"cp": 8, "cpu_offload": True, "cp_rotate": "alltoall"}, "freed"),
    ("qwen3-W8-tp2", "qwen3-30b-a3b", 8, 16384, {"tp": 2}, "freed"),
    ("qwen3-W8-tp4", "qwen3-30b-a3b", 8, 16384, {"tp": 4}, "accumulate"),
    ("gptoss-W8-tp8", "gpt-oss-20b", 8, 16384, {"tp": 8}, "freed"),
    ("qwen3-W8-chunked-head", "qwen3-30b-a3b", 8, 32768, {"head": "chunked"}, "freed"),
    ("gptoss-W8-none-accumulate", "gpt-oss-20b", 8, 8192, {"ac": "none"}, "accumulate"),
    ("dsv2-W8-full", "deepseek-v2-lite", 8, 16384, {}, "freed"),
    # W = 1 at two more context lengths per model: the whole-step time at three lengths (issue 15)
    ("qwen3-W1-S4096", "qwen3-30b-a3b", 1, 4096, {}, "freed"),
    ("qwen3-W1-S16384", "qwen3-30b-a3b", 1, 16384, {}, "freed"),
    ("gptoss-W1-S4096", "gpt-oss-20b", 1, 4096, {}, "freed"),
    ("gptoss-W1-S16384", "gpt-oss-20b", 1, 16384, {}, "freed"),
    ("dsv2-W1-S4096", "deepseek-v2-lite", 1, 4096, {}, "freed"),
    ("dsv2-W1-S16384", "deepseek-v2-lite", 1, 16384, {}, "freed"),
]


def planned(fill: float = FILL):
    """``(name, model, W, S, knobs, lifetime, planfile, prediction, note)`` for every case."""
    out = []
    for name, model, W, S, knobs, lt in CASES:
        ov = {"stack": "fsdp2", **knobs}
        try:
            pf = truncate(build_planfile(model=model, gpus=W, seq_len=S, overrides=ov), LAYERS).planfile
            pred = predict(pf, lt, timing=W == 1)
        except Exception as e:  # noqa: BLE001 - a refused plan is recorded, not fatal
            out.append((name, model, W, S, knobs, lt, None, None, f"refused: {' '.join(str(e).split())[:200]}"))
            continue
        note = "" if pred.peak_bytes <= fill * pred.capacity_bytes else "predicted over the fill limit"
        out.append((name, model, W, S, knobs, lt, pf, pred, note))
    return out


def summary_line(c: dict) -> str:
    head = f"| {c['name']} | {c['W']} | {c['S']} | {c['lifetime']} |"
    if c["status"] != "ran":
        return f"{head} {c['status']} | | |"
    o = c["result"]
    judged = [r for r in o["rows"] if r["judged"] and r["unit"] == "bytes" and r["ratio"]]
    worst = max(judged, key=lambda r: abs(r["ratio"] - 1)) if judged else None
    wtxt = f"{worst['phase']} {worst['what']}: {worst['ratio']:.4f}" if worst else ""
    return (f"{head} {'ok' if o['ok'] else 'MISS'} | {o['predicted_peak_bytes'] / GiB:.2f} / "
            f"{o['measured_peak_bytes'] / GiB:.2f} | {wtxt} |")


def main(argv=None) -> int:
    ap = parser(__doc__, "bench/results/validate_fsdp2", BUDGET_S, STEPS)
    ap.add_argument("--worlds", type=int, nargs="+", default=None, help="world sizes to run (default: all)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    for name, model, W, S, knobs, lt, pf, pred, note in planned():
        if args.worlds and W not in args.worlds:
            continue
        c = {"name": name, "model": model, "W": W, "S": S, "knobs": knobs, "lifetime": lt, "layers": LAYERS}
        if pf is None or note:
            c["status"] = note
            results.append(c)
            print(f"{name}: {note}", flush=True)
            continue
        c.update(command=write_plan(out, name, pf, lt, args.steps),
                 N=int(pred.ctx.tokens_per_rank), predicted_peak_bytes=pred.peak_bytes,
                 predicted_binding_phase=pred.binding_phase, capacity_bytes=pred.capacity_bytes,
                 predicted_phases={lab: pred.phase_bytes(lab) for lab in pred.labels})
        run_case(c, pf, lt, args, t0)
        results.append(c)
        print(f"{name} ({lt}): {c['status']}" + (f" ({c['wall_s']:.1f} s)" if "wall_s" in c else "")
              + f"  predicted peak {pred.peak_bytes / GiB:.2f} GiB at {pred.binding_phase}", flush=True)
        if c.get("status") == "ran":
            for lab, ph in c["result"]["phases"].items():
                m = ph["measured"]
                mtxt = f"{m['peak_bytes'] / GiB:8.3f}" if m else "       -"
                print(f"    {lab:14s} predicted {ph['predicted_bytes'] / GiB:8.3f} GiB  measured {mtxt} GiB", flush=True)
    return finish(out, "validate_fsdp2", "planner validate on the FSDP2 baseline, one GPU",
                  "W = 1 runs for real; larger W run one rank under the fake process group.",
                  ["| case | W | S | gradients | verdict | peak GiB pred / meas | worst row (pred/meas) |",
                   "|---|---|---|---|---|---|---|"], [summary_line(c) for c in results], results, args, t0)


if __name__ == "__main__":
    sys.exit(main())
