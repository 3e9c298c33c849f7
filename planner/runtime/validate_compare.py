"""Predicted against measured, phase by phase, for ``planner validate`` and the whole-step trace.

Rows:

- one per phase: the phase's peak allocated bytes against the budget's phase total (judged);
- ``persistent``: the bytes allocated when the step begins (weights, kept gradients, device
  optimizer state, the kernel workspaces the allocator keeps from the step before, and the input
  batch where the budget counts it) against the ``persistent`` live set in ``forward[1]`` plus the
  workspace every phase holds and the input-batch term (judged);
- ``optimizer_step``: the optimizer phase's peak above its start against the ``optimizer_step``
  live set (judged);
- the step time against the time model, judged only where communication is real (``W = 1``).

Tolerances (DESIGN §8): the formula may exceed the measurement by up to ``MEMORY_OVER`` and fall
below it by up to ``MEMORY_UNDER``; time within ``TIME_TOLERANCE``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.budget.fsdp2_boundaries import INPUT_BATCH
from planner.runtime.validate_plan import Prediction

MEMORY_UNDER = 0.01
"""The formula may be below the measurement by at most 1% of the measurement."""
MEMORY_OVER = 0.02
"""The formula may exceed the measurement by at most 2% of the measurement."""
TIME_TOLERANCE = 0.15
"""Predicted step time within ±15% of the measured one (only where communication is real)."""


@dataclass
class Row:
    """One comparison."""

    phase: str
    what: str
    predicted: float
    measured: float
    judged: bool
    ok: bool
    unit: str = "bytes"

    @property
    def ratio(self) -> float | None:
        return None if not self.measured else self.predicted / self.measured

    def asdict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        return d


def memory_ok(predicted: int, measured: int, under: float = MEMORY_UNDER, over: float = MEMORY_OVER) -> bool:
    """``measured·(1 − under) ≤ predicted ≤ measured·(1 + over)``."""
    return measured * (1 - under) <= predicted <= measured * (1 + over)


def time_ok(predicted: float | None, measured: float | None) -> bool:
    if predicted is None or measured is None or measured <= 0:
        return False
    return abs(predicted - measured) <= TIME_TOLERANCE * measured


def compare(pred: Prediction, samples: dict, step_start_bytes: int, *, step_s: float | None = None,
            judge_time: bool = False, under: float = MEMORY_UNDER, over: float = MEMORY_OVER,
            exclude: tuple[str, ...] = ()) -> list[Row]:
    """All rows for one recorded step (``samples``: label → ``PhaseSample``); ``exclude``: live sets
    the measurement cannot see (a fake-tensor trace: ``workspace``)."""
    rows: list[Row] = []
    for label in pred.labels:
        p = pred.phase_bytes(label, exclude)
        s = samples.get(label)
        if s is None:
            rows.append(Row(label, "phase total (not recorded)", p, 0, True, False))
            continue
        rows.append(Row(label, "phase total", p, s.peak_bytes, True, memory_ok(p, s.peak_bytes, under, over)))
    first = pred.labels[0]
    p = pred.live_set_bytes(first, "persistent") + pred.term_bytes(first, (INPUT_BATCH,)) + (
        0 if "workspace" in exclude else pred.step_start_workspace_bytes())
    rows.append(Row("step start", "persistent", p, step_start_bytes, True,
                    memory_ok(p, step_start_bytes, under, over)))
    s = samples.get("optimizer")
    if s is not None:
        p = pred.live_set_bytes("optimizer", "optimizer_step")
        got = s.peak_bytes - s.start_bytes
        ok = memory_ok(p, got, under, over) if got > 0 or p > 0 else True
        rows.append(Row("optimizer", "optimizer_step (peak above start)", p, got, True, ok))
    extra = [lbl for lbl in samples if lbl not in pred.labels]
    for lbl in extra:
        rows.append(Row(lbl, "phase the planner does not know", 0, samples[lbl].peak_bytes, True, False))
    if step_s is not None or judge_time:
        rows.append(Row("step", "time (s)", pred.step_s or 0.0, step_s or 0.0, judge_time,
                        time_ok(pred.step_s, step_s) if judge_time else True, unit="s"))
    return rows


def verdict(rows: list[Row]) -> bool:
    """Every judged row within tolerance."""
    return all(r.ok for r in rows if r.judged)


def confirmed_terms(pred: Prediction, rows: list[Row], *, under: float = MEMORY_UNDER,
                    exclude: tuple[str, ...] = (), only: set[str] | None = None) -> set[tuple[str, str]]:
    """``(live_set, name)`` of the terms a measurement confirms: a term resident in a phase whose
    total is within tolerance (``row.ok``), and without which that total would fall more than
    ``under`` below the measurement. ``exclude``: live sets the measurement cannot see; ``only``:
    the phases to read (``None``: every phase)."""
    ev, out = pred.evaluation, set()
    for r in rows:
        if not (r.judged and r.ok and r.measured and r.what == "phase total"):
            continue
        if only is not None and r.phase not in only:
            continue
        i = pred.labels.index(r.phase)
        for k, t in enumerate(ev.terms):
            b = int(ev.term_bytes[k, i])
            if b > 0 and t.live_set not in exclude and r.predicted - b < (1 - under) * r.measured:
                out.add((t.live_set, t.name))
    return out
