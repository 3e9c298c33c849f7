"""The wall budget of the sections whose cost grows with the machine's speed (long-context attention,
every dispatch width, SCO), and the one-shot timer they share.

- ``Clock(budget_s)``: a section's deadline; a point that would pass it is skipped and named in
  ``skipped`` (the profile then lacks it and the time model lists its rule under ``assumed``).
- ``timed(fn, dev, min_time_s)``: seconds per call of ``fn``.
"""

from __future__ import annotations

import contextlib
import math
import time

ONE_SHOT_S = 0.5
"""A point whose first call lasts at least this long is timed by that call alone (or the median of
``median_of`` such calls): the long-``S`` attention points take seconds to minutes each."""
WINDOWS = 3
"""Shorter points: the median of this many windows, each lasting at least ``min_time_s``."""


class Clock:
    """One section's wall budget, counted from its creation."""

    def __init__(self, budget_s: float, log=None):
        if not budget_s > 0:
            raise ValueError(f"budget_s {budget_s} must be positive")
        self.t0, self.budget = time.perf_counter(), float(budget_s)
        self.skipped: list[str] = []
        self._log = log

    @property
    def deadline(self) -> float:
        """Absolute ``time.perf_counter()`` value at which the budget ends."""
        return self.t0 + self.budget

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def fits(self, guess_s: float, margin: float = 1.15) -> bool:
        """Whether a point of about ``guess_s`` seconds (× ``margin``) ends before the deadline."""
        return time.perf_counter() + guess_s * margin <= self.deadline

    def skip(self, what: str) -> None:
        self.skipped.append(what)
        if self._log is not None:
            self._log(f"skip: {what}")

    @contextlib.contextmanager
    def point(self, label: str, dev):
        """Measure one point: an out-of-memory error skips it (named ``label``) instead of ending the
        section, and the CUDA cache is emptied after it either way. Yields a list that holds
        ``True`` once the point completed."""
        import torch

        done: list[bool] = []
        try:
            yield done
            done.append(True)
        except torch.OutOfMemoryError as err:
            self.skip(f"{label}: out of memory ({str(err).splitlines()[0]})")
        finally:
            if getattr(dev, "type", dev) == "cuda":
                torch.cuda.empty_cache()


def _sync(dev) -> None:
    import torch

    if getattr(dev, "type", dev) == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, min_time_s: float, median_of: int = 1) -> tuple[float, int]:
    """``(seconds per call, calls timed)``: one call, kept when ≥ ``ONE_SHOT_S`` (the median of
    ``median_of`` such calls); else the median of ``WINDOWS`` windows lasting ≥ ``min_time_s`` each."""
    if median_of < 1:
        raise ValueError(f"median_of {median_of} must be ≥ 1")
    _sync(dev)
    t = time.perf_counter()
    fn()
    _sync(dev)
    one = time.perf_counter() - t
    if one >= ONE_SHOT_S:
        vals = [one]
        for _ in range(median_of - 1):
            _sync(dev)
            t = time.perf_counter()
            fn()
            _sync(dev)
            vals.append(time.perf_counter() - t)
        vals.sort()
        return vals[len(vals) // 2], len(vals)
    reps = max(1, math.ceil(min_time_s / max(one, 1e-6)))
    out = []
    for _ in range(WINDOWS):
        _sync(dev)
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(dev)
        out.append((time.perf_counter() - t) / reps)
    return sorted(out)[WINDOWS // 2], WINDOWS * reps
