"""Dispatch-kernel rates at every expert width the shipped models use: the
``dispatch_kernels_widths`` curves (one ``DispatchKernelsCurve`` per ``(H, I, k)``).

At each width ``calibration.dispatch_kernels``' memory classes and expert-GEMM layouts run at
``R = k·N = ROUTES`` rows (shape A's); the shape-independent parts (sustained GEMM, host loops) run
once and every width's curve carries them. Widths run bench shapes A and B first, so a budget cut
drops the others (named in ``skipped``).
"""

from __future__ import annotations

import time

from calibration.wall_budget import Clock

ROUTES = {"full": 131072, "quick": 131072, "smoke": 512}
"""Routed rows ``k·N`` per width (shape A's ``R``)."""
SHAPE_B_WIDTHS = (4096, 4096, 4)
"""``(H, I, k)`` of bench shape B, measured beside the models' widths (``E`` = 128)."""
BUDGET_S = {"full": 90.0, "quick": 45.0, "smoke": 60.0}
"""Default wall budget (an H200 takes ~27 s for the 11 widths)."""


def model_widths() -> list[dict]:
    """Distinct ``(H, I, k)`` of the shipped MoE models and bench shape B, with who uses them;
    shapes A and B first."""
    from calibration.coverage import REFERENCE_WIDTHS
    from planner.schema.io import load_model
    from planner.schema.profiles import shipped

    seen: dict = {}
    for name in shipped("models"):
        m = load_model(name)
        if m.num_experts:
            w = seen.setdefault((m.hidden_size, m.expert_ffn, m.top_k), {"E": 0, "users": []})
            w["E"] = max(w["E"], m.num_experts)   # the ids' range only (sort, gathers)
            w["users"].append(m.name)
    seen.setdefault(SHAPE_B_WIDTHS, {"E": 128, "users": []})["users"].append("bench shape B")
    first = {REFERENCE_WIDTHS: 0, SHAPE_B_WIDTHS: 1}
    order = sorted(seen.items(), key=lambda kv: (first.get(kv[0], 2), kv[0]))
    return [dict(H=H, I=I, k=k, **v) for (H, I, k), v in order]


def measure(grid: str, dev, clock: Clock, prov: dict, command: str, *, shared: dict | None = None,
            log=print) -> dict:
    """``{"widths": [dispatch_kernels document per width], "note"}``.

    Args:
        grid: ``full``, ``quick`` or ``smoke`` (tiny widths, any device).
        shared: ``{"sustained", "host_blocks"}`` already measured in this process (the
            ``dispatch_kernels`` section's), else measured here.
    """
    import torch

    from calibration import dispatch_kernels as dk

    dt, smoke = torch.bfloat16, grid == "smoke"
    base = dict(dk.SMOKE if smoke else dk.FULL)
    if shared is None:
        t0 = time.perf_counter()
        shared = {"sustained": dk.sustained(base, dev, dt), "host_blocks": dk.host_blocks(base, dev, dt)}
        log(f"dispatch shared sections (sustained GEMM, host loops) in {time.perf_counter() - t0:.1f} s")
    widths, per = [], 0.0
    for w in model_widths():
        if smoke:
            w = dict(w, H=min(w["H"], 64), I=min(w["I"], 48), E=min(w["E"], base["E"]))
        c = dict(base, H=w["H"], I=w["I"], k=w["k"], E=w["E"], N=ROUTES[grid] // w["k"],
                 min_time_s=0.002 if smoke else 0.01)
        label = f"H={w['H']} I={w['I']} k={w['k']} ({', '.join(w['users'])})"
        if not clock.fits(per, margin=1.3):
            clock.skip(f"dispatch_widths {label}: out of budget")
            continue
        t0 = time.perf_counter()
        with clock.point(f"dispatch_widths {label}", dev) as done:
            ref, mem = dk.memory(c, dev, dt)
            layouts = dk.gemm_layouts(c, dev, dt)
        if not done:
            continue
        per = time.perf_counter() - t0
        widths.append({"provenance": prov, "command": command, "shape": c, "adamw_ref_bytes_per_s": ref,
                       "memory": mem, "gemm_layouts": layouts, **shared, "users": w["users"]})
        slow = min(mem, key=lambda r: r["vs_adamw_rate"])
        log(f"dispatch {label}: {per:.1f} s; slowest class {slow['cls']} {slow['vs_adamw_rate']:.2f}× AdamW rate")
    return {"widths": widths, "note": "each entry: calibration.dispatch_kernels.measure's document at that width "
                                      "(curve_data() turns it into a DispatchKernelsCurve mapping)"}
