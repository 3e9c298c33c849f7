"""SCO's restore/recompute overlap measured against plain checkpointing: the ``sco`` curve
(``planner.schema.curves.SCOCurve``, read by ``planner/timing``'s SCO rule).

On ``calibration.sco_decoder.Decoder`` at interiors from copy-bound to compute-bound, per shape: the
step under plain ``torch.utils.checkpoint``, the step under SCO with every boundary offloaded (full
host budget), the forward alone (≈ the recompute of every region) and one boundary's pinned D2H and
H2D copy.
"""

from __future__ import annotations

import time

from calibration.wall_budget import Clock, timed

SHAPES = {"copy-bound": dict(layers=8, N=69632, H=2880, heads=1, head_dim=64, ffn=1024, d_in=64),
          "balanced": dict(layers=8, N=69632, H=2880, heads=2, head_dim=128, ffn=4096, d_in=64),
          "compute-bound": dict(layers=8, N=69632, H=2880, heads=4, head_dim=128, ffn=8192, d_in=64)}
GRIDS = {"full": SHAPES, "quick": SHAPES,
         "smoke": {"copy-bound": dict(layers=2, N=256, H=64, heads=1, head_dim=16, ffn=32, d_in=16)}}
BUDGET_S = {"full": 90.0, "quick": 90.0, "smoke": 60.0}
"""Default wall budget (an H200 takes ~20 s for the three shapes)."""
CURVE_KEYS = ("config", "boundary_bytes", "num_boundaries", "plain_step_s", "sco_step_s", "forward_s", "d2h_s", "h2d_s")
"""The measured row's fields that the ``SCORow`` keeps."""
NOTE = ("calibration.sco_decoder.Decoder; plain = torch.utils.checkpoint per region, SCO = every boundary "
        "offloaded (full budget); forward_s = the forward under no_grad (≈ the recompute of every region); "
        "d2h_s/h2d_s = one boundary's pinned copy")


def _forward(dec, x_in):
    """The decoder's forward (its input projection, then every region), no backward."""
    import torch.nn.functional as F

    h = F.linear(x_in, dec.w_in)
    for fn in dec.regions():
        h = fn(h)
    return h


def _copy_times(nbytes: int, dev) -> dict:
    import torch

    if dev.type != "cuda":
        return {"d2h_s": 0.0, "h2d_s": 0.0}
    d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d2h, _ = timed(lambda: h.copy_(d, non_blocking=True), dev, 0.05)
    h2d, _ = timed(lambda: d.copy_(h, non_blocking=True), dev, 0.05)
    return {"d2h_s": d2h, "h2d_s": h2d}


def measure(shapes: dict, dev, clock: Clock, log=print) -> dict:
    """``{"rows", "note"}``: one row per shape that fit the budget."""
    import torch

    from calibration.sco_decoder import Decoder, plain_region, sdpa_backend
    from planner.runtime.sco import SCO

    rows, per = [], 0.0
    for tag, shape in shapes.items():
        if not clock.fits(per, margin=1.3):
            clock.skip(f"sco {tag}: out of budget")
            continue
        t0 = time.perf_counter()
        dec = Decoder(shape, dev)
        x_in = torch.randn(1, shape["N"], shape["d_in"], device=dev, dtype=torch.bfloat16)
        L_b, nhb = 2 * shape["layers"], shape["N"] * shape["H"] * 2
        row = dict(config=tag, shape=shape, boundary_bytes=nhb, num_boundaries=L_b)

        def step_with(region):
            def step():
                dec.zero_grad()
                dec.step(region, x_in)
            return step

        def forward_only():
            with torch.no_grad():
                _forward(dec, x_in)
        with sdpa_backend(dev):
            plain = step_with(plain_region)
            plain()
            row["plain_step_s"], _ = timed(plain, dev, 0.0)
            row["forward_s"], _ = timed(forward_only, dev, 0.0)
            s = SCO(num_boundaries=L_b, boundary_shape=(1, shape["N"], shape["H"]), dtype=torch.bfloat16,
                    device=dev, host_budget_bytes=L_b * (-(-nhb // 4096) * 4096))
            try:
                sco_step = step_with(s.region)
                sco_step()
                row["sco_step_s"], _ = timed(sco_step, dev, 0.0)
                row["num_offloaded"] = s.num_offloaded
            finally:
                s.close()
        row.update(_copy_times(nhb, dev))
        row["sco_vs_plain"] = row["sco_step_s"] / row["plain_step_s"] - 1
        rows.append(row)
        del dec, x_in
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        per = time.perf_counter() - t0
        log(f"sco {tag}: plain {row['plain_step_s']:.3f} s, SCO {row['sco_step_s']:.3f} s "
            f"({row['sco_vs_plain']:+.1%}), forward {row['forward_s']:.3f} s, one boundary D2H "
            f"{row['d2h_s'] * 1e3:.2f} ms / H2D {row['h2d_s'] * 1e3:.2f} ms ({per:.1f} s)")
    return {"rows": rows, "note": NOTE}


def curve(section: dict, prov: dict) -> dict | None:
    """The ``sco`` curve mapping of a measured section (``None`` without rows)."""
    if not section.get("rows"):
        return None
    return dict(status="measured", provenance=prov, note=section["note"],
                rows=[{k: r[k] for k in CURVE_KEYS} for r in section["rows"]])
