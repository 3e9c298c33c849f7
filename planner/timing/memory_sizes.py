"""How a memory-bound dispatch kernel's rate changes with the bytes one call moves (DESIGN §4).

Legend: ``c`` a kernel class (``DISPATCH_KERNEL_CLASSES``), ``v`` the bytes one call of it moves
(the time model's count), ``v_0`` the bytes its ``dispatch_kernels`` row was timed at, ``ρ_c(v)``
the class's rate relative to a fused GPU AdamW at ``v`` (the profile's ``memory_sizes`` points,
every size timed in one process), piecewise-linear in ``log v`` between them, the nearest outside.

    rate_c(v) = rate_c(v_0) · ρ_c(v) / ρ_c(v_0)

The ``dispatch_kernels`` rows (one per width) are timed at ``R = 131072`` routes; a bench rank of
shape A routes 524288, where the bf16 ``index_add_`` (the combine's atomic adds) runs at 0.68 of its
rate at 131072 (H200, ``bench/results/calibration/memory_sizes.md``) and ``cat`` at 0.46. A
class without two points keeps its one rate (factor 1). Without the curve: factor 1 (listed).
"""

from __future__ import annotations

import numpy as np

from planner.timing.lookups import Lookups


def _points(lk: Lookups) -> tuple[dict, str]:
    """``({class: (log bytes, ρ)}, the listed rule)`` of the profile's curve, built once per lookup
    set (``memory_s`` runs on every phase of every candidate)."""
    cv = getattr(lk.curves, "memory_sizes", None)
    hit = getattr(lk, "_memory_size_points", None)
    if hit is not None and hit[0] is cv:
        return hit[1], hit[2]
    if cv is None:
        out, rule = {}, ("dispatch memory-bound kernels at the rate of the one size their class was timed at "
                         "(no memory_sizes curve)")
    else:
        by: dict = {}
        for p in cv.points:
            by.setdefault(p.cls, []).append((p.model_bytes, p.vs_reference))
        out = {}
        for c, pts in by.items():
            pts.sort()
            if len(pts) >= 2:
                out[c] = (np.log([v for v, _ in pts]), np.array([r for _, r in pts]))
        sizes = sorted({(p.N, p.H) for p in cv.points})
        rule = ("dispatch memory-bound kernels: each class's rate scaled by its measured rate at the bytes of the "
                f"call against the bytes it was timed at (memory_sizes, N×H = {sizes}; piecewise-linear in log "
                "bytes, the nearest measured size outside)")
    lk._memory_size_points = (cv, out, rule)
    return out, rule


def factor(lk: Lookups, cls: str, nbytes, timed_bytes: float | None):
    """``ρ_c(v) / ρ_c(v_0)`` for the bytes ``nbytes`` (array) of one call of class ``cls``; 1 where the
    class has fewer than two sized points or ``timed_bytes`` is unknown."""
    pts, _ = _points(lk)
    if cls not in pts or not timed_bytes:
        return 1.0
    x, y = pts[cls]
    v = np.log(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
    return np.interp(v, x, y) / float(np.interp(np.log(timed_bytes), x, y))


def note(lk: Lookups) -> None:
    """List the rule (``Lookups.assume`` keeps each text once)."""
    lk.assume(_points(lk)[1])
