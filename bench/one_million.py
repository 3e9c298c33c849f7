"""The 1M-context claim: for moe-120b/241b/667b at 16/32/64 GPUs and S = 1M, does the
composed stack fit, what binds, and how does the FSDP2 baseline fare? Memory only (no time model).

Usage: ``python3 bench/one_million.py [--out bench/results]`` → ``one_million.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.api import check_planfile  # noqa: E402
from planner.schema import Plan, PlanFile, Workload
from planner.schema.io import load_cluster, load_model
from planner.search.rank import lowest_peak
from planner.units import GiB

CASES = [("moe-120b", 16), ("moe-241b", 32), ("moe-667b", 64)]
S = 1 << 20


def row(name: str, W: int, stack: str, cluster, bound: str) -> dict:
    model = load_model(name)
    wl = Workload(seq_len=S)
    plan, peak, n_fit = lowest_peak(model, cluster, wl, world_size=W, stack=stack, dispatch_bound=bound)
    rep = check_planfile(PlanFile(model=model, cluster=cluster, workload=wl, plan=plan))
    default = check_planfile(PlanFile(model=model, cluster=cluster, workload=wl,
                                      plan=Plan(world_size=W, stack=stack, dispatch_bound=bound)))
    return {"model": name, "gpus": W, "stack": stack, "dispatch_bound": bound, "fitting_candidates": n_fit,
            "lowest_peak_gib": peak / GiB, "capacity_gib": rep.capacity_bytes / GiB, "fits": rep.fits,
            "binding_phase": rep.binding_phase, "binding_live_set": rep.binding_live_set,
            "binding_terms": rep.binding_terms, "plan": rep.planfile.plan.model_dump(mode="json"),
            "default_plan_fits": default.fits, "default_peak_gib": default.peak_bytes / GiB,
            "default_binding_live_set": default.binding_live_set,
            "default_binding_terms": default.binding_terms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    cluster = load_cluster("h200")
    rows = [row(n, W, stack, cluster, bound) for n, W in CASES
            for stack, bound in (("composed", "guarantee"), ("composed", "expected"), ("fsdp2", "guarantee"))]
    lines = ["| model | GPUs | stack | bound | fitting candidates | lowest peak GiB | binds (lowest-peak plan) | "
             "default plan: peak GiB, binding live set |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top = r["binding_terms"][0]
        k = r["plan"]["composed"] if r["stack"] == "composed" else r["plan"]["baseline"]
        knobs = (f"D={k['seq_parallel']} E_p={k['expert_parallel']} P={k['vocab_parallel']} {k['dispatch']} "
                 f"c={k['token_budget']} {k['vocab']}" if r["stack"] == "composed"
                 else f"tp={k['tp']} cp={k['cp']} ep={k['ep']} ac={k['ac']} offload={k['cpu_offload']}")
        lines.append(f"| {r['model']} | {r['gpus']} | {r['stack']} | {r['dispatch_bound'] if r['stack'] == 'composed' else '—'} "
                     f"| {r['fitting_candidates']} | {r['lowest_peak_gib']:.1f} of {r['capacity_gib']:.1f} ({knobs}) "
                     f"| {r['binding_phase']}: {r['binding_live_set']} ({top['name']}) "
                     f"| {r['default_peak_gib']:.1f}, {r['default_binding_live_set']} |")
    md = "\n".join(lines)
    print(md)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["python3", *sys.argv])
    (out / "one_million.json").write_text(json.dumps({"command": cmd, "date": date.today().isoformat(),
                                                      "seq_len": S, "rows": rows}, indent=1))
    (out / "one_million.md").write_text(f"# The 1M-context claim (memory)\n\n`{cmd}` — {date.today()}\n\n{md}\n")


if __name__ == "__main__":
    main()
