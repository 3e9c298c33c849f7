"""The FSDP2 baseline's host seconds outside the expert loops, measured on the runtime (DESIGN §4).

A short baseline step is launch-bound: Python, autograd, FSDP2's pre/post-forward and backward
hooks, the per-expert loops of ``GroupedMLP`` and the optimizer leave the GPU idle. Two parts:

- **expert loops**: the dispatch model (``planner.timing.dispatch_kernels``) already paces each
  block at the slower of its host launches and its GPU kernels, in the runtime's order; a loop
  whose kernels are shorter than their launches is booked at its host seconds there. Nothing of
  the loops is added here (``loop_blocks`` / ``loop_launches`` count them for the calibration's
  launch check only);
- **outside the loops** (the attention block, norms, router, the dispatch's planning and its
  synchronising copies, FSDP2's hooks of the layer's unit; the head; ``optimizer.step`` +
  ``zero_grad``; the embedding): the seconds ``calibration.step_host`` measures per phase at tiny
  widths, and the launches it counts there (aten calls that launch a kernel), which give the host
  seconds per launch (listed where a row predates the count).

**These add to the GPU seconds** (``baseline.py`` books ``segment = GPU + host outside the loops``):
the segments are cut by synchronising copies (the dispatch's route counts go to the host with
``.cpu()``, its index permutations come back from pageable memory), so the GPU is drained at every
MoE layer's dispatch, and this host work sits before the segment's GPU work (FSDP2's pre-forward and
pre-backward hooks, the dispatch's planning). Held against the nine FSDP2 W = 1 steps measured on
the same H200 instance as the calibration (``bench/results/validate/validate_fsdp2.json``,
``bench/results/calibration/step_host.md``): 0.90–1.14 of the measurement. Adding the loops' host
seconds per block as well (booking them beside the loops' GPU seconds) gave 1.08–1.46 there; a
per-segment ``max(GPU, host)`` 0.75–1.13.

Without the ``baseline_host`` curve no host time is booked (listed: short steps are predicted short).
"""

from __future__ import annotations

import math

import numpy as np

from planner.timing import kernel_rates as KR
from planner.timing.lookups import Lookups

RECOMPUTES_LOOP = {"full": 1.0, "selective": 1.0, "none": 0.0}
"""Forward loops the backward reruns per layer: full and selective AC rerun the layer's forward
(selective caches op outputs, but the Python loop runs again); ``none`` reruns nothing."""
GROUPED_BWD_CALL = 2
"""Launches per ``GroupedMLP.backward`` call beyond its blocks: the two stacked weight gradients'
``zeros_like`` (own experts; the baseline imports none)."""
PHASES = ("layer_fwd", "layer_bwd", "head", "optimizer", "embedding")
"""Keys of a row's counted launches outside the loops (``layer_*`` per layer kind)."""


def row(lk: Lookups, model, ac: str):
    """The ``baseline_host`` row of ``(model, ac)``: exact, else the nearest structure (same ``ac``,
    then the same attention kind, then the nearest expert count and top-k in log), listed; None
    (listed) without the curve."""
    cv = getattr(lk.curves, "baseline_host", None)
    if cv is None or not cv.rows:
        lk.assume("FSDP2 baseline host time not measured (no baseline_host curve): phases at their GPU "
                  "seconds only, no host time (short steps are predicted short)")
        return None
    for r in cv.rows:
        if r.model == model.name and r.ac == ac:
            lk.assume("FSDP2 baseline: each segment takes GPU seconds + the host seconds outside the expert loops "
                      "(they add up: the dispatch's synchronising copies drain the GPU every MoE layer), measured in "
                      f"the FSDP2 step (calibration.step_host, {model.name}, ac={ac}); the loops are paced by the "
                      "dispatch model; measured against steps of 4K-16K tokens on the calibrating instance")
            _counted(lk, r)
            return r

    def dist(r):
        E, k = max(model.num_experts, 1), max(model.top_k or 1, 1)
        return (r.ac != ac, r.attention != model.attention,
                abs(math.log(max(r.num_experts, 1) / E)) + abs(math.log(max(r.top_k, 1) / k)))
    best = min(cv.rows, key=dist)
    lk.assume(f"FSDP2 baseline host time of {model.name} (ac={ac}) not measured: the nearest measured structure "
              f"({best.model}, ac={best.ac}) used outside the expert loops; segments take GPU + host seconds")
    _counted(lk, best)
    return best


def _counted(lk: Lookups, r) -> None:
    if not r.launches:
        lk.assume(f"FSDP2 baseline host time outside the expert loops ({r.model}, ac={r.ac}): the phase seconds "
                  "as measured; launches per phase not counted by this profile's calibration.step_host "
                  "(re-run it to price them per launch)")


def _kind(table: dict, kind: str) -> float:
    if kind in table:
        return float(table[kind])
    return float(np.mean(list(table.values()))) if table else 0.0


def per_launch_s(r, phase: str, kind: str | None = None) -> float | None:
    """Host seconds per launch outside the loops in ``phase`` (``PHASES``; ``kind`` for a layer):
    the phase's measured seconds ÷ its counted launches; None where the row counted none."""
    n = (r.launches or {}).get(f"{phase}:{kind}" if kind else phase)
    if not n:
        return None
    return seconds(r, phase, kind) / n


def seconds(r, phase: str, kind: str | None = None) -> float:
    """Measured host seconds of ``phase`` outside the loops (a layer's of ``kind``: the other
    kind's mean when the row has none of it)."""
    if phase in ("layer_fwd", "layer_bwd"):
        return _kind(getattr(r, f"{phase}_s"), kind)
    return float(getattr(r, f"{phase}_s"))


def outside(r, phase: str, kind: str | None = None) -> float:
    """Host seconds outside the loops: the phase's measured seconds (its counted launches × the
    seconds per launch measured there, ``per_launch_s``)."""
    return seconds(r, phase, kind)


def loop_blocks(kind: str, ac: str, local_experts) -> dict:
    """Expert-loop blocks of one layer (``moe``: one per local expert slot and pass; ``dense``: none):
    ``{"fwd", "recompute", "bwd"}``."""
    n = np.asarray(local_experts if kind == "moe" else 0, dtype=float)
    return {"fwd": n, "recompute": n * RECOMPUTES_LOOP[ac], "bwd": n}


def loop_launches(kind: str, ac: str, local_experts) -> dict:
    """Kernel launches inside one layer's ``GroupedMLP`` calls, ``{"fwd", "bwd"}`` (bwd: the
    recompute's loop, the backward's blocks and its ``GROUPED_BWD_CALL``)."""
    b = loop_blocks(kind, ac, local_experts)
    f, bw = KR.LOOP_LAUNCH["grouped_fwd"], KR.LOOP_LAUNCH["grouped_bwd"]
    call = np.where(b["bwd"] > 0, GROUPED_BWD_CALL, 0)
    return {"fwd": b["fwd"] * f, "bwd": b["recompute"] * f + b["bwd"] * bw + call}


def layer(r, kind: str) -> tuple:
    """(forward, backward with its recompute) host seconds of one layer of ``kind`` outside its
    expert loops (the dispatch model paces the loops: module docstring)."""
    return outside(r, "layer_fwd", kind), outside(r, "layer_bwd", kind)