"""``python -m calibration --out FILE [--quick] [--smoke] [--no-progress]``: calibrate this machine.

Exit codes: 0 written; 1 written but a section failed (see the summary); 2 invalid measurements or
arguments (nothing written).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    # Before torch starts CUDA: the memory constants are measured with expandable segments.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    argv = list(sys.argv[1:] if argv is None else argv)
    class _Parser(argparse.ArgumentParser):
        def error(self, message):   # one line, exit 2 (the CLI contract), not argparse's usage block
            print(f"error: {message}; fix: see python3 -m calibration --help", file=sys.stderr)
            raise SystemExit(2)

    ap = _Parser(prog="python -m calibration", description="Calibrate this machine.")
    ap.add_argument("--out", required=True, help="cluster profile YAML to write (a .md summary goes beside it)")
    ap.add_argument("--quick", action="store_true", help="coarse grid; without CUDA, the small CPU profile")
    ap.add_argument("--smoke", action="store_true", help="every section at tiny shapes (code-path check)")
    ap.add_argument("--name", help="profile name (default: the file's stem)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--sections", help="comma-separated subset of sections (then merge the partial profile)")
    ap.add_argument("--attention-budget-s", type=float,
                    help="wall budget of the long-context attention section (default 240 s; 60 s with --quick)")
    args = ap.parse_args(argv)

    from calibration.io import command_line
    from calibration.runner import LAST_RUN, preflight, request_from_flags, run
    from planner.errors import PlanError

    command = command_line("python3 -m calibration", argv)
    only, budgets = request_from_flags(args.sections, args.attention_budget_s)
    try:
        preflight(quick=args.quick, smoke=args.smoke, only=only, budgets=budgets)
        spec = run(args.out, quick=args.quick, progress=not args.no_progress, command=command,
                   smoke=args.smoke, name=args.name, only=only, budgets=budgets)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted (the profile, if one was there, is unchanged)", file=sys.stderr)
        return 130
    st = LAST_RUN[0]
    print(f"wrote {args.out} ({spec.topology.gpu_name}) in {st.timings.get('total', 0):.1f} s; "
          f"sections: " + ", ".join(f"{k} {v:.1f}s" for k, v in st.timings.items() if k != "total"))
    if st.skipped:
        print(f"skipped {len(st.skipped)}, listed in the summary beside the profile")
    for msg in st.failed:
        print(f"FAILED: {msg}", file=sys.stderr)
    return 1 if st.failed else 0


if __name__ == "__main__":
    sys.exit(main())
