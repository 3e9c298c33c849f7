"""Whole-process timing of ``planner`` commands for the speed benches."""

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
