"""The FSDP2 baseline's host seconds, counted from what the step launches (DESIGN §4).

A short baseline step is launch-bound: Python, autograd, FSDP2's pre/post-forward and backward
hooks, the per-expert loops of ``GroupedMLP`` and the optimizer leave the GPU idle. The host's
seconds of each segment are counted as launches × host seconds per launch:

- **expert loops**: one block per local expert slot and pass (forward; the backward's recompute
  ``RECOMPUTES_LOOP[ac]``; backward), ``kernel_rates.LOOP_LAUNCH`` launches per block, each block at
  the dispatch bench's measured host seconds per block (``dispatch_kernels.host_loops`` at the
  layer's widths: the same loop the dispatch model prices, its GEMMs at the model's shapes); the
  row's in-step seconds per block (``loop_*_s_per_block``, tiny widths) where that curve is absent;
- **outside the loops** (the attention block, norms, router, the dispatch's own calls, FSDP2's
  hooks of the layer's unit; the head; ``optimizer.step`` + ``zero_grad``; the embedding): the
  launches ``calibration.step_host`` counts per phase (aten calls that launch a kernel, views and
  allocations left out) at the host seconds per launch it measures there
  (the phase's seconds ÷ its launches: FSDP2's hooks and the dispatch's planning are Python between
  the launches, so a launch outside the loops costs several times a bare ``torch.mm`` call).
  A row without counted launches still gives the phase's measured seconds (listed: not priced per launch).

**Host and GPU add up** (``baseline.py`` books ``segment = GPU seconds + host seconds``, not their
max). The step's segments are cut by synchronising copies: the dispatch's route counts go to the
host (``.cpu()``) and its index permutations come back from pageable memory
(``torch.as_tensor(...).to(device)``, which waits for the stream), so the GPU is drained at every
MoE layer's dispatch, and the host's work in a segment sits mostly before its GPU work (FSDP2's
pre-forward/pre-backward hooks, the dispatch's planning) or in loops whose kernels are shorter than
their launches. What the measurements say: under ``torch.profiler`` the Qwen3 8K step
(``bench/results/step_profile``) keeps the GPU idle 0.133 s of 0.282 s, more than the host's
0.10 s of the same structure at tiny widths (``baseline_host``); with ``max`` the idle time could
not exceed ``max(0, host − GPU) = 0`` (GPU busy 0.149 s). Summed, the nine committed FSDP2 W = 1
steps are predicted 0.90–1.15 of their measurement; with ``max`` they were 0.63–0.92.

Without the ``baseline_host`` curve no host time is booked (listed: short steps are predicted short).
"""

from __future__ import annotations

import math

import numpy as np

from planner.timing import kernel_rates as KR
from planner.timing.compute import host_op_s
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
            lk.assume("FSDP2 baseline: each segment takes GPU + host seconds (they add up: the dispatch's "
                      "synchronising copies drain the GPU every MoE layer); host = the expert loops' blocks (one per "
                      "local expert and pass) at the measured seconds per block + the seconds outside the loops "
                      f"measured in the FSDP2 step (calibration.step_host, {model.name}, ac={ac}); measured against "
                      "steps of 4K-16K tokens, an upper bound where the GPU work is long")
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


def _per_block(lk: Lookups, r, which: str, widths: tuple) -> float:
    """Host seconds of one expert-loop block (``which``: ``fwd``/``bwd``): the dispatch bench's
    ``host_loops`` at the layer's widths (``kernel_rates.at_width``: the loop's GEMMs at the model's
    shapes, the source the dispatch model prices the same loop from), else the row's in-step
    seconds per block (measured at tiny widths), else the launches at a launching call's seconds."""
    loop_name = f"grouped_{which}"
    with KR.at_width(lk, *widths):
        cv = KR._cv(lk)
        loop = cv.host_loops.get(loop_name) if cv is not None else None
    if loop is not None:
        return float(loop.s_per_block)
    s = getattr(r, f"loop_{which}_s_per_block")
    if s > 0:
        lk.assume(f"FSDP2 expert loop ({which}): no dispatch_kernels host_loops; the seconds per block measured "
                  "inside the step at tiny widths (calibration.step_host)")
        return float(s)
    lk.assume(f"FSDP2 expert loop ({which}) host seconds not measured: {KR.LOOP_LAUNCH[loop_name]} "
              "launches per block at the launching call's seconds")
    return KR.LOOP_LAUNCH[loop_name] * host_op_s(lk)


def layer(lk: Lookups, r, kind: str, ac: str, local_experts, widths: tuple = (1, 1, 1)) -> tuple:
    """(forward, backward with its recompute) host seconds of one layer of ``kind``; ``widths``:
    the MoE layer's ``(H, I, k)`` (for the loops' per-block seconds)."""
    b = loop_blocks(kind, ac, local_experts)
    if kind != "moe":
        return outside(r, "layer_fwd", kind), outside(r, "layer_bwd", kind)
    pf, pb = _per_block(lk, r, "fwd", widths), _per_block(lk, r, "bwd", widths)
    fwd = outside(r, "layer_fwd", kind) + b["fwd"] * pf
    bwd = outside(r, "layer_bwd", kind) + b["recompute"] * pf + b["bwd"] * pb
    return fwd, bwd
