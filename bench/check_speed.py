"""Wall time of ``planner check`` as a whole process (issue target: ≤ 0.5 s on a 2-core machine).

Usage: ``python3 bench/check_speed.py [--runs 5] [--out bench/results]``. Prints the median and
writes ``check_speed.json`` with every run, the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import date
from pathlib import Path

from _process import planner_argv, timed_runs

CASES = [
    ["gpt-oss-20b", "--gpus", "8", "--seq-len", "128k"],
    ["moe-667b", "--gpus", "64", "--seq-len", "1m"],
]
TARGET_S = 0.5
"""The budget for one ``planner check`` process."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    results = []
    for case in CASES:
        times = [wall for wall, _ in timed_runs(planner_argv("check", *case, "--json"), args.runs)]
        med = statistics.median(times)
        results.append({"command": " ".join(["planner", "check", *case, "--json"]), "runs_s": times,
                        "median_s": med, "within_target": med <= TARGET_S})
        print(f"{' '.join(case):45s} median {med:.3f} s over {args.runs} runs (target {TARGET_S} s)")
    doc = {"bench": "check_speed", "date": date.today().isoformat(), "machine": platform.platform(),
           "cpus": os.cpu_count(), "python": platform.python_version(),
           "command": " ".join([sys.executable, *sys.argv]), "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check_speed.json").write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
