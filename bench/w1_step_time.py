"""The W = 1 whole steps of ``planner validate`` (committed H200 runs) against the **current** time
model, both stacks, with the predicted breakdown by component (issue 15: ±15%).

    python3 bench/w1_step_time.py            # CPU, ~1 min; reads bench/results/validate/*.json

``bench/validate_table.py`` prints the prediction recorded when each case ran; this script
re-predicts every W = 1 case from the plan the bench builds (``bench/validate.py`` /
``bench/validate_fsdp2.py``) with the tree's model and shipped profile, so a time-model or profile
change shows here first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

TOL = 0.15
"""Issue 15's whole-step tolerance at W = 1."""
RESULTS = HERE / "results" / "validate"


def _measured(fname: str, key) -> dict:
    doc = json.loads((RESULTS / fname).read_text())
    return {key(c): c["result"]["step_s"] for c in doc["cases"]
            if c.get("status") == "ran" and c["W"] == 1 and c["result"].get("step_s")}


def rows() -> list[dict]:
    import validate as composed_bench
    import validate_fsdp2 as fsdp2_bench

    from planner.timing.step import step_time

    out = []
    meas = _measured("validate_fsdp2.json", lambda c: c["name"])
    for name, model, W, S, knobs, lt, pf, pred, note in fsdp2_bench.planned():
        if W == 1 and pred is not None and name in meas:
            out.append(("fsdp2", f"{name} ({lt})", meas[name], step_time(pred.ctx, micro_steps_override=1)))
    meas = _measured("validate.json", lambda c: (c["model"], c["S"], c["lifetime"]))
    for model, W, S, layers, lt, pf, pred in composed_bench.cases():
        if W == 1 and (model, S, lt) in meas:
            out.append(("composed", f"{model} S={S} ({lt})", meas[(model, S, lt)],
                        step_time(pred.ctx, micro_steps_override=1)))
    res = []
    for stack, name, m, st in out:
        t = float(st.total_s)
        comp = {k: float(v) for k, v in st.components.items() if float(v) > 0}
        res.append(dict(stack=stack, case=name, measured_s=m, predicted_s=t, ratio=t / m, components=comp))
    return res


def main() -> int:
    rs = rows()
    print("| stack | case | measured s | predicted s | ratio | predicted components (ms) |")
    print("|---|---|---|---|---|---|")
    for r in rs:
        comp = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in sorted(r["components"].items(), key=lambda kv: -kv[1]))
        flag = "" if abs(r["ratio"] - 1) <= TOL else " **"
        print(f"| {r['stack']} | {r['case']} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | "
              f"{r['ratio']:.3f}{flag} | {comp} |")
    ok = sum(abs(r["ratio"] - 1) <= TOL for r in rs)
    print(f"\n{ok}/{len(rs)} within ±{TOL:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
