"""Dispatch-kernel microbenchmarks: what the dispatch time model (``planner/timing/dispatch_kernels.py``)
reads from assumptions today, measured kernel by kernel.

    python3 -m calibration.dispatch_kernels --out DIR            # one H200: ~3 min, ≤ 30 GB
    python3 -m calibration.dispatch_kernels --smoke --out DIR    # CPU, tiny shapes, same code paths
    python3 -m calibration.dispatch_kernels --convert JSON --out DIR  # an earlier run → fragment
    python3 -m calibration --sections dispatch_kernels --out FILE     # the same, as a calibration section

Writes ``DIR/dispatch_kernels.json`` and ``.md`` (command line, device, torch/CUDA, date and the
host instance: the kernel's ``boot_id``), and the profile fragment ``DIR/dispatch_kernels.yaml``
(``curves.dispatch_kernels``, ``planner.schema.curves.DispatchKernelsCurve``) to fold in with
``python3 -m calibration.merge PROFILE DIR/dispatch_kernels.yaml``. Sections:

- ``memory``: each memory-bound kernel class of the operators at shape-A widths (``H = 7168``,
  ``I = 2048``, ``k = 8``; ``R = k·N`` rows): seconds, the model's byte count, the achieved
  bytes/s and its ratio to the reference the model uses, the fused GPU AdamW step's 28 B/param
  rate, measured in the same run. The bf16 ``index_add_`` (atomic adds) is the prime suspect.
- ``gemm_layouts``: the expert GEMMs as the runtime calls them (forward ``NN``; backward
  ``h.t()@go``, ``go@Wd.t()``, ``x.t()@ggu``, ``ggu@Wu.t()``) against ``NN`` at the same
  ``(m, n, k)`` (the GEMM table is ``NN`` only), at a slot (32768 rows) and a block (3277, 410).
- ``sustained``: one bf16 GEMM in the calibration's 1 ms windows against a ~1.5 s continuous run
  (clocks under sustained power).
- ``host_blocks``: host seconds per block of ``GroupedMLP`` (forward, backward) and
  ``ExpertChunk`` (forward, recompute, backward), run from the runtime at tiny rows so that the host
  binds, and per kernel-launching call (÷ the model's launch counts); and the tiny ``torch.mm``
  loop whose floor the model reads from the GEMM table.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

FULL = dict(N=16384, H=7168, I=2048, k=8, E=128, slots=128, rows=(32768, 3277, 410), tiny=8, min_time_s=0.02)
SMOKE = dict(N=128, H=64, I=32, k=4, E=16, slots=16, rows=(32, 8), tiny=4, min_time_s=0.001)
LAUNCHES = {"grouped_fwd": 4, "grouped_bwd": 11, "chunk_fwd": 9, "chunk_recompute": 2, "chunk_bwd": 23}
"""Kernel-launching calls per block in the model (``planner.timing.dispatch_kernels.LAUNCH``)."""
SHORT_WINDOW_S = 1e-3
"""The sustained test's short windows: the GEMM table's ``min_time_s`` (``calibration.config.FULL``)."""
CLASSES = {  # kernel label → class of ``planner.schema.curves.DISPATCH_KERNEL_CLASSES``
    "gather rows, k-dup (x.index_select)": "gather_dup", "gather rows, permutation": "gather_perm",
    "index_add_ bf16, k-dup (combine)": "index_add_bf16", "index_add_ bf16, permutation": "index_add_bf16_perm",
    "index_add_ fp32, k-dup": "index_add_fp32", "index_copy_ rows": "index_copy", "zero-fill (new_zeros)": "zero",
    "route weight (y·w[:, None])": "route_weight", "row sum (sum(1))": "row_sum", "copy_ rows": "copy",
    "SiLU on gate half (strided)": "silu", "mul with up half (strided)": "mul_strided", "silu_backward": "silu_bwd",
    "cat([gg, gu·act], 1)": "cat", "weight-grad add_ (2 experts)": "add", "sort ids (send_order)": "sort",
}
"""The class each timed kernel stands for in the time model."""


def host_instance() -> str:
    """The booted kernel's id: equal on one VM instance, different across instances."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _t(fn, dev, min_time_s) -> float:
    from planner.runtime.measure import time_rep

    return time_rep(fn, min_time_s=min_time_s, iters=3, device=dev)


def memory(c: dict, dev, dt) -> tuple[float, list[dict]]:
    """``(AdamW reference bytes/s, rows)`` (module docstring)."""
    import torch

    N, H, I, k, b = c["N"], c["H"], c["I"], c["k"], 2
    R = N * k
    ids = torch.randint(0, c["E"], (R,), device=dev)
    tok = torch.div(torch.sort(ids, stable=True).indices, k, rounding_mode="floor")   # send order
    perm = torch.randperm(R, device=dev)
    x, src, y = (torch.randn(n, H, device=dev, dtype=dt) for n in (N, R, R))
    outN, outR = torch.zeros(N, H, device=dev, dtype=dt), torch.zeros(R, H, device=dev, dtype=dt)
    w = torch.rand(R, device=dev).to(dt)
    gu, act, g2 = torch.randn(R, 2 * I, device=dev, dtype=dt), torch.empty(R, I, device=dev, dtype=dt), \
        torch.randn(R, I, device=dev, dtype=dt)
    acc, upd = (torch.randn(16 * H * 2 * I // 8, device=dev, dtype=dt) for _ in range(2))
    o32, s32 = outN.float(), src.float()
    cases = {  # name: (callable, model bytes)
        "gather rows, k-dup (x.index_select)": (lambda: x.index_select(0, tok), R * (2 * H * b + 8)),
        "gather rows, permutation": (lambda: y.index_select(0, perm), R * (2 * H * b + 8)),
        "index_add_ bf16, k-dup (combine)": (lambda: outN.index_add_(0, tok, src), R * (3 * H * b + 8)),
        "index_add_ bf16, permutation": (lambda: outR.index_add_(0, perm, src), R * (3 * H * b + 8)),
        "index_add_ fp32, k-dup": (lambda: o32.index_add_(0, tok, s32), R * (3 * H * 4 + 8)),
        "index_copy_ rows": (lambda: outR.index_copy_(0, perm, src), R * (2 * H * b + 8)),
        "zero-fill (new_zeros)": (lambda: src.new_zeros(R, H), R * H * b),
        "route weight (y·w[:, None])": (lambda: y * w[:, None], R * (2 * H * b + b)),
        "row sum (sum(1))": (lambda: y.sum(1, keepdim=True), R * (H * b + b)),
        "copy_ rows": (lambda: outR.copy_(src), R * 2 * H * b),
        "SiLU on gate half (strided)": (lambda: torch.ops.aten.silu.out(gu[:, :I], out=act), R * 2 * I * b),
        "mul with up half (strided)": (lambda: torch.mul(act, gu[:, I:]), R * 3 * I * b),
        "silu_backward": (lambda: torch.ops.aten.silu_backward(g2, gu[:, :I]), R * 3 * I * b),
        "cat([gg, gu·act], 1)": (lambda: torch.cat([g2, act], 1), R * 4 * I * b),
        "weight-grad add_ (2 experts)": (lambda: acc.add_(upd), 3 * acc.numel() * b),
        "sort ids (send_order)": (lambda: torch.sort(ids, stable=True), R * 256),
    }
    p = torch.nn.Parameter(torch.randn(1 << (28 if dev.type == "cuda" else 20), device=dev))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
    t_ref = _t(opt.step, dev, c["min_time_s"])
    ref = 28 * p.numel() / t_ref
    del opt, p
    rows = []
    for name, (fn, nbytes) in cases.items():
        s = _t(fn, dev, c["min_time_s"])
        rows.append(dict(kernel=name, cls=CLASSES[name], seconds=s, model_bytes=nbytes, bytes_per_s=nbytes / s,
                         vs_adamw_rate=nbytes / s / ref, rows=R, H=H, I=I))
    return ref, rows


def gemm_layouts(c: dict, dev, dt) -> list[dict]:
    """Runtime layout vs ``NN`` at the same ``(m, n, k)`` for every expert GEMM (module docstring)."""
    import torch

    H, I = c["H"], c["I"]
    out = []
    for r in c["rows"]:
        x, h, go, ggu = (torch.randn(r, d, device=dev, dtype=dt) for d in (H, I, H, 2 * I))
        wu, wd = torch.randn(H, 2 * I, device=dev, dtype=dt), torch.randn(I, H, device=dev, dtype=dt)
        calls = {"up x@Wu": ((r, 2 * I, H), lambda: x @ wu), "down h@Wd": ((r, H, I), lambda: h @ wd),
                 "g_down h.t()@go": ((I, H, r), lambda: h.t() @ go),
                 "gh go@Wd.t()": ((r, I, H), lambda: go @ wd.t()),
                 "g_up x.t()@ggu": ((H, 2 * I, r), lambda: x.t() @ ggu),
                 "gx ggu@Wu.t()": ((r, H, 2 * I), lambda: ggu @ wu.t())}
        for name, ((m, n, kk), fn) in calls.items():
            a, bb = torch.randn(m, kk, device=dev, dtype=dt), torch.randn(kk, n, device=dev, dtype=dt)
            t_rt, t_nn = _t(fn, dev, c["min_time_s"]), _t(lambda: a @ bb, dev, c["min_time_s"])
            out.append(dict(gemm=name, m=m, n=n, k=kk, runtime_s=t_rt, nn_s=t_nn, ratio=t_rt / t_nn,
                            tflops=2.0 * m * n * kk / t_rt / 1e12))
            del a, bb
    return out


def sustained(c: dict, dev, dt) -> dict:
    """One GEMM: the calibration's 1 ms windows against a ~1.5 s continuous run (10× in smoke)."""
    import torch

    from planner.runtime.measure import time_rep, time_reps

    m, n, k = c["rows"][0], 2 * c["I"], c["H"]
    a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
    out = torch.empty(m, n, device=dev, dtype=dt)
    fn = lambda: torch.mm(a, b, out=out)  # noqa: E731
    short = time_rep(fn, min_time_s=SHORT_WINDOW_S, iters=3, device=dev)
    long_s = 1.5 if dev.type == "cuda" else 0.05
    long = time_reps(fn, max(1, math.ceil(long_s / short)), iters=1, warmup=0, device=dev)
    return dict(m=m, n=n, k=k, short_window_s=short, continuous_s=long, ratio=long / short, window_s=long_s,
                short_window_len_s=SHORT_WINDOW_S)


def _wall(fn, dev) -> float:
    from planner.runtime.measure import sync

    sync(dev)
    t0 = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t0


def host_blocks(c: dict, dev, dt) -> dict:
    """Host seconds per block of the runtime's expert loops at tiny rows (module docstring)."""
    import torch

    from planner.runtime.measure import time_rep
    from planner.runtime.expert_chunk import ExpertChunk
    from planner.runtime.expert_mlp import ExpertShard, GroupedMLP, SlotWeights

    n, r, H = c["slots"], c["tiny"], 64
    shard = ExpertShard(n, H, H, dtype=dt, device=dev)
    shard.ensure_grads()
    rows = [r] * n
    layout = [(s, [(s * r, r)]) for s in range(n)]
    x = torch.randn(n * r, H, device=dev, dtype=dt, requires_grad=True)
    w = torch.rand(n * r, device=dev, requires_grad=True)
    g = torch.randn(n * r, H, device=dev, dtype=dt)
    res = {}
    for rep in range(4):                                  # first rep warms up; the median of three
        sw = SlotWeights(shard)
        o = None

        def grouped_fwd():
            nonlocal o
            o = GroupedMLP.apply(x, shard.w_up_nHJ, shard.w_down_nIH, None, None, rows, sw)
        t = {"grouped_fwd": _wall(grouped_fwd, dev), "grouped_bwd": _wall(lambda: o.backward(g), dev)}
        with torch.no_grad():
            t["chunk_fwd"] = _wall(lambda: ExpertChunk.apply(x, w, None, None, None, layout, sw, r, False), dev)
        y = None

        def recompute():
            nonlocal y
            y = ExpertChunk.apply(x, w, None, None, None, layout, sw, r, True)
        t["chunk_recompute"] = _wall(recompute, dev)
        t["chunk_bwd"] = _wall(lambda: torch.autograd.backward(y, g), dev)
        if rep:
            for key, v in t.items():
                res.setdefault(key, []).append(v / n)
    out = {key: dict(s_per_block=sorted(v)[1], launches=LAUNCHES[key], s_per_call=sorted(v)[1] / LAUNCHES[key])
           for key, v in res.items()}
    a, b2, o2 = (torch.randn(64, 256, device=dev, dtype=dt), torch.randn(256, 256, device=dev, dtype=dt),
                 torch.empty(64, 256, device=dev, dtype=dt))
    out["tiny_mm_floor"] = dict(s_per_call=time_rep(lambda: torch.mm(a, b2, out=o2), min_time_s=1e-3, device=dev))
    return out


def markdown(doc: dict) -> str:
    p = doc["provenance"]
    lines = [f"# Dispatch-kernel microbenchmarks ({p['device']})", "",
             f"`{doc['command']}` — torch {p['torch']}, CUDA {p['cuda']}, {p['date']}, host instance "
             f"`{p['host_instance'] or 'unknown'}`", "",
             f"Reference: fused AdamW at 28 B/param = {doc['adamw_ref_bytes_per_s'] / 1e12:.3f} TB/s", "",
             "| kernel | rows | ms | model GB | GB/s | × AdamW rate |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['rows']} | {r['seconds'] * 1e3:.3f} | {r['model_bytes'] / 1e9:.3f} | "
              f"{r['bytes_per_s'] / 1e9:.0f} | {r['vs_adamw_rate']:.2f} |" for r in doc["memory"]]
    lines += ["", "| GEMM | m | n | k | runtime ms | NN ms | ratio | TFLOP/s |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['gemm']} | {r['m']} | {r['n']} | {r['k']} | {r['runtime_s'] * 1e3:.3f} | {r['nn_s'] * 1e3:.3f} | "
              f"{r['ratio']:.3f} | {r['tflops']:.0f} |" for r in doc["gemm_layouts"]]
    s = doc["sustained"]
    lines += ["", f"Sustained GEMM ({s['m']}, {s['n']}, {s['k']}): 1 ms windows {s['short_window_s'] * 1e3:.3f} ms, "
              f"{s['window_s']} s continuous {s['continuous_s'] * 1e3:.3f} ms per call (× {s['ratio']:.3f})", "",
              "| host loop | µs per block | launches | µs per call |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['s_per_block'] * 1e6:.1f} | {v['launches']} | {v['s_per_call'] * 1e6:.2f} |"
              if "s_per_block" in v else f"| {k} | — | 1 | {v['s_per_call'] * 1e6:.2f} |"
              for k, v in doc["host_blocks"].items()]
    return "\n".join(lines) + "\n"


def measure(smoke: bool, command: str) -> dict:
    """Run every section on this machine (CUDA unless ``smoke``): the JSON document."""
    import torch

    from planner.runtime.measure import provenance

    cuda = torch.cuda.is_available() and not smoke
    dev, dt = torch.device("cuda" if cuda else "cpu"), torch.bfloat16
    c = SMOKE if smoke else FULL
    t0 = time.perf_counter()
    ref, mem = memory(c, dev, dt)
    if cuda:
        torch.cuda.empty_cache()
    doc = {"provenance": {**provenance(command), "host_instance": host_instance()}, "command": command, "shape": c,
           "adamw_ref_bytes_per_s": ref, "memory": mem, "gemm_layouts": gemm_layouts(c, dev, dt),
           "sustained": sustained(c, dev, dt), "host_blocks": host_blocks(c, dev, dt)}
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def curve_data(doc: dict) -> dict:
    """The ``curves.dispatch_kernels`` mapping (``DispatchKernelsCurve``) of a run's JSON document,
    its provenance kept (runs before the ``cls`` and ``short_window_len_s`` keys: ``CLASSES`` and
    ``SHORT_WINDOW_S``)."""
    ref = doc["adamw_ref_bytes_per_s"]
    mem = {}
    for r in doc["memory"]:
        cls = r.get("cls") or CLASSES[r["kernel"]]
        mem[cls] = dict(kernel=r["kernel"], seconds=r["seconds"], model_bytes=r["model_bytes"],
                        bytes_per_s=r["bytes_per_s"], vs_reference=r["bytes_per_s"] / ref)
    gl = [dict(role=r["gemm"].split()[0], m=r["m"], n=r["n"], k=r["k"], runtime_s=r["runtime_s"], nn_s=r["nn_s"])
          for r in doc["gemm_layouts"]]
    s = doc["sustained"]
    hb = doc["host_blocks"]
    sh = doc["shape"]
    return {"status": "measured", "provenance": doc["provenance"],
            "note": f"calibration.dispatch_kernels at N={sh['N']}, H={sh['H']}, I={sh['I']}, k={sh['k']} "
                    "(memory rows: R = k·N routes of H-wide bf16 rows)",
            "reference_bytes_per_s": ref, "memory": mem, "gemm_layouts": gl,
            "sustained": dict(m=s["m"], n=s["n"], k=s["k"], short_window_s=s["short_window_s"],
                              short_window_len_s=s.get("short_window_len_s", SHORT_WINDOW_S),
                              continuous_s=s["continuous_s"], continuous_len_s=s["window_s"]),
            "host_loops": {key: dict(s_per_block=v["s_per_block"], launches=v["launches"])
                           for key, v in hb.items() if "s_per_block" in v},
            "host_call_s": hb["tiny_mm_floor"]["s_per_call"],
            "widths": dict(H=sh["H"], I=sh["I"], k=sh["k"], R=sh["N"] * sh["k"])}


def fragment(doc: dict) -> dict:
    """A profile fragment for ``calibration.merge``: ``{"curves": {"dispatch_kernels": …}}``, validated."""
    from planner.schema.curves import DispatchKernelsCurve

    curve = DispatchKernelsCurve.model_validate(curve_data(doc))
    return {"curves": {"dispatch_kernels": curve.model_dump(mode="json")}}


def main(argv: list[str] | None = None) -> int:
    from calibration.io import command_line, read_run, section_parser, write_measurement, write_yaml_atomic

    args = section_parser(__doc__, "dispatch_kernels", "tiny shapes (CPU), same code paths").parse_args(argv)

    out = Path(args.out)
    if args.convert:
        doc = read_run(args.convert, "dispatch_kernels", ("provenance", "shape", "adamw_ref_bytes_per_s", "memory",
                                                          "gemm_layouts", "sustained", "host_blocks"))
        out.mkdir(parents=True, exist_ok=True)
        write_yaml_atomic(out / "dispatch_kernels.yaml", fragment(doc))
        print(f"wrote {out / 'dispatch_kernels.yaml'} from {args.convert}")
        return 0
    cmd = command_line("python3 -m calibration.dispatch_kernels", argv)
    doc = measure(args.smoke, cmd)
    write_measurement(out, "dispatch_kernels", doc, markdown(doc), fragment(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
