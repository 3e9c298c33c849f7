"""One step synchronised at every phase boundary: the seconds of each phase window (DESIGN §3.1).

``planner validate`` runs it once after the compared steps of a real run, so that the whole-step
time it judges comes with where the time went (``forward[r]``, ``head``, ``backward[r]``,
``optimizer``; ``embedding`` is the window before the first region). Synchronising drains the GPU
at each boundary, so these windows add up to somewhat more than an unsynchronised step; they are
reported, not judged.
"""

from __future__ import annotations

import time

from planner.timing.step import PHASES

OTHER = PHASES[-1]
"""The kind of every window that is no region's, the head's or the optimizer's (``embedding``)."""
GROUPS = PHASES[:-1]
"""Phase kinds the report sums the windows into, as the time model books them (other labels:
``OTHER``)."""


def phase_seconds(step, tokens, targets, sync) -> dict[str, float]:
    """Run ``step.step(tokens, targets)`` once with ``sync()`` at every ``on_phase`` boundary;
    returns ``{phase label: seconds}`` in the step's order. ``step.on_phase`` is restored after."""
    marks: list = []
    label = ["embedding"]

    def on_phase(name: str, r: int | None = None) -> None:
        sync()
        marks.append((label[0], time.perf_counter()))
        label[0] = f"{name}[{r}]" if r is not None else name

    prev = step.on_phase
    step.on_phase = on_phase
    try:
        sync()
        t = time.perf_counter()
        step.step(tokens, targets)
        sync()
        marks.append((label[0], time.perf_counter()))
    finally:
        step.on_phase = prev
    out: dict[str, float] = {}
    for lab, t1 in marks:
        out[lab] = out.get(lab, 0.0) + t1 - t
        t = t1
    return out


def grouped(phase_s: dict[str, float]) -> dict[str, float]:
    """``phase_s`` summed by kind (``GROUPS``; the rest under ``other``), the kinds in that order."""
    out = {g: 0.0 for g in PHASES}
    for lab, s in phase_s.items():
        kind = lab.split("[", 1)[0]
        out[kind if kind in GROUPS else OTHER] += s
    return {k: v for k, v in out.items() if v or k in GROUPS}
