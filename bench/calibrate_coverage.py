"""Calibration coverage where the time model extrapolated: one H200, one command, a wall budget.

    python3 bench/calibrate_coverage.py --out $OUT [--budget-s 390]      # one H200, < 7 min
    python3 bench/calibrate_coverage.py --dry-run --out /tmp/cov         # CPU, tiny shapes, same code

Sections (run order: ``SECTIONS``, attention last; each has a share of the budget plus what earlier
ones left; a point that would not fit is skipped and listed under ``skipped``; every section's
results are written as soon as it ends):

- ``attention``: causal attention forward and backward at long ``S`` (65,536 … 1,048,576, then
  2,097,152 where time is left) for the per-rank head counts of the shipped models under Ulysses.
  Variants: ``flash128`` (SDPA flash, ``d = 128``, ``h = h_kv``), ``mla`` (``d_qk = 192``,
  ``d_v = 128`` through the runtime's ``causal_attention``: the kernel it picks), ``sinks64``
  (gpt-oss global layers: GQA 8:1, ``d = 64``, sink channels) and ``sliding64`` (gpt-oss local
  layers, ``w = 128``, sinks). Rows ascend in ``S`` across variants, so a cut leaves the same ``S``
  range for all. Points of ≥ ``ONE_SHOT_S`` are timed once (after the kernel ran at a smaller ``S``).
- ``dispatch_widths``: ``calibration.dispatch_kernels``' memory classes and expert-GEMM layouts at
  every ``(H, I, k)`` of ``planner/profiles/models`` and bench shape B, ``R = k·N = 131,072`` rows
  (shape A's), plus the shape-independent sections (sustained GEMM, host loops) once; each width a
  complete ``DispatchKernelsCurve`` mapping.
- ``chunk_curves``: PipelinedLLEP forward+backward at ``K`` ∈ {1, 2, 3, 5, 10, 20} at bench shapes
  A and B (balanced, ``c = ceil(N/K)``) on rank 0 of ``E_p = 8`` emulated as the calibration hook
  does (``planner.runtime.pipelined_llep_calibration.emulation``).
- ``sco``: plain checkpointing against SCO (every boundary offloaded) on ``bench/offload_sco``'s
  decoder at interiors from copy-bound to compute-bound, with the forward-only time and one
  boundary's D2H/H2D time, so the restore/recompute overlap can be modelled and checked.
- ``host``: fused CPU AdamW and the bf16↔fp32 casts at 10⁹ parameters per thread count (the
  ``cpu_adamw``/``cpu_cast`` tables), then ``bench/offload.py --modes bw,opt`` on this instance
  (CPUOffloadAdamW rows with the same ``host_instance``).

Writes ``coverage.json`` (every section, provenance with ``host_instance``, ``skipped``, per-section
wall times) under ``--out`` and ``offload_opt/offload.json`` from the host section.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ONE_SHOT_S = 0.5
"""A point whose first call lasts at least this long is timed by that call alone (or the median of
``--median-of`` calls)."""
MEDIAN_OF = 1
SHARES = {"attention": 0.43, "dispatch_widths": 0.12, "chunk_curves": 0.09, "sco": 0.10, "host": 0.26}
"""Each section's share of ``--budget-s`` (a section may also use what earlier ones left)."""
BENCH_TIMEOUT_S = 120.0
"""The CPUOffloadAdamW bench subprocess (~45 s on an H200 host) is killed after this long."""
FULL = dict(
    seqs=(65536, 131072, 262144, 524288, 1048576), beyond=(2097152,),
    variants={"sliding64": dict(heads=(1, 8), kv_div=8, d=64, dv=64, kind="runtime", sinks=True, window=128),
              "flash128": dict(heads=(1, 2, 8), kv_div=1, d=128, dv=128, kind="flash"),
              "mla": dict(heads=(1, 8), kv_div=1, d=192, dv=128, kind="runtime"),
              "sinks64": dict(heads=(1, 8), kv_div=8, d=64, dv=64, kind="runtime", sinks=True)},
    beyond_variants=("flash128", "mla"), beyond_heads=(1,),
    disp_rows=131072, chunk_ks=(1, 2, 3, 5, 10, 20),
    chunk_shapes={"A": dict(N=65536, H=7168, I=2048, E=128, k=8), "B": dict(N=32768, H=4096, I=4096, E=128, k=4)},
    sco_shapes={"copy-bound": dict(layers=8, N=69632, H=2880, heads=1, head_dim=64, ffn=1024, d_in=64),
                "balanced": dict(layers=8, N=69632, H=2880, heads=2, head_dim=128, ffn=4096, d_in=64),
                "compute-bound": dict(layers=8, N=69632, H=2880, heads=4, head_dim=128, ffn=8192, d_in=64)},
    host_params=10**9, host_threads=(1, 2, 4, 8, 16))
DRY = dict(
    seqs=(64, 128), beyond=(256,),
    variants={"flash128": dict(heads=(1, 2), kv_div=1, d=16, dv=16, kind="flash"),
              "mla": dict(heads=(1, 2), kv_div=1, d=24, dv=16, kind="runtime"),
              "sinks64": dict(heads=(2,), kv_div=2, d=8, dv=8, kind="runtime", sinks=True),
              "sliding64": dict(heads=(2,), kv_div=2, d=8, dv=8, kind="runtime", sinks=True, window=16)},
    beyond_variants=("flash128",), beyond_heads=(1,),
    disp_rows=512, chunk_ks=(1, 2),
    chunk_shapes={"A": dict(N=512, H=64, I=32, E=16, k=4)},
    sco_shapes={"copy-bound": dict(layers=2, N=256, H=64, heads=1, head_dim=16, ffn=32, d_in=16)},
    host_params=1 << 16, host_threads=(1, 2))


class Clock:
    """The run's wall budget and each section's deadline."""

    def __init__(self, budget_s: float):
        self.t0, self.budget = time.perf_counter(), budget_s
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def section_deadline(self, name: str) -> float:
        """Absolute perf_counter deadline: the section's share, capped by the run's end."""
        end = self.t0 + self.budget
        return min(end, time.perf_counter() + SHARES[name] * self.budget + max(0.0, self.spare))

    spare = 0.0

    def skip(self, what: str) -> None:
        self.skipped.append(what)
        log(f"skip: {what}")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, min_time_s: float) -> tuple[float, int]:
    """``(seconds per call, calls timed)``: one call, kept when ≥ ``ONE_SHOT_S`` (the median of
    ``MEDIAN_OF`` such calls); else the median of three windows lasting ≥ ``min_time_s`` each."""
    _sync(dev)
    t = time.perf_counter()
    fn()
    _sync(dev)
    one = time.perf_counter() - t
    if one >= ONE_SHOT_S:
        more = []
        for _ in range(MEDIAN_OF - 1):
            _sync(dev)
            t = time.perf_counter()
            fn()
            _sync(dev)
            more.append(time.perf_counter() - t)
        vals = sorted([one, *more])
        return vals[len(vals) // 2], len(vals)
    reps = max(1, math.ceil(min_time_s / max(one, 1e-6)))
    out = []
    for _ in range(3):
        _sync(dev)
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(dev)
        out.append((time.perf_counter() - t) / reps)
    return sorted(out)[1], 3 * reps


# ------------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------------
def _attn_case(v: dict, S: int, h: int, dev, dt):
    """``(forward, backward, backend)`` closures of one variant at ``(S, h)``."""
    import torch
    import torch.nn.functional as F

    from planner.runtime.sdpa import causal_attention

    hkv = max(1, h // v["kv_div"])
    q = torch.randn(1, h, S, v["d"], device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(1, hkv, S, v["d"], device=dev, dtype=dt, requires_grad=True)
    val = torch.randn(1, hkv, S, v["dv"], device=dev, dtype=dt, requires_grad=True)
    sink = torch.zeros(h, device=dev, dtype=torch.float32, requires_grad=True) if v.get("sinks") else None
    scale = v["d"] ** -0.5
    if v["kind"] == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = [SDPBackend.FLASH_ATTENTION] if dev.type == "cuda" else [SDPBackend.MATH]

        def f():
            with sdpa_kernel(backends):
                return F.scaled_dot_product_attention(q, k, val, is_causal=True, scale=scale)
        backend = "SDPA flash" if dev.type == "cuda" else "SDPA math (CPU dry run)"
    else:
        def f():
            return causal_attention(q, k, val, scale=scale, window=v.get("window"), sink_h=sink)
        backend = "planner.runtime.sdpa.causal_attention (flash / memory-efficient)"
    inputs = [t for t in (q, k, val, sink) if t is not None]

    def fwd():
        with torch.no_grad():
            f()
    state = {}

    def bwd_setup():
        state["out"] = f()
        state["g"] = torch.randn_like(state["out"])

    def bwd():
        torch.autograd.grad(state["out"], inputs, state["g"], retain_graph=True)
    return fwd, bwd_setup, bwd, backend, hkv


def _attn_guess(prev: tuple, S: int, v: dict) -> float:
    """Wall seconds of the next point from the previous ``(S, t_fwd, t_bwd)`` of the same variant
    and heads: ``∝ S²`` (``∝ S`` with a window); a forward with grad, then the timed forward and
    backward, each one call when it lasts ≥ ``ONE_SHOT_S``, else about four."""
    S0, t_f, t_b = prev
    r = (S / S0) ** (1 if v.get("window") else 2)
    f, b = t_f * r, t_b * r
    return f + sum(t if t >= ONE_SHOT_S else 4 * t + 0.06 for t in (f, b))


def attention(cfg, dev, clock: Clock, min_time_s: float, partial=None) -> dict:
    """Causal attention per variant, heads and S; ``partial(section)`` is called after every point."""
    import torch

    from planner.timing.curves import attention_flops

    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    deadline = clock.section_deadline("attention")
    rows, last = [], {}
    plan = [(S, name, h) for S in cfg["seqs"] for name, v in cfg["variants"].items() for h in v["heads"]]
    plan += [(S, name, h) for S in cfg["beyond"] for name in cfg["beyond_variants"] for h in cfg["beyond_heads"]]
    for S, name, h in plan:
        v = cfg["variants"][name]
        prev = last.get((name, h))
        if prev is None:   # first point at these heads: scale the same variant's nearest heads (∝ h)
            near = min((k for k in last if k[0] == name), key=lambda k: abs(k[1] - h), default=None)
            if near is not None:
                S0, t_f, t_b = last[near]
                guess = _attn_guess((S0, t_f * h / near[1], t_b * h / near[1]), S, v)
            else:
                guess = 0.0
        else:
            guess = _attn_guess(prev, S, v)
        if time.perf_counter() + guess * 1.15 > deadline:
            clock.skip(f"attention {name} S={S} h={h}: ~{guess:.1f} s would pass the section's budget")
            continue
        try:
            fwd, bwd_setup, bwd, backend, hkv = _attn_case(v, S, h, dev, dt)
            t0 = time.perf_counter()
            if prev is None:       # first time at this (variant, h): load the kernels
                fwd()
            t_f, n_f = timed(fwd, dev, min_time_s)
            bwd_setup()
            t_b, n_b = timed(bwd, dev, min_time_s)
            wall = time.perf_counter() - t0
        except torch.OutOfMemoryError as err:
            clock.skip(f"attention {name} S={S} h={h}: out of memory ({str(err).splitlines()[0]})")
            continue
        finally:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        last[(name, h)] = (S, t_f, t_b)
        f_f = float(attention_flops(S, h, v["d"])) * (v["d"] + v["dv"]) / (2 * v["d"])
        f_b = float(attention_flops(S, h, v["d"], backward=True)) * (v["d"] + v["dv"]) / (2 * v["d"])
        row = dict(variant=name, seq_len=S, heads=h, kv_heads=hkv, d_qk=v["d"], d_v=v["dv"], window=v.get("window"),
                   sinks=bool(v.get("sinks")), backend=backend, fwd_s=t_f, bwd_s=t_b, fwd_calls=n_f, bwd_calls=n_b,
                   causal_flops_fwd=f_f, causal_flops_bwd=f_b,
                   fwd_tflops=f_f / t_f / 1e12, bwd_tflops=f_b / t_b / 1e12)
        rows.append(row)
        if partial is not None:   # a run cut short (a wall-clock kill) keeps every point measured
            partial({"rows": rows, "partial": True})
        log(f"attention {name:9s} S={S:>8d} h={h} (kv {hkv}): fwd {t_f * 1e3:9.2f} ms "
            f"({row['fwd_tflops']:6.1f} TF/s), bwd {t_b * 1e3:9.2f} ms ({row['bwd_tflops']:6.1f} TF/s)")
    note = ("causal, batch 1, [1, h, S, d]; fwd_s under no_grad, bwd_s = autograd.grad of the output for "
            "q, k, v (and the sink logits) with a random upstream gradient; causal_flops_* = "
            "planner.timing.curves.attention_flops × (d_qk + d_v)/(2·d_qk) (the dense causal work, "
            "not the band's for sliding64)")
    return {"rows": rows, "note": note, "variants": cfg["variants"]}


# ------------------------------------------------------------------------------------------------
# dispatch kernels at every width
# ------------------------------------------------------------------------------------------------
def model_widths() -> list[dict]:
    """Distinct ``(H, I, k)`` of the shipped MoE models and bench shape B, with who uses them."""
    import yaml

    seen: dict = {}
    for path in sorted((ROOT / "planner" / "profiles" / "models").glob("*.yaml")):
        m = yaml.safe_load(path.read_text())
        if m.get("num_experts"):
            key = (m["hidden_size"], m["expert_ffn"], m["top_k"])
            seen.setdefault(key, {"E": 0, "users": []})
            seen[key]["E"] = max(seen[key]["E"], m["num_experts"])   # ids' range only (sort, gathers)
            seen[key]["users"].append(m["name"])
    seen.setdefault((4096, 4096, 4), {"E": 128, "users": []})["users"].append("bench shape B")
    first = {(7168, 2048, 8): 0, (4096, 4096, 4): 1}   # bench shapes A and B first: a cut drops others
    order = sorted(seen.items(), key=lambda kv: (first.get(kv[0], 2), kv[0]))
    return [dict(H=H, I=I, k=k, **v) for (H, I, k), v in order]


def dispatch_widths(cfg, dev, clock: Clock, dry: bool, command: str) -> dict:
    import torch

    from calibration import dispatch_kernels as dk

    dt = torch.bfloat16
    deadline = clock.section_deadline("dispatch_widths")
    base = dict(dk.SMOKE if dry else dk.FULL)
    t0 = time.perf_counter()
    shared = {"sustained": dk.sustained(base, dev, dt), "host_blocks": dk.host_blocks(base, dev, dt)}
    log(f"dispatch shared sections (sustained GEMM, host loops) in {time.perf_counter() - t0:.1f} s")
    widths, per = [], 0.0
    for w in model_widths():
        if dry:
            w = dict(w, H=min(w["H"], 64), I=min(w["I"], 48))
        c = dict(base, H=w["H"], I=w["I"], k=w["k"], E=min(w["E"], base["E"]) if dry else w["E"],
                 N=cfg["disp_rows"] // w["k"], min_time_s=0.002 if dry else 0.01)
        if time.perf_counter() + 1.3 * per > deadline:
            clock.skip(f"dispatch_widths H={w['H']} I={w['I']} k={w['k']} ({', '.join(w['users'])}): out of budget")
            continue
        t0 = time.perf_counter()
        try:
            ref, mem = dk.memory(c, dev, dt)
            layouts = dk.gemm_layouts(c, dev, dt)
        except torch.OutOfMemoryError as err:
            clock.skip(f"dispatch_widths H={w['H']} I={w['I']}: out of memory ({str(err).splitlines()[0]})")
            continue
        finally:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        per = time.perf_counter() - t0
        doc = {"provenance": clock.prov, "command": command, "shape": c, "adamw_ref_bytes_per_s": ref,
               "memory": mem, "gemm_layouts": layouts, **shared, "users": w["users"]}
        widths.append(doc)
        slow = min(mem, key=lambda r: r["vs_adamw_rate"])
        log(f"dispatch H={c['H']:5d} I={c['I']:5d} k={c['k']} ({', '.join(w['users'])}): {per:.1f} s; "
            f"slowest class {slow['cls']} {slow['vs_adamw_rate']:.2f}× AdamW rate")
    return {"widths": widths, "note": "each entry: calibration.dispatch_kernels.measure's document at that width "
                                      "(curve_data() turns it into a DispatchKernelsCurve mapping)"}


# ------------------------------------------------------------------------------------------------
# chunk-count curves
# ------------------------------------------------------------------------------------------------
def chunk_curves(cfg, dev, clock: Clock, dry: bool) -> dict:
    import torch

    from planner.runtime.pipelined_llep_calibration import EMULATED_EXPERT_PARALLEL, calibration_case, emulation

    deadline = clock.section_deadline("chunk_curves")
    out = {}
    with emulation(dev) as filler:
        for tag, dims in cfg["chunk_shapes"].items():
            ks, times, fills, shape = [], [], [], {}
            for K in cfg["chunk_ks"]:
                guess = times[-1] * 2 if times else 0.0
                if time.perf_counter() + 3 * guess > deadline:
                    clock.skip(f"chunk_curves {tag} K={K}: out of budget")
                    continue
                run, shape = calibration_case(K, smoke=dry, device=dev, dims=dims)
                filler.nbytes = 0
                run()  # warm-up; one call's fill bytes
                fills.append(float(filler.nbytes))
                t, _ = timed(run, dev, 0.0)
                ks.append(K)
                times.append(t)
                del run
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                log(f"chunk curve {tag} K={K:2d} (rank 0 of E_p = {EMULATED_EXPERT_PARALLEL}): {t * 1e3:.1f} ms")
            out[tag] = {"num_chunks": ks, "time_s": times, "fill_bytes": fills, "shape": shape}
    return {"curves": out, "note": f"PipelinedLLEP forward+backward on rank 0 of E_p = {EMULATED_EXPERT_PARALLEL} "
                                   "emulated on one GPU (the calibration hook, planner.runtime.pipelined_llep_calibration: "
                                   "fake process group, every all-to-all output filled from random data, fill_bytes per "
                                   "call), balanced routing, c = ceil(N/K), K_max = max(K, 10), router and out.backward "
                                   "of a random N×H gradient included"}


# ------------------------------------------------------------------------------------------------
# SCO restore/recompute overlap
# ------------------------------------------------------------------------------------------------
def sco(cfg, dev, clock: Clock) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from offload_sco import Decoder, _plain, _sdpa

    from planner.runtime.sco import SCO

    deadline = clock.section_deadline("sco")
    rows, per = [], 0.0
    for tag, shape in cfg["sco_shapes"].items():
        if time.perf_counter() + 1.3 * per > deadline:
            clock.skip(f"sco {tag}: out of budget")
            continue
        t0 = time.perf_counter()
        dec = Decoder(shape, dev)
        x_in = torch.randn(1, shape["N"], shape["d_in"], device=dev, dtype=torch.bfloat16)
        L_b, nhb = 2 * shape["layers"], shape["N"] * shape["H"] * 2
        row = dict(config=tag, shape=shape, boundary_bytes=nhb, num_boundaries=L_b)
        with _sdpa(dev):
            def step_with(region):
                def step():
                    dec.zero_grad()
                    dec.step(region, x_in)
                return step
            plain = step_with(_plain)
            plain()
            row["plain_step_s"], _ = timed(plain, dev, 0.0)

            def fwd_only():
                with torch.no_grad():
                    _fwd(dec, x_in)
            row["forward_s"], _ = timed(fwd_only, dev, 0.0)
            budget = L_b * (-(-nhb // 4096) * 4096)
            s = SCO(num_boundaries=L_b, boundary_shape=(1, shape["N"], shape["H"]), dtype=torch.bfloat16,
                    device=dev, host_budget_bytes=budget)
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
    return {"rows": rows, "note": "bench/offload_sco.Decoder; plain = torch.utils.checkpoint per region, SCO = "
                                  "every boundary offloaded (full budget); forward_s = the forward under no_grad "
                                  "(≈ the recompute of every region); d2h_s/h2d_s = one boundary's pinned copy"}


def _fwd(dec, x_in):
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


# ------------------------------------------------------------------------------------------------
# host AdamW and casts at the benches' parameter counts, then the CPUOffloadAdamW bench
# ------------------------------------------------------------------------------------------------
def host(cfg, clock: Clock, dry: bool, out: Path) -> dict:
    import torch

    deadline = clock.section_deadline("host")
    n = cfg["host_params"]
    res: dict = {"num_params": n, "threads": [], "adamw_s_per_param": [], "cast_s_per_param": []}
    bench_s = 8.0 if dry else 70.0
    t0 = time.perf_counter()
    p = torch.nn.Parameter(torch.rand(n, dtype=torch.float32))
    p.grad = torch.rand(n, dtype=torch.float32)
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)
    opt.step()  # allocates exp_avg, exp_avg_sq
    lo = torch.zeros(n, dtype=torch.bfloat16)

    def casts():
        p.data.copy_(lo)
        lo.copy_(p.data)
    log(f"host: {n:.3g} parameters allocated in {time.perf_counter() - t0:.1f} s")
    prev = torch.get_num_threads()
    try:
        for T in sorted(cfg["host_threads"], reverse=True):   # fast ones first: a cut drops T = 1
            if time.perf_counter() + bench_s > deadline:
                clock.skip(f"host tables at {T} threads: out of budget")
                continue
            torch.set_num_threads(T)
            ta, _ = timed(opt.step, torch.device("cpu"), 0.0)
            tc, _ = timed(casts, torch.device("cpu"), 0.0)
            res["threads"].insert(0, T)
            res["adamw_s_per_param"].insert(0, ta / n)
            res["cast_s_per_param"].insert(0, tc / n)
            log(f"host {T:2d} threads: AdamW {ta * 1e9 / n:.3f} s/1e9, casts {tc * 1e9 / n:.3f} s/1e9")
    finally:
        torch.set_num_threads(prev)
    del opt, p, lo
    res["note"] = (f"torch.optim.AdamW(fused=True) on one host fp32 parameter of {n} elements (state ≫ LLC); "
                   "casts: bf16→fp32 copy_ then fp32→bf16 copy_ of the same length; each ≥ 0.5 s call timed "
                   "once after a warm call, shorter ones the median of three")
    cmd = [sys.executable, str(ROOT / "bench" / "offload.py"), "--modes", "bw,opt", "--out", str(out / "offload_opt")]
    if dry:
        cmd.append("--smoke")
    if time.perf_counter() + bench_s > clock.t0 + clock.budget + 30:
        clock.skip("bench/offload.py --modes bw,opt: out of budget")
        return res
    log("host: " + " ".join(shlex.quote(c) for c in cmd))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run(cmd, env=env, timeout=min(BENCH_TIMEOUT_S, max(30.0, clock.left())),
                              capture_output=True, text=True)
        res["offload_bench_rc"] = proc.returncode
        print(proc.stdout[-4000:], proc.stderr[-2000:], flush=True)
    except subprocess.TimeoutExpired:
        clock.skip("bench/offload.py --modes bw,opt: timed out")
    return res


# ------------------------------------------------------------------------------------------------
def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float))
    os.replace(tmp, path)


SECTIONS = ("dispatch_widths", "chunk_curves", "sco", "host", "attention")
"""Run order: attention last, so that it gets every second the others left (its long-``S`` points are
the costliest and the most valuable)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for coverage.json and offload_opt/")
    ap.add_argument("--budget-s", type=float, default=390.0, help="wall budget of the whole run (default 390)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, same code paths")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of " + ", ".join(SECTIONS))
    ap.add_argument("--seqs", help="attention: comma list of S instead of the grid's (e.g. 524288,1048576,2097152)")
    ap.add_argument("--variants", help="attention: comma list of variants (default all)")
    ap.add_argument("--median-of", type=int, default=1,
                    help="time a point of ≥ 0.5 s as the median of this many calls (default 1)")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or args.budget_s <= 0:
        print(f"error: --sections {bad[0]!r} is not one of {', '.join(SECTIONS)}" if bad else
              f"error: --budget-s {args.budget_s} must be positive", file=sys.stderr)
        return 2
    import torch

    from calibration.dispatch_kernels import host_instance
    from planner.runtime.measure import provenance

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("error: no CUDA device; fix: run on the GPU, or pass --dry-run for the CPU code-path check",
              file=sys.stderr)
        return 2
    dev = torch.device("cuda" if cuda else "cpu")
    cfg = dict(DRY if args.dry_run else FULL)
    try:
        if args.variants:
            bad_v = [v for v in args.variants.split(",") if v not in cfg["variants"]]
            if bad_v:
                raise ValueError(f"--variants {bad_v[0]!r} is not one of {', '.join(cfg['variants'])}")
            cfg["variants"] = {k: v for k, v in cfg["variants"].items() if k in args.variants.split(",")}
            cfg["beyond_variants"] = tuple(v for v in cfg["beyond_variants"] if v in cfg["variants"])
        if args.seqs:
            seqs = sorted(int(x) for x in args.seqs.split(","))
            if not seqs or seqs[0] < 1:
                raise ValueError(f"--seqs {args.seqs!r} must be positive integers")
            cfg["seqs"], cfg["beyond"] = tuple(seqs), ()
        if args.median_of < 1:
            raise ValueError(f"--median-of {args.median_of} must be ≥ 1")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    global MEDIAN_OF
    MEDIAN_OF = args.median_of
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python3 bench/calibrate_coverage.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    clock = Clock(args.budget_s)
    clock.prov = {**provenance(command), "host_instance": host_instance()}
    doc = {"provenance": clock.prov, "command": command, "budget_s": args.budget_s, "dry_run": args.dry_run,
           "skipped": clock.skipped, "section_s": {}, "failed": {}}
    log(f"coverage on {clock.prov['device']} (torch {torch.__version__}), budget {args.budget_s:.0f} s, "
        f"sections {', '.join(sections)}")
    min_time = 0.002 if args.dry_run else 0.02
    def partial_attention(section: dict) -> None:
        write_json(out / "coverage.json", {**doc, "attention": section})

    runners = {"attention": lambda: attention(cfg, dev, clock, min_time, partial_attention),
               "dispatch_widths": lambda: dispatch_widths(cfg, dev, clock, args.dry_run, command),
               "chunk_curves": lambda: chunk_curves(cfg, dev, clock, args.dry_run),
               "sco": lambda: sco(cfg, dev, clock), "host": lambda: host(cfg, clock, args.dry_run, out)}
    done_shares = 0.0
    for name in sections:
        clock.spare = done_shares * args.budget_s - (time.perf_counter() - clock.t0)
        done_shares += SHARES[name]
        t0 = time.perf_counter()
        log(f"== {name} (left {clock.left():.0f} s)")
        try:
            doc[name] = runners[name]()
        except Exception as err:  # noqa: BLE001 - one broken section must not lose the others
            import traceback

            traceback.print_exc()
            doc["failed"][name] = f"{type(err).__name__}: {err}"
        doc["section_s"][name] = time.perf_counter() - t0
        doc["wall_s"] = time.perf_counter() - clock.t0
        write_json(out / "coverage.json", doc)
        if cuda:
            torch.cuda.empty_cache()
    log(f"wrote {out / 'coverage.json'} in {doc['wall_s']:.1f} s; skipped {len(clock.skipped)}, "
        f"failed {list(doc['failed'])}")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
