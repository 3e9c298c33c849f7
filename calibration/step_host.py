"""Host seconds and kernel launches of the FSDP2 baseline step outside the expert loops: what a
short step adds to its GPU seconds (``planner/timing/baseline_host.py``), measured on the runtime.

    python3 -m calibration.step_host --out DIR            # one H200: ~1 min, < 2 GB
    python3 -m calibration.step_host --smoke --out DIR    # CPU (gloo), the same code paths

Writes ``DIR/step_host.json`` and ``.md`` (command line, device, torch/CUDA, date, host instance)
and the profile fragment ``DIR/step_host.yaml`` (``curves.baseline_host``,
``planner.schema.curves.BaselineHostCurve``) to fold in with
``python3 -m calibration.merge PROFILE DIR/step_host.yaml``.

What is measured: ``planner.runtime.fsdp2``'s step (the ``planner validate`` code path: W = 1 under
a real process group of one, ``fully_shard`` with bf16/fp32 ``MixedPrecisionPolicy``, per-layer
checkpointing ``ac``, fused AdamW) of each shipped validate model, truncated to ``LAYERS`` layers
as ``bench/validate_fsdp2.py`` truncates them, at **tiny widths** (``TINY``) with every structural
count kept (experts, top-k, head kinds, MLA, sinks, dense layers, the head): the GPU's kernels then
take microseconds, so each phase's wall time is the host's (Python, autograd, FSDP2's hooks, kernel
launches, the synchronous host→device index copies). Per phase window of ``on_phase`` (DESIGN §3.1)
the host seconds, and the seconds spent inside ``GroupedMLP.forward``/``backward`` (the expert
loops, which the time model already takes from ``dispatch_kernels.host_loops``) with their blocks,
so that the curve holds the host seconds **outside** the loops: per layer kind (``moe``/``dense``)
one forward and one backward (its recompute included), the head, the optimizer step (``step`` +
``zero_grad``), and the embedding before the first layer. Every expert slot gets rows
(balanced routing, ``TOKENS·k ≥ 16·E``), as at the validate shapes.

Launches: one more step (untimed) under a dispatch mode that counts the kernel-launching calls
(``launches_kernel``: views, allocations and profiler ranges left out) per phase, inside and
outside the loops; the row keeps the launches outside the loops per phase (``launches``), so that
the time model prices a launch at the phase's seconds ÷ its launches, and the loops' count checks
``planner.timing.baseline_host.loop_launches``. (On the CPU the whole step's count is within 3% of
the H200 profiler's kernel count of the same structure, ``bench/results/step_profile``.)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from calibration.launch_count import count_step

MODELS = ("qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite")
"""The shipped models of ``bench/validate_fsdp2.py``'s W = 1 cases."""
ACS = ("full", "selective", "none")
LAYERS = 2
"""``bench/validate_fsdp2.LAYERS``: DeepSeek-V2-Lite's layer 0 dense, layer 1 MoE."""
TINY = dict(hidden_size=64, vocab_size=512, expert_ffn=32)
"""Widths replaced (every count kept): the GPU's share of each phase becomes negligible."""
FULL = dict(tokens=2048, warmup=2, steps=5)
SMOKE = dict(tokens=256, warmup=1, steps=2, models=("qwen3-30b-a3b", "deepseek-v2-lite"), acs=("full", "none"))


def tiny_spec(spec):
    """``spec`` at tiny widths, its counts kept (experts, top-k, layers, head kinds)."""
    upd = dict(TINY)
    upd["dense_ffn"] = 96 if spec.dense_ffn else 0
    upd["shared_expert_ffn"] = 32 if spec.shared_expert_ffn else 0
    if spec.attention == "mla":
        upd.update(num_heads=2, num_kv_heads=2)
    else:
        upd.update(num_heads=4, num_kv_heads=2, head_dim=16)
    if spec.sliding_window:
        upd["sliding_window"] = min(spec.sliding_window, 64)
    return spec.model_copy(update=upd)


def _layer_kinds(spec, layers: int) -> list[str]:
    dense = set(spec.dense_layers)
    return ["dense" if (i in dense or not spec.num_experts) else "moe" for i in range(layers)]


class _Loops:
    """Seconds and blocks inside ``GroupedMLP.forward``/``backward``, by the current phase."""

    def __init__(self, phase: list) -> None:
        from planner.runtime import expert_mlp

        self.mod, self.phase = expert_mlp, phase
        self.s: dict = {}
        self.blocks: dict = {}
        self.inside = False
        self.orig = (expert_mlp.GroupedMLP.forward, expert_mlp.GroupedMLP.backward)

    def __enter__(self):
        f0, b0 = self.orig

        def fwd(ctx, xs, w_up, w_down, w_up_imp, w_down_imp, rows, sw):
            t = time.perf_counter()
            self.inside = True
            try:
                out = f0(ctx, xs, w_up, w_down, w_up_imp, w_down_imp, rows, sw)
            finally:
                self.inside = False
            self._add("fwd", time.perf_counter() - t, sum(1 for r in rows if r))
            return out

        def bwd(ctx, go):
            t = time.perf_counter()
            self.inside = True
            try:
                out = b0(ctx, go)
            finally:
                self.inside = False
            self._add("bwd", time.perf_counter() - t, sum(1 for r in ctx.rows if r))
            return out

        self.mod.GroupedMLP.forward, self.mod.GroupedMLP.backward = staticmethod(fwd), staticmethod(bwd)
        return self

    def _add(self, kind: str, s: float, blocks: int) -> None:
        key = (self.phase[0], kind)
        self.s[key] = self.s.get(key, 0.0) + s
        self.blocks[key] = self.blocks.get(key, 0) + blocks

    def __exit__(self, *exc):
        self.mod.GroupedMLP.forward, self.mod.GroupedMLP.backward = (staticmethod(self.orig[0]),
                                                                     staticmethod(self.orig[1]))


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure_case(model: str, ac: str, c: dict, dev) -> dict:
    """One (model, ac): per phase the median host seconds, loop seconds and loop blocks."""
    import torch

    from planner.runtime.expert_parallel import DispatchOp
    from planner.runtime.fsdp2 import build_fsdp2_step
    from planner.runtime.fsdp2_layout import Layout
    from planner.runtime.validate import _profile_plans
    from planner.schema.profiles import load_model

    spec = tiny_spec(load_model(model))
    phase = ["embedding"]
    marks: list = []

    def on_phase(name, r):
        marks.append((phase[0], time.perf_counter()))
        phase[0] = f"{name}[{r}]" if r else name

    torch.manual_seed(0)
    st = build_fsdp2_step(spec, Layout(world_size=1), 0, num_layers=LAYERS, device=dev, ac=ac,
                          param_dtype=torch.bfloat16, on_phase=on_phase)
    for d in (m for m in st.model.modules() if isinstance(m, DispatchOp)):
        _profile_plans(d, "balanced")
    T = c["tokens"]
    tok = torch.randint(spec.vocab_size, (1, T), device=dev)
    tgt = torch.randint(spec.vocab_size, (1, T), device=dev)
    runs = []
    with _Loops(phase) as loops:
        for i in range(c["warmup"] + c["steps"]):
            _sync(dev)
            marks.clear()
            loops.s.clear()
            loops.blocks.clear()
            phase[0] = "embedding"
            start = time.perf_counter()
            st.step(tok, tgt)
            _sync(dev)
            marks.append((phase[0], time.perf_counter()))
            if i < c["warmup"]:
                continue
            host, t0 = {}, start
            for label, t1 in marks:          # each mark closes the window of its label
                host[label] = host.get(label, 0.0) + (t1 - t0)
                t0 = t1
            runs.append((host, dict(loops.s), dict(loops.blocks)))
        launches, count_error = count_step(st, tok, tgt, phase, lambda: loops.inside)
    labels = list(runs[-1][0])
    out = {}
    for label in labels:
        out[label] = dict(host_s=statistics.median(r[0].get(label, 0.0) for r in runs),
                          loop_fwd_s=statistics.median(r[1].get((label, "fwd"), 0.0) for r in runs),
                          loop_bwd_s=statistics.median(r[1].get((label, "bwd"), 0.0) for r in runs),
                          fwd_blocks=runs[-1][2].get((label, "fwd"), 0), bwd_blocks=runs[-1][2].get((label, "bwd"), 0),
                          launches=launches.get((label, False)), loop_launches=launches.get((label, True), 0))
    del st
    return dict(model=model, ac=ac, tokens=T, attention=spec.attention, num_experts=int(spec.num_experts or 0),
                top_k=int(spec.top_k or 0), layer_kinds=_layer_kinds(spec, LAYERS), phases=out,
                **({"count_error": count_error} if count_error else {}))



def _start_world(dev) -> None:
    """A process group of one (``planner validate``'s W = 1 group: NCCL on a GPU, gloo on the CPU)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def measure(smoke: bool, command: str) -> dict:
    import torch
    import torch.distributed as dist

    from planner.runtime.measure import error_line, provenance

    cuda = torch.cuda.is_available() and not smoke
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    c = SMOKE if smoke else FULL
    t0 = time.perf_counter()
    _start_world(dev)
    cases, failed = [], []
    try:
        for m in c.get("models", MODELS):
            for ac in c.get("acs", ACS):
                try:
                    cases.append(measure_case(m, ac, c, dev))
                except Exception as e:  # noqa: BLE001 - a case that cannot run is reported, not fatal
                    failed.append(dict(model=m, ac=ac, error=error_line(e)))
                    print(f"step_host: {m} ac={ac} failed: {failed[-1]['error']}", file=sys.stderr)
    finally:
        dist.destroy_process_group()
    return {"provenance": provenance(command), "command": command, "shape": {k: v for k, v in c.items()},
            "tiny": TINY, "layers": LAYERS, "cases": cases, "failed": failed, "wall_s": time.perf_counter() - t0}


def row(case: dict) -> dict:
    """One ``BaselineHostRow`` of a measured case: host seconds outside the expert loops, per
    layer kind averaged over that kind's layers."""
    ph = case["phases"]

    def outside(label):
        p = ph.get(label, {})
        return max(0.0, p.get("host_s", 0.0) - p.get("loop_fwd_s", 0.0) - p.get("loop_bwd_s", 0.0))

    fwd, bwd = {}, {}
    for i, kind in enumerate(case["layer_kinds"], start=1):
        fwd.setdefault(kind, []).append(outside(f"forward[{i}]"))
        bwd.setdefault(kind, []).append(outside(f"backward[{i}]"))
    launches = {}
    if all(p.get("launches") is not None for p in ph.values()):
        per: dict = {}
        for i, kind in enumerate(case["layer_kinds"], start=1):
            per.setdefault(f"layer_fwd:{kind}", []).append(ph[f"forward[{i}]"]["launches"])
            per.setdefault(f"layer_bwd:{kind}", []).append(ph[f"backward[{i}]"]["launches"])
        launches = {k: round(statistics.fmean(v)) for k, v in per.items()}
        launches.update({k: ph[k]["launches"] for k in ("head", "optimizer", "embedding")})
    blocks = [(p["loop_fwd_s"], p["fwd_blocks"]) for p in ph.values() if p["fwd_blocks"]]
    bblocks = [(p["loop_bwd_s"], p["bwd_blocks"]) for p in ph.values() if p["bwd_blocks"]]

    def per_block(pairs):
        n = sum(b for _, b in pairs)
        return sum(s for s, _ in pairs) / n if n else 0.0
    return dict(model=case["model"], ac=case["ac"], tokens=case["tokens"], attention=case["attention"],
                num_experts=case["num_experts"], top_k=case["top_k"],
                layer_fwd_s={k: statistics.fmean(v) for k, v in fwd.items()},
                layer_bwd_s={k: statistics.fmean(v) for k, v in bwd.items()},
                head_s=outside("head"), optimizer_s=outside("optimizer"), embedding_s=outside("embedding"),
                loop_fwd_s_per_block=per_block(blocks), loop_bwd_s_per_block=per_block(bblocks), launches=launches)


def fragment(doc: dict) -> dict:
    """``{"curves": {"baseline_host": …}}``, validated."""
    from planner.schema.curves import BaselineHostCurve

    p = doc["provenance"]
    curve = BaselineHostCurve.model_validate(dict(
        status="measured", provenance=p,
        note=f"calibration.step_host: the FSDP2 baseline step at W = 1, {doc['layers']} layers, widths {doc['tiny']} "
             "(counts kept), host seconds per phase outside GroupedMLP's loops",
        rows=[row(c) for c in doc["cases"]]))
    return {"curves": {"baseline_host": curve.model_dump(mode="json")}}


def _outside_launches(case: dict) -> int:
    return sum(p.get("launches") or 0 for p in case["phases"].values())


def _per_launch_us(case: dict) -> str:
    """Host µs per launch outside the loops over the whole step ('-' where not counted)."""
    n = _outside_launches(case)
    if not n:
        return "-"
    s = sum(max(0.0, p["host_s"] - p["loop_fwd_s"] - p["loop_bwd_s"]) for p in case["phases"].values())
    return f"{s / n * 1e6:.1f}"


def markdown(doc: dict) -> str:
    p = doc["provenance"]
    lines = [f"# FSDP2 step host seconds ({p['device']})", "",
             f"`{doc['command']}` — torch {p['torch']}, CUDA {p['cuda'] or '-'}, {p['date']}, host instance "
             f"`{p['host_instance'] or 'unknown'}`, {doc['wall_s']:.1f} s", "",
             "Milliseconds outside the expert loops (loops: µs per block, forward / backward); launches outside "
             "the loops per step and µs per launch there.", "",
             "| model | ac | layer fwd | layer bwd | head | optimizer | embedding | loop µs/block | launches "
             "| µs/launch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        r = row(c)
        f = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in r["layer_fwd_s"].items())
        b = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in r["layer_bwd_s"].items())
        lines.append(f"| {r['model']} | {r['ac']} | {f} | {b} | {r['head_s'] * 1e3:.2f} | {r['optimizer_s'] * 1e3:.2f} | "
                     f"{r['embedding_s'] * 1e3:.2f} | {r['loop_fwd_s_per_block'] * 1e6:.1f} / "
                     f"{r['loop_bwd_s_per_block'] * 1e6:.1f} | {_outside_launches(c) or '-'} | {_per_launch_us(c)} |")
    for f in doc.get("failed", []):
        lines.append(f"| {f['model']} | {f['ac']} | failed: {f['error'][:120]} | | | | | | | |")
    for c in doc["cases"]:
        if c.get("count_error"):
            lines.append(f"\n{c['model']} ac={c['ac']}: launches not counted ({c['count_error'][:160]})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from calibration.io import command_line, section_parser, write_measurement

    args = section_parser(__doc__, "step_host", "CPU (gloo), fewer cases and steps, same code paths",
                          convert=False).parse_args(argv)

    out = Path(args.out)
    cmd = command_line("python3 -m calibration.step_host", argv)
    doc = measure(args.smoke, cmd)
    write_measurement(out, "step_host", doc, markdown(doc), fragment(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
