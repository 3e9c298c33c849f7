"""SCO part of ``bench/offload.py``: budget sweep at the reference shape, and the stream-race check.

The stand-in decoder has the real structure (per layer an attention region and a gated-MLP region,
each RMSNorm → block → residual, each its own checkpointed region with its input as boundary) and
narrow interiors: 4 heads × 128 with causal SDPA (flash on the GPU), MLP width 8192, so that each
region's forward outlasts one boundary's D2H (401 MB at ~54 GB/s ≈ 7.4 ms).
"""

from __future__ import annotations

import time

import torch

from calibration.sco_decoder import Decoder, plain_region, sdpa_backend
from planner.plans.sco import pinned_host_bytes
from planner.runtime.measure import peak_memory, wall_time
from planner.runtime.pinned import live_pinned_bytes
from planner.runtime.sco import SCO, set_race_sleep
from planner.units import GiB

FULL = dict(layers=24, N=69632, H=2880, heads=4, head_dim=128, ffn=8192, d_in=64)
SMOKE = dict(layers=2, N=256, H=64, heads=2, head_dim=16, ffn=128, d_in=16)
RACE = dict(layers=4, N=4096, H=512, heads=4, head_dim=64, ffn=1024, d_in=64)
RACE_SMOKE = dict(layers=2, N=64, H=32, heads=2, head_dim=8, ffn=48, d_in=8)
BUDGETS_GIB = (0, 8, 16, "full")
STEP_TIME_TOLERANCE = 0.02
"""Target: SCO moves the step time by at most 2%."""


def _formula(shape: dict, budget: int):
    """The planner's boundary live set for this shape: (n_off, peak over phases in bytes)."""
    from planner.budget import boundaries
    from planner.budget.build import make_context
    from planner.budget.phases import full_phases
    from planner.schema import ComposedKnobs, ModelSpec, Plan, Workload
    from planner.schema.io import load_cluster

    model = ModelSpec(name="sco-bench", num_layers=shape["layers"], hidden_size=shape["H"], vocab_size=1024,
                      num_heads=shape["heads"], num_kv_heads=shape["heads"], head_dim=shape["head_dim"],
                      dense_ffn=shape["ffn"])
    ctx = make_context(model, load_cluster("h200"), Workload(seq_len=shape["N"]),
                       Plan(world_size=1, composed=ComposedKnobs(checkpoint="sco", sco_host_bytes=budget)))
    ts = boundaries.terms(ctx)
    return int(ctx.num_offloaded), max(sum(int(t.bytes_in(p)) for t in ts) for p in full_phases(ctx))


def _time(fn, iters: int, cuda: bool) -> float:
    return wall_time(fn, iters=iters)


def run(device: torch.device, smoke: bool) -> dict:
    """Budget sweep: plain checkpointing, then SCO at each budget."""
    shape = SMOKE if smoke else FULL
    cuda = device.type == "cuda"
    dec = Decoder(shape, device)
    x_in = torch.randn(1, shape["N"], shape["d_in"], device=device, dtype=torch.bfloat16)
    nhb = shape["N"] * shape["H"] * 2
    L_b = 2 * shape["layers"]
    slot = -(-nhb // 4096) * 4096
    rows = []
    configs = [("plain", None)] + [(f"{b} GiB" if b != "full" else "full", L_b * slot if b == "full" else b * GiB)
                                   for b in BUDGETS_GIB]
    with sdpa_backend(device):
        for name, budget in configs:
            t_pin = time.perf_counter()
            sco = None if budget is None else SCO(num_boundaries=L_b, boundary_shape=(1, shape["N"], shape["H"]),
                                                  dtype=torch.bfloat16, device=device, host_budget_bytes=budget)
            t_pin = time.perf_counter() - t_pin
            region = plain_region if sco is None else sco.region

            def step():
                dec.zero_grad()
                dec.step(region, x_in)

            step()  # warm-up (allocates the grads, fills the caching allocator)
            step_s = _time(step, 1 if smoke else 3, cuda)
            row = {"config": name, "budget_bytes": budget, "step_s": step_s, "pin_s": t_pin,
                   "num_offloaded": 0 if sco is None else sco.num_offloaded,
                   "pinned_bytes": 0 if sco is None else sco.pinned_bytes, "live_pinned_bytes": live_pinned_bytes()}
            if cuda:
                torch.cuda.empty_cache()
                pm = peak_memory(step)
                row.update(peak_allocated_bytes=pm.allocated_bytes, peak_reserved_bytes=pm.reserved_bytes,
                           allocated_before_bytes=pm.allocated_before_bytes)
            if budget is not None:
                n_off, f_peak = _formula(shape, budget)
                assert n_off == sco.num_offloaded, (n_off, sco.num_offloaded)
                f_pinned = int(pinned_host_bytes(shape["N"], shape["H"], 2, L_b, budget))
                row.update(formula_boundaries_peak_bytes=f_peak, pinned_within_budget=sco.pinned_bytes <= budget,
                           formula_pinned_bytes=f_pinned,
                           pinned_pct_diff=(f_pinned - row["live_pinned_bytes"]) / row["live_pinned_bytes"] * 100
                           if row["live_pinned_bytes"] else (0.0 if not f_pinned else None))
                sco.close()
            rows.append(row)
            print(f"[sco] {name:>7s}: n_off {row['num_offloaded']:2d}, pinned {row['pinned_bytes']/GiB:6.2f} GiB, "
                  f"step {step_s:.3f} s" + (f", peak {row['peak_allocated_bytes']/GiB:.2f} GiB alloc / "
                                            f"{row['peak_reserved_bytes']/GiB:.2f} GiB reserved" if cuda else ""),
                  flush=True)
    return {"shape": shape, "boundary_bytes": nhb, "num_boundaries": L_b, "rows": _derive(rows, nhb, cuda)}


def _derive(rows: list[dict], nhb: int, cuda: bool) -> list[dict]:
    """Step-time change vs plain checkpointing; measured peak drop vs the formula's drop (budget 0 = ref)."""
    plain = rows[0]
    ref = rows[1]
    for r in rows[1:]:
        r["step_change_vsplain_region"] = r["step_s"] / plain["step_s"] - 1
        r["step_within_2pct"] = abs(r["step_change_vsplain_region"]) <= STEP_TIME_TOLERANCE
        f_drop = ref["formula_boundaries_peak_bytes"] - r["formula_boundaries_peak_bytes"]
        r["formula_drop_bytes"] = f_drop
        if cuda:
            m_drop = ref["peak_allocated_bytes"] - r["peak_allocated_bytes"]
            r["measured_drop_bytes"] = m_drop
            r["measured_drop_boundaries"] = m_drop / nhb
            r["drop_pct_diff"] = (f_drop - m_drop) / m_drop * 100 if m_drop else (0.0 if not f_drop else None)
    if cuda:
        peaks = [r["peak_allocated_bytes"] for r in rows[1:]]
        for r in rows[1:]:
            r["monotone"] = all(a >= b for a, b in zip(peaks, peaks[1:]))
    return rows


def race(device: torch.device, smoke: bool, iterations: int = 100) -> dict:
    """SCO vs plain checkpointing, bitwise, with sleeps on the copy and compute streams."""
    shape = RACE_SMOKE if smoke else RACE
    iterations = 3 if smoke else iterations
    cuda = device.type == "cuda"
    L_b = 2 * shape["layers"]
    nhb = shape["N"] * shape["H"] * 2
    slot = -(-nhb // 4096) * 4096
    dec = Decoder(shape, device, seed=1)
    scos = [SCO(num_boundaries=L_b, boundary_shape=(1, shape["N"], shape["H"]), dtype=torch.bfloat16,
                device=device, host_budget_bytes=n * slot) for n in range(L_b + 1)]
    sleep = {"copy": 2_000_000 if cuda else 0, "compute": 500_000 if cuda else 0}
    prev_det = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    equal = 0
    try:
        with sdpa_backend(device, math=True):
            for it in range(iterations):
                g = torch.Generator(device=device).manual_seed(1000 + it)
                x_in = torch.randn(1, shape["N"], shape["d_in"], device=device, generator=g).to(torch.bfloat16)
                for p in dec.params():
                    p.grad = None
                set_race_sleep(0, 0)
                dec.step(plain_region, x_in)
                ref = [p.grad.clone() for p in dec.params()]
                for p in dec.params():
                    p.grad = None
                set_race_sleep(**sleep)
                dec.step(scos[it % (L_b + 1)].region, x_in)
                got = [p.grad for p in dec.params()]
                equal += all(torch.equal(a, b) for a, b in zip(ref, got))
    finally:
        set_race_sleep(0, 0)
        torch.use_deterministic_algorithms(prev_det)
        for s in scos:
            s.close()
    print(f"[race] SCO bitwise equal in {equal}/{iterations} iterations", flush=True)
    return {"shape": shape, "iterations": iterations, "bitwise_equal": equal, "sleep_cycles": sleep}


def markdown(res: dict) -> list[str]:
    s = res["shape"]
    lines = [f"## SCO (L_b = {res['num_boundaries']}, N = {s['N']}, H = {s['H']}, bf16; boundary "
             f"{res['boundary_bytes']/GiB:.3f} GiB)", "",
             "| config | n_off | pinned GiB | ≤ budget | peak alloc GiB | peak reserved GiB | measured drop "
             "(boundaries) | formula drop (boundaries) | drop diff % | step s | step vs plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    nhb = res["boundary_bytes"]
    for r in res["rows"]:
        fmt = lambda k, d=2: f"{r[k]/GiB:.{d}f}" if r.get(k) is not None else "-"  # noqa: E731
        drop = f"{r['measured_drop_boundaries']:.2f}" if "measured_drop_boundaries" in r else "-"
        fdrop = f"{r['formula_drop_bytes']/nhb:.2f}" if "formula_drop_bytes" in r else "-"
        dd = f"{r['drop_pct_diff']:+.2f}" if r.get("drop_pct_diff") is not None else "-"
        sv = f"{r['step_change_vsplain_region']*100:+.2f}%" if "step_change_vsplain_region" in r else "-"
        lines.append(f"| {r['config']} | {r['num_offloaded']} | {fmt('pinned_bytes')} | "
                     f"{r.get('pinned_within_budget', '-')} | {fmt('peak_allocated_bytes')} | "
                     f"{fmt('peak_reserved_bytes')} | {drop} | {fdrop} | {dd} | {r['step_s']:.3f} | {sv} |")
    return lines + [""]
