"""The FSDP2 baseline's host floor: a phase cannot end before the host has issued it (DESIGN §4).

A short baseline step is host-bound: Python, autograd, FSDP2's pre/post-forward and backward
hooks, the per-expert loops of ``GroupedMLP`` and the synchronous host→device index copies of the
dispatch (``torch.as_tensor(...).to(device)`` waits for the GPU queue to drain) leave the GPU idle.
Per phase (a layer's forward, its backward with the recompute, the head, the optimizer, the
embedding before the first layer):

    phase = max(GPU seconds booked for it, host seconds)
    host  = h_x                                           (measured outside the expert loops)
          + n_b · s_fwd   [forward; backward again when ac ≠ none: the recompute reruns the loop]
          + n_b · s_bwd   [backward]

``h_x`` from the profile's ``baseline_host`` curve (``calibration.step_host``: the runtime's step
at tiny widths, every count kept, so its wall time is the host's), ``s_fwd``/``s_bwd`` the
measured host seconds per block of ``GroupedMLP``'s loops (``dispatch_kernels.host_loops``, what the
dispatch time model already reads), ``n_b = E/ep`` blocks (every local expert receives rows:
assumed, listed). The GPU seconds already hold the dispatch's own exposed host time
(``dispatch_kernels``: a dispatch phase is ``max(GPU, host)``), so the floor adds only what the
host spends beyond them. Without the curve no floor is applied (listed).
"""

from __future__ import annotations

import math

import numpy as np

from planner.timing import kernel_rates as KR
from planner.timing.lookups import Lookups

RECOMPUTES_LOOP = {"full": 1.0, "selective": 1.0, "none": 0.0}
"""Forward loops the backward reruns per layer: full and selective AC rerun the layer's forward
(selective caches op outputs, but the Python loop runs again); ``none`` reruns nothing."""


def row(lk: Lookups, model, ac: str):
    """The ``baseline_host`` row of ``(model, ac)``: exact, else the nearest structure (same ``ac``,
    then the same attention kind, then the nearest expert count and top-k in log), listed; None
    (listed) without the curve."""
    cv = getattr(lk.curves, "baseline_host", None)
    if cv is None or not cv.rows:
        lk.assume("FSDP2 baseline host time not measured (no baseline_host curve): phases at their GPU "
                  "seconds only, no host floor (short steps are predicted short)")
        return None
    for r in cv.rows:
        if r.model == model.name and r.ac == ac:
            lk.assume("FSDP2 baseline phases take max(GPU, host) seconds: host outside the expert loops measured "
                      f"(calibration.step_host, {model.name}, ac={ac}) + the loops' measured seconds per block, "
                      "every local expert with rows")
            return r

    def dist(r):
        E, k = max(model.num_experts, 1), max(model.top_k or 1, 1)
        return (r.ac != ac, r.attention != model.attention,
                abs(math.log(max(r.num_experts, 1) / E)) + abs(math.log(max(r.top_k, 1) / k)))
    best = min(cv.rows, key=dist)
    lk.assume(f"FSDP2 baseline host time of {model.name} (ac={ac}) not measured: the nearest measured structure "
              f"({best.model}, ac={best.ac}) used; phases take max(GPU, host) seconds")
    return best


def _kind(r, table: dict, kind: str) -> float:
    if kind in table:
        return float(table[kind])
    return float(np.mean(list(table.values()))) if table else 0.0


def layer_floors(lk: Lookups, r, kind: str, ac: str, blocks) -> tuple:
    """(forward, backward) host seconds of one layer of ``kind`` (``moe``/``dense``) with ``blocks``
    expert blocks (module docstring)."""
    f, b = _kind(r, r.layer_fwd_s, kind), _kind(r, r.layer_bwd_s, kind)
    if kind != "moe":
        return f, b
    n = np.asarray(blocks, dtype=float)
    lf = KR.host_s(lk, 0.0, {"grouped_fwd": n})
    lb = KR.host_s(lk, 0.0, {"grouped_fwd": RECOMPUTES_LOOP[ac] * n, "grouped_bwd": n})
    return f + lf, b + lb


def exposed(host, gpu_s):
    """Host seconds beyond a phase's booked GPU seconds."""
    return np.maximum(0.0, np.asarray(host, dtype=float) - np.asarray(gpu_s, dtype=float))
