"""Speed of ``planner search`` as a whole process (issue target: moe-667b on 64 GPUs at 1M in ≤ 2 s
wall on a 2-core machine) and the configurations it evaluates per second.

Usage: ``python3 bench/search_speed.py [--runs 5] [--out bench/results]`` → ``search_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from datetime import date
from pathlib import Path

from _process import planner_argv, timed_runs

CASE = ["moe-667b", "--gpus", "64", "--seq-len", "1m"]
TARGET_S = 2.0
"""The budget for the whole search process."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    runs = timed_runs(planner_argv("search", *CASE, "--json", "--no-progress"), args.runs)
    walls, docs = [w for w, _ in runs], [json.loads(o) for _, o in runs]
    n = docs[0]["tally"]["evaluated"] + docs[0]["baseline_tally"]["evaluated"]
    med = statistics.median(walls)
    inner = statistics.median(d["elapsed_s"] for d in docs)
    out = {"bench": "search_speed", "command": "planner search " + " ".join(CASE), "date": date.today().isoformat(),
           "machine": platform.platform(), "cpus": os.cpu_count(), "runs_wall_s": walls, "median_wall_s": med,
           "median_search_s": inner, "candidates": n, "candidates_per_s": n / inner, "within_target": med <= TARGET_S}
    print(f"planner search {' '.join(CASE)}: median {med:.2f} s wall over {args.runs} runs (target {TARGET_S} s); "
          f"{n:,} candidates in {inner:.2f} s of search = {n / inner:,.0f} configurations/s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "search_speed.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
