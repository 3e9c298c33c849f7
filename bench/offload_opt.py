"""Optimizer part of ``bench/offload.py``: OffloadStreamAdamW vs the host-link floor and baselines.

Θ = 10⁹ bf16 parameters in a few awkwardly sized tensors (one spans many buckets). The fp32 state
(12 GB) is pinned once and handed to each OffloadStreamAdamW configuration. Times are per step,
i.e. per 10⁹ parameters.
"""

from __future__ import annotations

import time

import torch

from planner.runtime.cpu_offload_adamw import CPUOffloadAdamW
from planner.runtime.measure import peak_memory, wall_time
from planner.runtime.offload_adamw import OffloadStreamAdamW, set_race_sleep
from planner.runtime.pinned import PinnedBuffer
from planner.units import GiB

THETA, THETA_SMOKE = 10**9, 10**6
BETAS = (50_000_000, 100_000_000, 200_000_000)
SLOTS = (2, 3)
THREADS, THREADS_SMOKE = (8, 16), (1, 2)
FLOOR_TARGET = 1.1
"""Target: within 1.1× of the host-link floor with at least 20 buckets."""
FRACTIONS = (0.31, 0.23, 0.17, 0.13, 0.09, 0.05)


def _sizes(theta: int) -> list[int]:
    sizes = [int(f * theta) + 7 * i + 3 for i, f in enumerate(FRACTIONS)]
    return sizes + [theta - sum(sizes)]


def _time(fn, iters: int, cuda: bool) -> float:
    return wall_time(fn, iters=iters)


def _pct(formula, measured) -> float | None:
    return (formula - measured) / measured * 100 if measured else None


def _overlap_model(plan, bw: dict) -> float:
    """Seconds per step if only the link binds: the first H2D and the last D2H alone (one-way
    rates), each H2D of bucket j beside the D2H of bucket j-1 (bidirectional rate); updates hidden."""
    lens = [12 * b.length for b in plan.buckets]
    pairs = sum(max(a, b) for a, b in zip(lens, lens[1:]))
    return lens[0] / bw["h2d_Bps"] + pairs / bw["bidirectional_each_way_Bps"] + lens[-1] / bw["d2h_Bps"]


def run(device: torch.device, smoke: bool, bw: dict) -> dict:
    from planner.budget.optimizer import stream_host_bytes, stream_staging_bytes

    cuda = device.type == "cuda"
    theta = THETA_SMOKE if smoke else THETA
    scale = theta / 10**9
    betas = tuple(int(b * scale) for b in BETAS)
    iters = 1 if smoke else 3
    g = torch.Generator(device=device).manual_seed(0)
    out: dict = {"theta": theta, "floor_s_per_1e9": 12 * 10**9 / bw["bidirectional_each_way_Bps"]}

    # GPU fused AdamW (fp32 params and grads on the device), the no-offload baseline
    ps = [torch.randn(n, device=device, generator=g).requires_grad_() for n in _sizes(theta)]
    for p in ps:
        p.grad = torch.randn_like(p)
    ref = torch.optim.AdamW(ps, fused=True)
    ref.step()
    out["gpu_fused_adamw_s_per_1e9"] = _time(ref.step, iters + 2, cuda) / scale
    del ps, ref
    print(f"[opt] GPU fused AdamW {out['gpu_fused_adamw_s_per_1e9']:.4f} s / 1e9 params", flush=True)
    if cuda:
        torch.cuda.empty_cache()

    params = [torch.nn.Parameter(torch.randn(n, device=device, generator=g).to(torch.bfloat16)) for n in _sizes(theta)]
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=g).to(torch.bfloat16)
    t0 = time.perf_counter()
    host = PinnedBuffer(12 * theta)
    out["pin_s"] = time.perf_counter() - t0
    rows = []
    for beta in betas:
        for s in SLOTS:
            opt = OffloadStreamAdamW(params, bucket_params=beta, staging_slots=s, host=host)
            opt.step()
            t = _time(opt.step, iters, cuda)
            row = {"bucket_params": beta, "staging_slots": s, "buckets": opt.plan.num_buckets,
                   "overlap_model_s_per_1e9": _overlap_model(opt.plan, bw) / scale,
                   "s_per_1e9": t / scale, "vs_floor": t / scale / out["floor_s_per_1e9"],
                   "staging_formula_bytes": int(stream_staging_bytes(theta, beta, s)),
                   "host_formula_bytes": int(stream_host_bytes(theta)), "host_pinned_bytes": host.nbytes}
            row["host_pct_diff"] = _pct(row["host_formula_bytes"], row["host_pinned_bytes"])
            if cuda:
                torch.cuda.empty_cache()
                pm = peak_memory(opt.step)
                row["staging_measured_bytes"] = pm.allocated_bytes - pm.allocated_before_bytes
                row["persistent_measured_bytes"] = pm.allocated_before_bytes
                row["persistent_formula_bytes"] = 4 * theta  # bf16 weights + grads
                row["staging_pct_diff"] = _pct(row["staging_formula_bytes"], row["staging_measured_bytes"])
            row["meets_target"] = None if row["buckets"] < 20 else row["vs_floor"] <= FLOOR_TARGET  # G ≥ 20 only
            rows.append(row)
            opt.close()
            print(f"[opt] stream β={beta:>11,d} s={s}: G={row['buckets']:3d} {row['s_per_1e9']:.3f} s/1e9 "
                  f"({row['vs_floor']:.2f}× floor)", flush=True)
    host.release()
    out["stream"] = rows

    cpu = CPUOffloadAdamW(params, threads=None)
    out["cpu_offload"] = []
    for threads in (THREADS_SMOKE if smoke else THREADS):
        cpu.threads = threads
        cpu.step()
        t = _time(cpu.step, 1 if smoke else 2, cuda)
        out["cpu_offload"].append({"threads": threads, "s_per_1e9": t / scale})
        print(f"[opt] CPUOffloadAdamW {threads:2d} threads: {t / scale:.3f} s/1e9", flush=True)
    cpu.close()
    return out


def race(device: torch.device, smoke: bool, iterations: int = 100) -> dict:
    """OffloadStreamAdamW vs torch fused AdamW on the same device, bitwise, with stream sleeps."""
    cuda = device.type == "cuda"
    iterations = 3 if smoke else iterations
    shapes = [(1237, 511), (4099,), (3,), (777, 1000), (2048, 1024), (97, 13, 5)]
    if smoke:
        shapes = [(37, 51), (409,), (3,), (77, 10), (97, 13, 5)]
    beta = 160 if smoke else 150_000  # G ≈ 25 either way
    g = torch.Generator(device=device).manual_seed(7)
    ours = [torch.nn.Parameter((torch.randn(s, device=device, generator=g) * 0.3).to(torch.bfloat16)) for s in shapes]
    refs = [torch.nn.Parameter(p.detach().float()) for p in ours]
    groups = lambda ps: [dict(params=ps[::2], lr=2e-3, weight_decay=0.1), dict(params=ps[1::2], lr=1e-3)]  # noqa: E731
    opt = OffloadStreamAdamW(groups(ours), bucket_params=beta, staging_slots=2)
    ref = torch.optim.AdamW(groups(refs), fused=True)
    sleep = dict(h2d=1_000_000, update=1_000_000, d2h=1_000_000) if cuda else dict(h2d=0, update=0, d2h=0)
    set_race_sleep(**sleep)
    equal = norm_equal = norms = 0
    try:
        for it in range(iterations):
            for a, b in zip(ours, refs):
                gr = (torch.randn(a.shape, device=device, generator=g) * (1 + it % 5)).to(torch.bfloat16)
                a.grad, b.grad = gr, gr.float()
            if it % 3 == 0:  # clip both by our norm; count separately whether torch's norm agrees
                n1 = opt.clip_grad_norm_(1.0)
                in_group_order = [b.grad for grp in ref.param_groups for b in grp["params"]]
                norm_equal += torch.equal(n1, torch.nn.utils.get_total_norm(in_group_order))
                norms += 1
                torch.nn.utils.clip_grads_with_norm_(refs, 1.0, n1)
            opt.step()
            ref.step()
            opt.synchronize()
            ok = True
            for a, b in zip(ours, refs):
                st, rs = opt.state[a], ref.state[b]
                ok &= torch.equal(st["master"], b.detach().cpu()) and torch.equal(a.detach(), b.detach().bfloat16())
                ok &= torch.equal(st["exp_avg"], rs["exp_avg"].cpu()) and torch.equal(st["exp_avg_sq"], rs["exp_avg_sq"].cpu())
            equal += bool(ok)
    finally:
        set_race_sleep(0, 0, 0)
        opt.close()
    print(f"[race] OffloadStreamAdamW bitwise equal in {equal}/{iterations} steps ({opt.plan.num_buckets} buckets)",
          flush=True)
    return {"iterations": iterations, "bitwise_equal": equal, "buckets": opt.plan.num_buckets,
            "sleep_cycles": sleep, "clip_norm_bitwise_equal": norm_equal, "clip_norm_checks": norms}


def markdown(res: dict) -> list[str]:
    lines = [f"## Optimizer step (Θ = {res['theta']:,} parameters; times per 10⁹)", "",
             f"- host-link floor (12 B each way at the bidirectional rate): {res['floor_s_per_1e9']:.3f} s",
             f"- GPU fused AdamW (fp32 state on the device): {res['gpu_fused_adamw_s_per_1e9']:.4f} s",
             *[f"- CPUOffloadAdamW, {c['threads']} threads: {c['s_per_1e9']:.3f} s" for c in res["cpu_offload"]],
             f"- pinning 12·Θ bytes: {res['pin_s']:.1f} s", "",
             "| β | s | G | s / 10⁹ | × floor | target | link-overlap model s | staging formula GiB | "
             "staging measured GiB | diff % | host formula GiB | host pinned GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["stream"]:
        sm = f"{r['staging_measured_bytes']/GiB:.3f}" if "staging_measured_bytes" in r else "-"
        sd = f"{r['staging_pct_diff']:+.2f}" if r.get("staging_pct_diff") is not None else "-"
        target = "n/a" if r["meets_target"] is None else r["meets_target"]
        lines.append(f"| {r['bucket_params']:,} | {r['staging_slots']} | {r['buckets']} | {r['s_per_1e9']:.3f} | "
                     f"{r['vs_floor']:.2f} | {target} | {r['overlap_model_s_per_1e9']:.3f} | "
                     f"{r['staging_formula_bytes']/GiB:.3f} | {sm} | {sd} | "
                     f"{r['host_formula_bytes']/GiB:.3f} | {r['host_pinned_bytes']/GiB:.3f} |")
    return lines + [""]
