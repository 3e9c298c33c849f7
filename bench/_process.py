"""Child processes of the benches: whole-process timing of ``planner`` commands, and one case per
fresh process with a time limit (``run_child``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time


def planner_argv(*args: str) -> list[str]:
    """The installed ``planner`` script (or ``python -m planner.cli``) with ``args``."""
    exe = shutil.which("planner")
    return [*([exe] if exe else [sys.executable, "-m", "planner.cli"]), *args]


def timed_runs(argv: list[str], runs: int) -> list[tuple[float, str]]:
    """``(wall seconds, stdout)`` of ``runs`` runs after one untimed run that warms the page cache.

    Raises:
        AssertionError: a run exits with anything but 0 (fits) or 1 (does not fit).
    """
    out = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        assert res.returncode in (0, 1), res.stderr
        if i:
            out.append((wall, res.stdout))
    return out


def run_child(argv: list[str], timeout_s: float) -> tuple[str, subprocess.CompletedProcess | None]:
    """Run ``argv`` with a time limit: ``("ok", process)`` on exit 0, else a one-line status (the
    exit code and the tail of stderr, or the time-out) and the process (``None`` on a time-out)."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"error: timed out after {timeout_s:g} s", None
    return ("ok" if p.returncode == 0 else f"error rc={p.returncode}: {' '.join(p.stderr.split()[-40:])}"), p
