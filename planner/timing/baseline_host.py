"""The FSDP2 baseline's host floor: a segment cannot end before the host has issued it (DESIGN §4).

A short baseline step is host-bound: Python, autograd, FSDP2's pre/post-forward and backward
hooks, the per-expert loops of ``GroupedMLP`` and the synchronous host→device index copies of the
dispatch (``torch.as_tensor(...).to(device)`` waits for the GPU queue to drain) leave the GPU idle.
The copies split each layer's forward (and its recompute + backward) into two segments: the
dispatch operator, which the dispatch time model already books as ``max(GPU, host)``
(``dispatch_kernels``: the loops at their measured host seconds per block), and the rest of the
layer (attention block, norms, router, FSDP2's hooks), which runs ahead of the GPU only until the
next copy. So per layer, and for the head, the optimizer and the embedding before the first layer:

    segment = max(GPU seconds booked for it, h_x)
    exposed = max(0, h_x − (phase seconds − dispatch seconds))

``h_x``: host seconds outside the expert loops, from the profile's ``baseline_host`` curve
(``calibration.step_host``: the runtime's step at tiny widths, every count kept, so its wall time
is the host's). They include the dispatch operator's own calls outside the loops (``send_order``,
the slot layout, the index copies), which the dispatch model also prices at ``host_call_s`` per
launching call (a few dozen per pass: under a millisecond counted twice). ``RECOMPUTES_LOOP``
records how many forward loops a layer's backward reruns (the dispatch model's recompute, and what
``calibration.step_host`` checks against the runtime). Without the curve no floor is applied (listed).
"""

from __future__ import annotations

import math

import numpy as np

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
            lk.assume("FSDP2 baseline: each layer's segment before its dispatch, the head, the optimizer and the "
                      "embedding take max(GPU, host) seconds, the host seconds measured outside the expert loops "
                      f"(calibration.step_host, {model.name}, ac={ac}); the dispatch at the dispatch model's max(GPU, host)")
            return r

    def dist(r):
        E, k = max(model.num_experts, 1), max(model.top_k or 1, 1)
        return (r.ac != ac, r.attention != model.attention,
                abs(math.log(max(r.num_experts, 1) / E)) + abs(math.log(max(r.top_k, 1) / k)))
    best = min(cv.rows, key=dist)
    lk.assume(f"FSDP2 baseline host time of {model.name} (ac={ac}) not measured: the nearest measured structure "
              f"({best.model}, ac={best.ac}) used; segments take max(GPU, host) seconds")
    return best


def _kind(table: dict, kind: str) -> float:
    if kind in table:
        return float(table[kind])
    return float(np.mean(list(table.values()))) if table else 0.0


def outside_loops(r, kind: str) -> tuple:
    """(forward, backward with its recompute) host seconds of one layer of ``kind`` (``moe``/``dense``)
    outside the expert loops (the other kind's when the row has none of this kind: its mean)."""
    return _kind(r.layer_fwd_s, kind), _kind(r.layer_bwd_s, kind)


def exposed(host, gpu_s):
    """Host seconds beyond a phase's booked GPU seconds."""
    return np.maximum(0.0, np.asarray(host, dtype=float) - np.asarray(gpu_s, dtype=float))
