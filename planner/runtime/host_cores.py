"""How fast the host cores are while a step runs: a launch-bound step's time follows the core.

The virtual machines that carry one H200 here do not give every vCPU the same speed: a fixed
pure-Python loop (``probe_s``) reads 2.4–3.5 ms or 4.5–6.6 ms (111 of 120 probes), one core 4.9 ms
in one round and 2.4 ms in the next: a core's speed changes from one moment to the next
(``bench/results/step_spread``); the guest sees at most 0.05 s of stolen time a step and the
garbage collector takes about 1 ms. A step that waits on its host launches (the short FSDP2 steps, Qwen3's expert
loops) follows the speed of the core its thread is on, which is most of what separates one run of
the same step from the next.

``planner validate`` therefore times every core before its steps (``survey``) and reports the spread
beside the step time. It does not pin: pinned to the fastest core, the same steps ran no steadier
(the core's speed changed during the run), and host calibrations pinned there priced five of 18 steps
0.78–0.85 of their time (``bench/step_spread.py``, README: the time model). ``pinned`` is that
comparison's pin: the calling thread on the fastest core for the block, the intra-op pool started
first so its workers keep every core.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

PROBE_LOOP = 200_000
"""Iterations of the fixed pure-Python loop that times a core (~3 ms on a fast H200-host core)."""
PROBE_REPEATS = 5
"""Probes per core; the median is kept."""
POOL_WARM_ELEMENTS = 1 << 20
"""Elements of the CPU op that starts the intra-op thread pool before the calling thread is pinned
(enough grains for every thread of the pool)."""


@dataclass
class HostCores:
    """Each core's probe seconds and the core the calling thread was pinned to (``None``: not pinned)."""

    probe_s: dict[int, float] = field(default_factory=dict)
    core: int | None = None
    reason: str = ""
    """Why nothing was pinned (one core, or the platform cannot pin)."""

    @property
    def spread(self) -> float | None:
        """Slowest / fastest core's probe; None unless every probe is a positive finite number."""
        v = list(self.probe_s.values())
        if not v or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in v):
            return None
        return max(v) / min(v)

    def to_json(self) -> dict:
        d = asdict(self)
        d["probe_s"] = {str(k): v for k, v in self.probe_s.items()}
        d["spread"] = self.spread
        return d

    def line(self) -> str:
        """One line for a report."""
        v = self.probe_s
        if not v:
            return f"host cores: not timed ({self.reason})"
        sp = self.spread
        if sp is None:
            return f"host cores: {len(v)}, probes not usable ({sorted(v.values())!r})"
        text = (f"{len(v)}, probe {min(v.values()) * 1e3:.2f}–{max(v.values()) * 1e3:.2f} ms ({sp:.2f}×)")
        if self.core is not None and self.core in v:
            return f"host core: the calling thread pinned to core {self.core} ({v[self.core] * 1e3:.2f} ms) of {text}"
        return f"host cores: {text}; a launch-bound step's time follows the core its thread runs on"


def probe_s() -> float:
    """Seconds of the fixed pure-Python loop on the calling thread's core, now."""
    t0 = time.perf_counter()
    sum(range(PROBE_LOOP))
    return time.perf_counter() - t0


def time_cores(cores=None, repeats: int = PROBE_REPEATS) -> dict[int, float]:
    """Median probe seconds of each core in ``cores`` (default: every core this thread may use),
    the calling thread moved onto each in turn and its affinity restored after.

    Raises:
        ValueError: ``repeats`` not an integer >= 1, or ``cores`` empty, not integers, or naming a
        core this thread may not use.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats = {repeats!r}: must be an integer >= 1 (give PROBE_REPEATS, {PROBE_REPEATS})")
    before = os.sched_getaffinity(0)
    if cores is None:
        cores = before
    elif isinstance(cores, (str, bytes)) or not hasattr(cores, "__iter__"):
        raise ValueError(f"cores = {cores!r}: must be a collection of core numbers (e.g. [0, 1]), or None for all")
    cores = list(dict.fromkeys(cores))
    if not cores:
        raise ValueError("cores is empty: give at least one core this process may use")
    bad = [c for c in cores if isinstance(c, bool) or not isinstance(c, int) or c not in before]
    if bad:
        raise ValueError(f"cores = {bad!r}: not cores this thread may use (os.sched_getaffinity(0) = "
                         f"{sorted(before)}); give some of those")
    out = {}
    try:
        for c in sorted(cores):
            os.sched_setaffinity(0, {c})
            out[c] = statistics.median(probe_s() for _ in range(repeats))
    finally:
        os.sched_setaffinity(0, before)
    return out


def survey() -> HostCores:
    """Every core's probe, nothing pinned (what ``planner validate`` records before its steps)."""
    if not hasattr(os, "sched_setaffinity"):
        return HostCores(reason="this platform cannot move a thread between cores")
    return HostCores(time_cores())


def _start_pool(torch) -> None:
    if torch is not None:
        torch.ones(POOL_WARM_ELEMENTS).add_(1.0)


@contextmanager
def pinned(torch=None):
    """Pin the calling thread to the fastest core for the block; yields its ``HostCores``. ``torch``:
    start its intra-op pool first (module docstring); a thread started inside the block (a pool
    started there too) inherits the pin and keeps it after the block."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        yield HostCores(reason="this platform cannot set a thread's cores")
        return
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        yield HostCores(time_cores(before), reason="one core")
        return
    _start_pool(torch)
    speeds = time_cores(before)
    core = min(speeds, key=speeds.get)
    os.sched_setaffinity(0, {core})
    try:
        yield HostCores(speeds, core)
    finally:
        os.sched_setaffinity(0, before)
