"""``planner search`` at 1M tokens on the paper's three models, both stacks: the README's table
(issue 15) regenerated from the current time model and profile.

    python3 bench/search_1m.py [--out bench/results]     # CPU, ~1 min

Per model (GPUs as the README's 1M claim: moe-120b on 16, moe-241b on 32, moe-667b on 64) the
fastest fitting composed plan and the fastest fitting FSDP2 plan (``result.top[0]``,
``result.baseline``): predicted step seconds, tokens/s/GPU, model TFLOP/s/GPU and the step's
components (``StepTime.components``: compute, attention, recompute, optimizer, copies, host,
communication) as shares of the step. A stack with no fitting plan is printed as such. Writes
``search_1m.json`` and ``search_1m.md`` under ``--out`` (atomically).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = (("moe-120b", 16), ("moe-241b", 32), ("moe-667b", 64))
SEQ_LEN = 1 << 20


def rows() -> list[dict]:
    from planner.api.search import search

    out = []
    for model, gpus in CASES:
        rep = search(model=model, gpus=gpus, seq_len=SEQ_LEN, top=1)
        for stack, c in (("composed", rep.result.top[0] if rep.result.top else None), ("fsdp2", rep.result.baseline)):
            row = dict(model=model, gpus=gpus, stack=stack, fits=c is not None)
            if c is not None:
                comp = {k: float(v) for k, v in c.components.items()}
                row.update(step_s=float(c.step_s), tokens_per_s_per_gpu=float(c.tokens_per_s_per_gpu),
                           tflops_per_gpu=float(c.tflops_per_gpu), components=comp,
                           shares={k: v / float(c.step_s) for k, v in comp.items()},
                           plan=c.plan.model_dump(mode="json"))
            else:
                cl = rep.closest.get(stack)
                row["why"] = cl.why() if cl is not None else "no legal plan"
            out.append(row)
    return out


def markdown(rs: list[dict]) -> str:
    lines = ["| model | GPUs | stack | step s | tokens/s/GPU | TFLOP/s/GPU | largest components (share of step) |",
             "|---|---|---|---|---|---|---|"]
    for r in rs:
        if not r["fits"]:
            lines.append(f"| {r['model']} | {r['gpus']} | {'FSDP2' if r['stack'] == 'fsdp2' else r['stack']} | "
                         f"no fitting plan | | | {r['why'][:90]} |")
            continue
        top = sorted(r["shares"].items(), key=lambda kv: -kv[1])[:3]
        comp = ", ".join(f"{k} {v:.0%}" for k, v in top if v >= 0.005)
        lines.append(f"| {r['model']} | {r['gpus']} | {'FSDP2' if r['stack'] == 'fsdp2' else r['stack']} | "
                     f"{r['step_s']:.0f} | {r['tokens_per_s_per_gpu']:.0f} | {r['tflops_per_gpu']:.0f} | {comp} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    from planner.schema.io import write_text_atomic

    rs = rows()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rs)
    write_text_atomic(out / "search_1m.json", json.dumps(rs, indent=1))
    write_text_atomic(out / "search_1m.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
