"""Why a launch-bound W = 1 step's time varies between runs: every timed step beside the host's state.

    python3 bench/step_spread.py --out "$OUT"             # one H200: the listed W = 1 steps, ~5 min
    python3 bench/step_spread.py --smoke --out /tmp/ss    # CPU (gloo), tiny widths: the blocks and records

Each case is ``planner validate``'s own W = 1 step (``planner.runtime.validate``: the plan truncated
to 2 layers, the allocator in the cluster's mode, the dispatch on the routing profile's plan, the
phase recorder, CUDA events around each step; on the CPU the step is called directly). It runs
``STEPS`` steps in each of three blocks: the launching thread free to run on any core
(``unpinned``, as ``planner validate`` runs it), pinned to the fastest core
(``host_cores.pinned``), and free again (so a drift in time shows as a difference between the two free
blocks). The first step of each block is not timed. Beside every timed step it records:

- ``host_s``: the main thread's CPU seconds in the step (``time.thread_time``);
- ``nivcsw``: the process's involuntary context switches in the step (the host took its cores away);
- ``steal_s``: the virtual machine's stolen seconds over all cores (``/proc/stat``);
- ``gc_s`` and ``gc_n``: the garbage collector's seconds and collections in the step (``gc.callbacks``);
- ``launch_us``: before the step, the host seconds per launch of ``PROBE_LAUNCHES`` tiny kernels;
- ``python_us``: before the step, ``host_cores``' fixed pure-Python loop (the core's speed alone);
- ``cpu``: the core the thread was on when the step started.

Before the cases, every core is timed (``host_cores.time_cores``, ``CORE_ROUNDS`` rounds).

Writes ``step_spread.json`` and ``.md`` (per case: median step of each block, the prediction, and the
probes' medians; over all cases the correlation of step time with each probe inside a case).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.runtime import host_cores  # noqa: E402

LAYERS = 2
STEPS = 5
PROBE_LAUNCHES = 2000
# name, model, stack knobs, S, gradient lifetime: the W = 1 steps of KNOWN_SLOW and a GPU-bound control
CASES = (
    ("composed-qwen3-S32768", "qwen3-30b-a3b", {}, 32768, "freed"),
    ("composed-qwen3-S65536", "qwen3-30b-a3b", {}, 65536, "freed"),
    ("composed-gptoss-S16384", "gpt-oss-20b", {}, 16384, "freed"),
    ("composed-dsv2-S16384", "deepseek-v2-lite", {}, 16384, "freed"),
    ("none-gptoss-S4096", "gpt-oss-20b", {"checkpoint": "none"}, 4096, "accumulate"),
    ("none-qwen3-S16384", "qwen3-30b-a3b", {"checkpoint": "none"}, 16384, "accumulate"),
    ("fsdp2-gptoss-S4096", "gpt-oss-20b", {"stack": "fsdp2"}, 4096, "freed"),
    ("fsdp2-qwen3-S4096", "qwen3-30b-a3b", {"stack": "fsdp2"}, 4096, "freed"),
    ("fsdp2-qwen3-S16384", "qwen3-30b-a3b", {"stack": "fsdp2"}, 16384, "freed"),
    ("fsdp2-dsv2-S4096", "deepseek-v2-lite", {"stack": "fsdp2"}, 4096, "freed"),
)
SMOKE_CASES = (("composed-qwen3-tiny", "qwen3-30b-a3b", {}, 512, "freed"),
               ("fsdp2-dsv2-tiny", "deepseek-v2-lite", {"stack": "fsdp2"}, 512, "freed"))
BLOCKS = ("unpinned", "pinned", "unpinned")
CORE_ROUNDS = 3


def proc_steal_s() -> float:
    """Stolen seconds over all cores since boot (``/proc/stat``'s eighth ``cpu`` field); 0 where absent."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / 100.0 if len(fields) > 8 else 0.0
    except OSError:
        return 0.0


class GcClock:
    """The collector's seconds and collections while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.s, self.n, self._t = 0.0, 0, None

    def __call__(self, phase, info) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        elif self._t is not None:
            self.s += time.perf_counter() - self._t
            self.n += 1
            self._t = None

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def probes(torch, device) -> dict:
    """Host seconds per tiny-kernel launch, and a fixed pure-Python loop's seconds, now."""
    x = torch.zeros(1, device=device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(PROBE_LAUNCHES):
        x.add_(1.0)
    t1 = time.perf_counter()
    sync()
    return {"launch_us": (t1 - t0) / PROBE_LAUNCHES * 1e6, "python_us": host_cores.probe_s() * 1e6,
            "cpu": _getcpu()}


def _getcpu() -> int:
    try:
        import ctypes
        return int(ctypes.CDLL(None).sched_getcpu())
    except (OSError, AttributeError):
        return -1


def spread_timer(torch, device, records: list, clock: GcClock):
    """``planner validate``'s step timer (CUDA events; wall clock on the CPU) with the host's state
    before and during each step appended to ``records``."""
    cuda = device.type == "cuda"

    def start():
        rec = probes(torch, device)
        ru0, th0, st0, g0, n0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time(), proc_steal_s(), clock.s, clock.n
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()

        def stop():
            if cuda:
                b.record()
                torch.cuda.synchronize(device)
            wall = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            rec.update(step_s=a.elapsed_time(b) / 1e3 if cuda else wall, wall_s=wall,
                       host_s=time.thread_time() - th0, nivcsw=ru1.ru_nivcsw - ru0.ru_nivcsw,
                       steal_s=proc_steal_s() - st0, gc_s=clock.s - g0, gc_n=clock.n - n0)
            records.append(rec)
            return rec["step_s"]
        return stop
    return start


def planfile(model: str, knobs: dict, S: int, smoke: bool):
    from planner.api import build_planfile
    from planner.runtime.validate_plan import truncate

    pf = truncate(build_planfile(model=model, gpus=1, seq_len=S, overrides=dict(knobs)), LAYERS).planfile
    if smoke:
        from calibration.step_host import tiny_spec
        pf = pf.model_copy(update={"model": tiny_spec(pf.model)})
    return pf


def run_case(name: str, model: str, knobs: dict, S: int, lifetime: str, torch, smoke: bool, steps: int) -> dict:
    import torch.distributed as dist

    from planner.runtime import allocator
    from planner.runtime import validate as v
    from planner.runtime.phase_recorder import CudaSource, PhaseRecorder
    from planner.runtime.validate_plan import predict

    pf = planfile(model, knobs, S, smoke)
    pred = predict(pf, lifetime, timing=True, dispatch_bound=v.COMPARED_BOUND)
    cuda = torch.cuda.is_available() and not smoke
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:
        allocator.configure(torch, pf.cluster.memory.expandable_segments)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1,
                            **({"device_id": dev} if cuda else {}))
    torch.manual_seed(v.SEED)
    step = v.build_step(pf, device=dev, grad_lifetime=lifetime)
    blocks = []
    try:
        v.plan_dispatch(step.model, pred.ctx)
        tokens, targets = v.synthetic_batch(pred.ctx, dev, torch)
        rec = PhaseRecorder(CudaSource(dev)) if cuda else (lambda *a: None)
        for mode in BLOCKS:
            records: list = []
            gc.collect()
            with GcClock() as clock, (host_cores.pinned(torch) if mode == "pinned" else contextlib.nullcontext()) as cores:
                if cuda:
                    v.run_steps(step, rec, tokens, targets, steps=steps, timer=spread_timer(torch, dev, records, clock))
                else:
                    timer = spread_timer(torch, dev, records, clock)
                    for _ in range(steps):
                        t = timer()
                        step.step(tokens, targets)
                        t()
            if cores is not None:
                blocks.append({"mode": mode, "host_cores": cores.to_json(), "steps": records[1:]})
                continue
            blocks.append({"mode": mode, "steps": records[1:]})
    finally:
        if hasattr(step, "close"):
            step.close()
        del step
        dist.destroy_process_group()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return {"name": name, "model": model, "knobs": knobs, "S": S, "lifetime": lifetime, "layers": LAYERS,
            "predicted_step_s": pred.step_s, "blocks": blocks}


def _median(block: dict, key: str) -> float:
    return statistics.median(s[key] for s in block["steps"]) if block["steps"] else float("nan")


def correlation(cases: list[dict], key: str) -> float | None:
    """Pearson's r of step time with ``key`` over every timed step, each case's values taken as
    deviations from that case's mean (so cases of different lengths can be pooled)."""
    xs, ys = [], []
    for c in cases:
        steps = [s for b in c.get("blocks", ()) for s in b["steps"]]
        if len(steps) < 2:
            continue
        mx, my = statistics.fmean(s[key] for s in steps), statistics.fmean(s["step_s"] for s in steps)
        xs += [s[key] - mx for s in steps]
        ys += [(s["step_s"] - my) / my for s in steps]
    if len(xs) < 3 or not any(xs) or not any(ys):
        return None
    return statistics.correlation(xs, ys)


def markdown(doc: dict) -> str:
    p = doc["provenance"]
    lines = [f"# W = 1 step times beside the host's state ({p['device']})", "",
             f"`{doc['command']}` — torch {p['torch']}, {p['date']}, host instance `{p.get('host_instance') or 'unknown'}`, "
             f"CPU {doc.get('cpu', '?')}", "",
             "| case | predicted s | " + " | ".join(f"{m} median s" for m in BLOCKS)
             + " | step spread (max/min) | host s (thread CPU) | gc s per step | launch µs | python µs | nivcsw | steal s |",
             "|---|---|" + "---|" * len(BLOCKS) + "---|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        if "error" in c:
            lines.append(f"| {c['name']} | failed: {c['error'][:160]} |" + " |" * (len(BLOCKS) + 7))
            continue
        B = c["blocks"]
        allsteps = [s for b in B for s in b["steps"]]
        st = [s["step_s"] for s in allsteps]
        med = lambda k, xs=allsteps: statistics.median(s[k] for s in xs)  # noqa: E731
        lines.append(f"| {c['name']} | {c['predicted_step_s'] or 0:.3f} | "
                     + " | ".join(f"{_median(b, 'step_s'):.3f}" for b in B)
                     + f" | {max(st) / min(st):.3f} | {med('host_s'):.3f} | {med('gc_s'):.4f} | {med('launch_us'):.2f} | "
                     f"{med('python_us'):.0f} | {med('nivcsw'):.0f} | {med('steal_s'):.2f} |")
    lines += ["", "Correlation of a step's time with the host's state over the timed steps, each case about its own mean: "
              + ", ".join(f"{k} r = {v:+.2f}" if v is not None else f"{k} n/a" for k, v in doc["correlation"].items())]
    return "\n".join(lines) + "\n"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU (gloo), tiny widths")
    ap.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                    help="case names (default: all): " + ", ".join(c[0] for c in CASES + SMOKE_CASES))
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per block, the first not timed (>= 2)")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: must be >= 2 (the first step of a block is not timed); give --steps {STEPS}")
    known = {c[0] for c in (SMOKE_CASES if args.smoke else CASES)}
    if args.cases and set(args.cases) - known:
        ap.error(f"--cases {' '.join(sorted(set(args.cases) - known))}: not a case of this mode; give some of "
                 + ", ".join(sorted(known)))
    import torch

    from calibration.io import command_line
    from planner.runtime.measure import error_line, provenance
    from planner.schema.io import write_text_atomic

    cases = SMOKE_CASES if args.smoke else CASES
    if args.cases:
        cases = [c for c in cases if c[0] in args.cases]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = command_line("python3 bench/step_spread.py", argv)
    rounds = [host_cores.time_cores() for _ in range(CORE_ROUNDS)]
    doc = {"provenance": provenance(cmd), "command": cmd, "cpu": cpu_model(),
           "core_probe_s": {str(c): [r[c] for r in rounds] for c in rounds[0]}, "cases": []}
    print("core probe ms: " + ", ".join(f"{c} {statistics.median(v) * 1e3:.2f}" for c, v in doc["core_probe_s"].items()),
          flush=True)
    for name, model, knobs, S, lt in cases:
        t0 = time.perf_counter()
        try:
            doc["cases"].append(run_case(name, model, knobs, S, lt, torch, args.smoke, args.steps))
        except Exception as e:  # noqa: BLE001 - one failed case must not lose the others
            doc["cases"].append(dict(name=name, error=error_line(e)))
        c = doc["cases"][-1]
        print(c.get("error") or f"{name}: " + ", ".join(f"{b['mode']} {_median(b, 'step_s'):.3f}" for b in c["blocks"])
              + f" s (predicted {c['predicted_step_s'] or 0:.3f}, {time.perf_counter() - t0:.0f} s)", flush=True)
        doc["correlation"] = {k: correlation(doc["cases"], k)
                              for k in ("host_s", "gc_s", "launch_us", "python_us", "nivcsw", "steal_s")}
        write_text_atomic(out / "step_spread.json", json.dumps(doc, indent=1))
    write_text_atomic(out / "step_spread.md", markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
