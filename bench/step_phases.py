"""Where a composed W = 1 step's time goes, phase by phase, with its expert loops' host seconds.

    python3 bench/step_phases.py --out "$OUT"              # one H200: the nine W = 1 cases, ~5.5 min
    python3 bench/step_phases.py --smoke --out /tmp/sp     # CPU (gloo), tiny widths, same code paths

Each case is ``bench/validate.py``'s W = 1 composed step (``planner validate``'s own step, 2 layers,
routing of the plan's profile). After ``WARMUP`` steps it times:

- ``steps_s``: ``TIMED`` plain steps (CUDA events around each, as ``planner validate``);
- ``loops``: one step with the PipelinedLLEP expert loops wrapped by host clocks (no
  synchronisation): per phase the host seconds inside the forward and backward loops, the blocks
  they ran, and the seconds spent building each chunk's block index (``slot_index``, whose
  host→device copy waits for the stream);
- ``phases_s``: one step synchronised at every phase boundary (DESIGN §3.1): the seconds of each
  ``forward[r]``, ``head``, ``backward[r]`` and ``optimizer`` window, GPU work included.

Beside them: the time model's prediction of the step and its components, the blocks the dispatch
model books and the per-block host seconds the profile holds (``host_loops``), and the same
per-block host seconds measured on this instance (``calibration.dispatch_kernels.host_blocks``).
Writes ``step_phases.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("gpt-oss-20b", "qwen3-30b-a3b", "deepseek-v2-lite")
LENGTHS = (16384, 32768, 65536)
LAYERS = 2
WARMUP = 2
TIMED = 3
SMOKE = dict(models=("qwen3-30b-a3b",), lengths=(512,), warmup=1, timed=1)


class LoopClock:
    """Host seconds inside the source-residue PipelinedLLEP loops, by phase (module docstring)."""

    def __init__(self, phase: list) -> None:
        from planner.runtime import pipelined_llep_source as src

        self.src, self.phase = src, phase
        self.orig = {n: getattr(src, n) for n in ("_expert_forward", "_expert_backward", "slot_index",
                                                  "_forward_block", "_backward_block")}
        self.s: dict = {}

    def _add(self, key: str, dt: float, n: int = 1) -> None:
        d = self.s.setdefault(self.phase[0], {})
        d[key] = d.get(key, 0.0) + dt
        d[key + "_calls"] = d.get(key + "_calls", 0) + n

    def _timed(self, name: str, key: str):
        f = self.orig[name]

        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self._add(key, time.perf_counter() - t)
        return g

    def __enter__(self):
        for name, key in (("_expert_forward", "loop_fwd"), ("_expert_backward", "loop_bwd"),
                          ("slot_index", "slot_index")):
            setattr(self.src, name, self._timed(name, key))
        for name, key in (("_forward_block", "fwd_block"), ("_backward_block", "bwd_block")):
            f = self.orig[name]

            def g(*a, _f=f, _k=key, **k):
                self._add(_k, 0.0)
                return _f(*a, **k)
            setattr(self.src, name, g)
        return self

    def __exit__(self, *exc):
        for name, f in self.orig.items():
            setattr(self.src, name, f)


def predicted(pf):
    from planner.runtime.validate import COMPARED_BOUND
    from planner.runtime.validate_plan import predict

    return predict(pf, "freed", timing=True, dispatch_bound=COMPARED_BOUND)


def run_case(model: str, S: int, c: dict, torch) -> dict:
    from planner.api import build_planfile
    from planner.runtime import validate as v
    from planner.runtime.validate_plan import truncate

    pf = truncate(build_planfile(model=model, gpus=1, seq_len=S), LAYERS).planfile
    if c.get("tiny"):
        from calibration.step_host import tiny_spec
        pf = pf.model_copy(update={"model": tiny_spec(pf.model)})
    pred = predicted(pf)
    cuda = torch.cuda.is_available() and not c.get("tiny")
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    if cuda:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    torch.manual_seed(v.SEED)
    step = v.build_step(pf, device=dev, grad_lifetime="freed")
    phase = ["embedding"]
    marks: list = []
    try:
        v.plan_dispatch(step.model, pred.ctx)
        tokens, targets = v.synthetic_batch(pred.ctx, dev, torch)

        def on_phase(name, r):
            phase[0] = f"{name}[{r}]" if r else name

        step.on_phase = on_phase
        for _ in range(c["warmup"]):
            step.step(tokens, targets)
        sync()
        times = []
        for _ in range(c["timed"]):
            t0 = time.perf_counter()
            step.step(tokens, targets)
            sync()
            times.append(time.perf_counter() - t0)
        with LoopClock(phase) as clock:
            phase[0] = "embedding"
            t0 = time.perf_counter()
            step.step(tokens, targets)
            sync()
            loops_step = time.perf_counter() - t0

        def synced(name, r):
            sync()
            marks.append((phase[0], time.perf_counter()))
            on_phase(name, r)

        step.on_phase = synced
        phase[0] = "embedding"
        t0 = time.perf_counter()
        step.step(tokens, targets)
        sync()
        marks.append((phase[0], time.perf_counter()))
        phases, t = {}, t0
        for label, t1 in marks:
            phases[label] = phases.get(label, 0.0) + t1 - t
            t = t1
    finally:
        del step
        dist.destroy_process_group()
    comps = pred.step_components
    return dict(model=model, S=S, layers=LAYERS, steps_s=times, step_s=statistics.median(times),
                loops_step_s=loops_step, loops=clock.s, phases_s=phases, synced_step_s=sum(phases.values()),
                predicted_step_s=pred.step_s, predicted_components_s=comps,
                num_chunks=int(pred.ctx.num_chunks), num_experts=int(pred.ctx.model.num_experts))


def markdown(doc: dict) -> str:
    lines = [f"# Composed W = 1 step by phase ({doc['provenance']['device']})", "",
             f"`{doc['command']}` — torch {doc['provenance']['torch']}, {doc['provenance']['date']}, host instance "
             f"`{doc['provenance'].get('host_instance') or 'unknown'}`", "",
             "| model | S | c | step s (plain) | predicted s | synced step s | loops host s (fwd / bwd) | blocks (fwd / bwd) "
             "| µs/block (fwd / bwd) | slot_index s | phases s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["cases"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['S']} | | failed: {r['error'][:120]} | | | | | | | |")
            continue
        L = r["loops"].values()
        f = sum(d.get("loop_fwd", 0.0) for d in L)
        b = sum(d.get("loop_bwd", 0.0) for d in L)
        nf = sum(d.get("fwd_block_calls", 0) for d in L)
        nb = sum(d.get("bwd_block_calls", 0) for d in L)
        si = sum(d.get("slot_index", 0.0) for d in L)
        ph = ", ".join(f"{k} {v:.3f}" for k, v in r["phases_s"].items())
        lines.append(f"| {r['model']} | {r['S']} | {r['num_chunks']} | {r['step_s']:.3f} | {r['predicted_step_s'] or 0:.3f} | "
                     f"{r['synced_step_s']:.3f} | {f:.3f} / {b:.3f} | {nf} / {nb} | "
                     f"{(f / nf * 1e6 if nf else 0):.1f} / {(b / nb * 1e6 if nb else 0):.1f} | {si:.3f} | {ph} |")
    hb = doc.get("host_blocks")
    if hb:
        lines += ["", "Host seconds per block on this instance (`calibration.dispatch_kernels.host_blocks`), µs: "
                  + ", ".join(f"{k} {v['s_per_block'] * 1e6:.1f}" for k, v in hb.items() if "s_per_block" in v)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU (gloo), tiny widths, same code paths")
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--lengths", nargs="+", type=int, default=None)
    args = ap.parse_args(argv)
    import torch

    from calibration.io import command_line
    from planner.runtime.measure import error_line, provenance
    from planner.schema.io import write_text_atomic

    c = dict(SMOKE, tiny=True) if args.smoke else dict(models=MODELS, lengths=LENGTHS, warmup=WARMUP, timed=TIMED)
    models, lengths = args.models or c["models"], args.lengths or c["lengths"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = command_line("python3 bench/step_phases.py", argv)
    doc = {"provenance": provenance(cmd), "command": cmd, "cases": []}
    for S in lengths:
        for m in models:
            try:
                doc["cases"].append(run_case(m, S, c, torch))
            except Exception as e:  # noqa: BLE001 - one failed case must not lose the others
                doc["cases"].append(dict(model=m, S=S, error=error_line(e)))
            r = doc["cases"][-1]
            print(r.get("error") or f"{m} S={S}: {r['step_s']:.3f} s (predicted {r['predicted_step_s'] or 0:.3f})",
                  flush=True)
            write_text_atomic(out / "step_phases.json", json.dumps(doc, indent=1))
    from calibration.dispatch_kernels import FULL, SMOKE as KS, host_blocks
    dev = torch.device("cuda") if torch.cuda.is_available() and not args.smoke else torch.device("cpu")
    doc["host_blocks"] = host_blocks(KS if args.smoke else FULL, dev, torch.bfloat16)
    write_text_atomic(out / "step_phases.json", json.dumps(doc, indent=1))
    write_text_atomic(out / "step_phases.md", markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
