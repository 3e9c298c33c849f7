"""``planner validate``'s report: the predicted and measured rows as rich tables, and where the step's
time goes (the time model's components; a real run's synchronised phases)."""

from __future__ import annotations

import math

from planner.runtime.validate_compare import MEMORY_OVER, MEMORY_UNDER, TIME_TOLERANCE
from planner.units import GiB


def _gib(x: float) -> str:
    return f"{x / GiB:.3f}"


def render(o, console) -> None:
    """The validation ``o`` (a ``validate.Outcome``) as rich tables."""
    from rich.table import Table

    pred, meas = o.prediction, o.measurement
    W = pred.ctx.world_size
    how = ("real: every rank runs, communication is real" if meas.mode == "real" else
           f"emulated: one rank of W = {W} under the fake process group (real memory, no-op communication; "
           "time not judged)")
    console.print(f"[bold]planner validate[/] on {meas.device}: {how}")
    console.print(f"rank {o.rank} ({o.rank_reason}); gradients {pred.ctx.grad_lifetime}")
    if meas.allocator:
        console.print(meas.allocator)
    if meas.mode == "real" and o.other_gpu:
        console.print(f"[yellow]{o.other_gpu}[/]")
    if meas.host_cores is not None:
        console.print(meas.host_cores.line())
    for c in o.changes:
        console.print(f"  truncated: {c}")
    t = Table(title="predicted vs measured (GiB; allocated, reserved shown beside)")
    for col in ("phase", "what", "predicted", "measured", "reserved", "ratio", "ok"):
        t.add_column(col, justify="right" if col in ("predicted", "measured", "reserved", "ratio") else "left")
    for r in o.rows:
        s = meas.samples.get(r.phase)
        res = _gib(s.peak_reserved_bytes) if (s is not None and s.peak_reserved_bytes and r.what == "phase total") else ""
        fmt = (lambda v: f"{v:.3f}") if r.unit == "s" else _gib
        ratio = f"{r.ratio:.4f}" if r.ratio is not None else "-"
        ok = "[green]ok[/]" if r.ok else "[red]MISS[/]"
        if not r.judged:
            ok = "not judged"
        t.add_row(r.phase, r.what, fmt(r.predicted), fmt(r.measured), res, ratio, ok)
    console.print(t)
    for line in time_lines(pred, meas):
        console.print(line)
    console.print(f"tolerance: formula within −{MEMORY_UNDER:.0%} / +{MEMORY_OVER:.0%} of the measurement"
                  f" per phase; time ±{TIME_TOLERANCE:.0%} where communication is real, on the cluster's GPU")
    console.print("[green]every phase within tolerance[/]" if o.ok else "[red]a phase is outside the tolerance[/]")


def time_lines(pred, meas) -> list[str]:
    """Where the step's time goes: the model's components (``pred``, a ``validate_plan.Prediction``),
    and a real run's synchronised phases (``meas``, a ``validate.Measurement``)."""
    from planner.runtime.phase_times import grouped

    out = []
    comps = {k: v for k, v in (pred.step_components or {}).items()
             if isinstance(v, (int, float)) and math.isfinite(v) and v > 0}
    if pred.step_s is None:
        if pred.step_components is not None:
            out.append("predicted step: n/a (the time model gives no finite step time for this plan)")
    elif comps:
        parts = sorted(comps.items(), key=lambda kv: (-kv[1], kv[0]))
        out.append(f"predicted step {pred.step_s:.3f} s: "
                   + ", ".join(f"{k} {v:.3f} ({v / pred.step_s:.0%})" for k, v in parts))
    retries = getattr(meas, "alloc_retries", 0)
    if retries:
        out.append(f"the allocator freed its cache and retried {retries} allocation(s) during the steps "
                   "(near the card's capacity): the step time includes those frees")
    timed = list(getattr(meas, "step_times_s", None) or [])[1:]
    if len(timed) > 1 and meas.step_s is not None and all(math.isfinite(t) and t > 0 for t in timed):
        out.append(f"timed steps 2..{len(timed) + 1}: median {meas.step_s:.3f} s, {min(timed):.3f}–{max(timed):.3f} s "
                   f"(max/min {max(timed) / min(timed):.2f})")
    if meas.phase_s:
        g = grouped(meas.phase_s)
        out.append(f"measured, one step synchronised at each phase ({sum(g.values()):.3f} s): "
                   + ", ".join(f"{k} {v:.3f}" for k, v in g.items()))
    phases = getattr(pred, "step_phases", None)
    if pred.step_s is not None and phases:
        g = grouped(meas.phase_s) if meas.phase_s else {}
        kinds = [k for k, v in phases.items() if (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)
                 or g.get(k)]
        out.append("by phase, predicted" + (" / measured synchronised" if g else "") + " (s): " + ", ".join(
            f"{k} {phases.get(k, 0.0):.3f}" + (f" / {g.get(k, 0.0):.3f}" if g else "") for k in kinds))
    return out
