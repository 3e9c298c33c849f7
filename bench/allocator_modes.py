"""Each validation case under both caching-allocator modes, each in a fresh process: what the
allocator counts (``allocated_bytes``) against what the tensors requested (``requested_bytes``) at
every phase start, and the budget's rows (``planner.runtime.allocator`` says why it matters).

``python3 bench/allocator_modes.py --out $OUT`` runs, per case of ``blas_workspaces.CASES`` and per
mode (``expandable``: ``expandable_segments:True``; ``default``: ``False``), ``planner.runtime.
validate.validate`` on the case's plan with the cluster file's ``memory.expandable_segments`` set to
the mode. At each phase boundary of the last step it reads the allocator's counters; it writes
``<case>-<mode>.json``, ``allocator_modes.json`` and ``allocator_modes.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import blas_workspaces as bw  # noqa: E402
from _process import run_child  # noqa: E402

from planner.schema.io import write_text_atomic  # noqa: E402

MODES = {"expandable": True, "default": False}
CHILD_TIMEOUT_S = 100
BUDGET_S = 150.0
"""No run starts after this many seconds (cases in priority order, both modes of a case together)."""
MiB = 2 ** 20


def planfile(name: str, expandable: bool):
    pf = bw.planfile(name)
    mem = pf.cluster.memory.model_copy(update={"expandable_segments": expandable})
    return pf.model_copy(update={"cluster": pf.cluster.model_copy(update={"memory": mem})})


def _install_counters(torch, marks: dict) -> None:
    """Read the allocator's counters at every phase boundary (the last step's reading wins)."""
    from planner.runtime import phase_recorder as pr

    cls = pr.PhaseRecorder
    start, call = cls.start, cls.__call__

    def read(label):
        st = torch.cuda.memory_stats()
        marks[label] = {"allocated": int(st.get("allocated_bytes.all.current", 0)),
                        "requested": int(st.get("requested_bytes.all.current", 0))}

    def m_start(self):
        read("step start")
        start(self)

    def m_call(self, name, r=None):
        read(f"{name}[{r}]" if r is not None else name)
        call(self, name, r)

    cls.start, cls.__call__ = m_start, m_call


def child(name: str, mode: str, out: Path) -> dict:
    import torch

    from planner.runtime import validate as v

    marks: dict = {}
    _install_counters(torch, marks)
    t0 = time.perf_counter()
    o = v.validate(planfile(name, MODES[mode]), steps=bw.STEPS, grad_lifetime=bw.CASES[name][4])
    res = o.to_json()
    rows = [r for r in res["rows"] if r["judged"] and r["unit"] == "bytes"]
    worst = min(rows, key=lambda r: r["ratio"] if r["ratio"] is not None else 9.0)
    ss = next((r for r in res["rows"] if r["phase"] == "step start"), {})
    doc = {"case": name, "mode": mode, "wall_s": time.perf_counter() - t0, "allocator": res["allocator"],
           "ok": res["ok"], "marks": marks,
           "step_start": {"predicted": ss.get("predicted"), "measured": ss.get("measured")},
           "worst_row": {k: worst[k] for k in ("phase", "what", "ratio")},
           "rows": [{k: r[k] for k in ("phase", "what", "predicted", "measured", "ratio", "ok")} for r in rows],
           "peak": {"predicted": res["predicted_peak_bytes"], "measured": res["measured_peak_bytes"],
                    "reserved": res["measured_peak_reserved_bytes"]}}
    write_text_atomic(out / f"{name}-{mode}.json", json.dumps(doc, indent=1, default=str) + "\n")
    return doc


def summary(results: list[dict]) -> str:
    lines = ["| case | mode | step start pred − meas MiB | allocated − requested at step start MiB "
             "| max over phase starts MiB | worst row (ratio) | ok |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "marks" not in r:
            lines.append(f"| {r['case']} | {r['mode']} | {r.get('status')} | | | | |")
            continue
        ss, m = r["step_start"], r["marks"]
        gap = [(x["allocated"] - x["requested"]) / MiB for x in m.values()]
        st = m.get("step start", {})
        w = r["worst_row"]
        d = (ss["predicted"] - ss["measured"]) / MiB if ss.get("measured") is not None else float("nan")
        lines.append(f"| {r['case']} | {r['mode']} | {d:+.2f} | "
                     f"{(st.get('allocated', 0) - st.get('requested', 0)) / MiB:.2f} | {max(gap):.2f} | "
                     f"{w['phase']} {w['what']} ({w['ratio']:.4f}) | {r['ok']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/allocator_modes"))
    ap.add_argument("--case", action="append", choices=sorted(bw.CASES))
    ap.add_argument("--child", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--budget-s", type=float, default=BUDGET_S)
    ap.add_argument("--dry-run", action="store_true", help="Build every case's plan in both modes; run nothing.")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child[0], args.child[1], out)
        return 0
    names = args.case or list(bw.CASES)
    if args.dry_run:
        for n in names:
            for mode, on in MODES.items():
                print(f"{n} {mode}: expandable_segments {planfile(n, on).cluster.memory.expandable_segments}")
        return 0
    t0, results = time.perf_counter(), []
    for n in names:
        for mode in MODES:
            if time.perf_counter() - t0 > args.budget_s:
                results.append({"case": n, "mode": mode, "status": "skipped (time budget)"})
                continue
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", n, mode, "--out", str(out)]
            status, _ = run_child(cmd, CHILD_TIMEOUT_S)
            f = out / f"{n}-{mode}.json"
            results.append(json.loads(f.read_text()) if status == "ok" and f.exists()
                           else {"case": n, "mode": mode, "status": status})
            print(f"{n} {mode}: {status} ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_text_atomic(out / "allocator_modes.json", json.dumps({"cases": results}, indent=1, default=str) + "\n")
    md = summary(results)
    write_text_atomic(out / "allocator_modes.md", "# Validation cases under both allocator modes, each in a fresh "
                      "process\n\nCommand: `python3 bench/allocator_modes.py --out $OUT`\n\n" + md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
