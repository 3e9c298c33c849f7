"""Where each phase's peak comes from on a GPU: ``planner validate``'s own step run under the CUDA
allocator's history recorder, and the live blocks at every phase's peak grouped by the planner
source line that allocated them.

    python3 bench/memory_snapshot.py --out "$OUT"                  # on the GPU
    python3 bench/memory_snapshot.py --out "$OUT" --case qwen3-W1  # one case

The step is the command's (``planner.runtime.validate.validate``); the recorder marks every phase
boundary with a one-byte allocation made from ``_phase_marker``, so the replay of the allocator's
trace splits the last step into the phases of DESIGN §3.1. For every phase it writes the live
bytes at the phase's peak, grouped by the innermost ``planner/`` frame (and the two frames above
it), beside the planner's predicted rows. Writes ``<case>.json`` under ``--out``; nothing here
changes what ``validate`` measures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.api import build_planfile  # noqa: E402
from planner.runtime.validate_plan import truncate  # noqa: E402

LAYERS = 2
STEPS = 2
TOP = 40
"""Groups kept per phase."""
LARGEST = 24
"""Block sizes kept per group (largest first)."""
MAX_ENTRIES = 3_000_000
# name: model, W, S, overrides, lifetime
CASES = {
    "gptoss-W8-S131072": ("gpt-oss-20b", 8, 131072, {}, "freed"),
    "qwen3-W1-S65536": ("qwen3-30b-a3b", 1, 65536, {}, "freed"),
    "gptoss-W1-S16384": ("gpt-oss-20b", 1, 16384, {}, "freed"),
    "qwen3-W1-S16384": ("qwen3-30b-a3b", 1, 16384, {}, "freed"),
    "dsv2-W1-S16384": ("deepseek-v2-lite", 1, 16384, {}, "freed"),
    "dsv2-W1-S65536": ("deepseek-v2-lite", 1, 65536, {}, "freed"),
    "qwen3-W64-S131072": ("qwen3-30b-a3b", 64, 131072, {}, "freed"),
    "qwen3-W8-S131072": ("qwen3-30b-a3b", 8, 131072, {}, "freed"),
    "fsdp2-qwen3-W8-selective": ("qwen3-30b-a3b", 8, 16384, {"stack": "fsdp2", "ac": "selective"}, "accumulate"),
    "fsdp2-qwen3-W8-none": ("qwen3-30b-a3b", 8, 8192, {"stack": "fsdp2", "ac": "none"}, "freed"),
    "fsdp2-qwen3-W8-chunked": ("qwen3-30b-a3b", 8, 32768, {"stack": "fsdp2", "head": "chunked"}, "freed"),
    "fsdp2-gptoss-W32-full": ("gpt-oss-20b", 32, 32768, {"stack": "fsdp2"}, "freed"),
    "fsdp2-dsv2-W64-full": ("deepseek-v2-lite", 64, 32768, {"stack": "fsdp2"}, "accumulate"),
    "fsdp2-qwen3-W8-tp2": ("qwen3-30b-a3b", 8, 16384, {"stack": "fsdp2", "tp": 2}, "freed"),
    "fsdp2-gptoss-W8-tp8": ("gpt-oss-20b", 8, 16384, {"stack": "fsdp2", "tp": 8}, "freed"),
    "fsdp2-dsv2-W1-selective": ("deepseek-v2-lite", 1, 8192, {"stack": "fsdp2", "ac": "selective"}, "freed"),
    # N = 4096 / 2048: the embedding's backward sub-steps bind backward[1] (validate_expandable.json)
    "gptoss-W8-S32768": ("gpt-oss-20b", 8, 32768, {}, "freed"),
    "gptoss-W64-S32768": ("gpt-oss-20b", 64, 32768, {}, "freed"),
    "dsv2-W64-S32768": ("deepseek-v2-lite", 64, 32768, {}, "freed"),
    "fsdp2-dsv2-W1-S4096": ("deepseek-v2-lite", 1, 4096, {"stack": "fsdp2"}, "freed"),
    "fsdp2-dsv2-W8-S393216-cp8": ("deepseek-v2-lite", 8, 393216, {"stack": "fsdp2", "cp": 8}, "accumulate"),
    "fsdp2-dsv2-W8-S262144-cp8-selective": ("deepseek-v2-lite", 8, 262144,
                                            {"stack": "fsdp2", "cp": 8, "ac": "selective"}, "freed"),
    "fsdp2-dsv2-W8-S262144-cp8-alltoall": ("deepseek-v2-lite", 8, 262144,
                                           {"stack": "fsdp2", "cp": 8, "cp_rotate": "alltoall"}, "freed"),
    "fsdp2-qwen3-W8-cp8": ("qwen3-30b-a3b", 8, 131072,
                           {"stack": "fsdp2", "cp": 8, "cpu_offload": True, "cp_rotate": "allgather"}, "freed"),
    # the misses of bench/validate_heldout.py --round 4 (tests/runtime/test_validate_table.py lists them)
    "gptoss-W16-S32768-per-layer": ("gpt-oss-20b", 16, 32768, {"checkpoint": "per_layer"}, "freed"),
    "qwen3-W8-S32768-llep": ("qwen3-30b-a3b", 8, 32768, {"dispatch": "llep"}, "freed"),
    "dsv2-W8-S8192-no-checkpoint": ("deepseek-v2-lite", 8, 8192, {"checkpoint": "none"}, "freed"),
    "fsdp2-gptoss-W32-S32768-hsdp4-selective": ("gpt-oss-20b", 32, 32768,
                                                {"stack": "fsdp2", "dp_replicate": 4, "ac": "selective"}, "accumulate"),
    # held-out round 5: no checkpointing with sinks and sliding windows (D = 8), at D = 1, under standard EP
    "gptoss-W8-S16384-none": ("gpt-oss-20b", 8, 16384, {"checkpoint": "none"}, "freed"),
    "qwen3-W1-S8192-none": ("qwen3-30b-a3b", 1, 8192, {"checkpoint": "none"}, "freed"),
    "gptoss-W8-S16384-none-ep": ("gpt-oss-20b", 8, 16384, {"checkpoint": "none", "dispatch": "ep"}, "freed"),
    "qwen3-W8-S32768-none": ("qwen3-30b-a3b", 8, 32768, {"checkpoint": "none"}, "accumulate"),
    "dsv2-W1-S8192-none": ("deepseek-v2-lite", 1, 8192, {"checkpoint": "none"}, "freed"),
    # held-out round 6: no checkpointing at shapes round 5's fixes were not read from
    "gptoss-W16-S32768-none": ("gpt-oss-20b", 16, 32768, {"checkpoint": "none"}, "accumulate"),
    "dsv2-W32-S32768-none": ("deepseek-v2-lite", 32, 32768, {"checkpoint": "none"}, "accumulate"),
    # the none rows nearest the bounds (rounds 5 and 6): LLEP at W = 64, LLEP / standard EP / the
    # destination residue's MoE backward, gpt-oss-20b's W = 1 forward
    "gptoss-W64-S16384-none-llep": ("gpt-oss-20b", 64, 16384, {"checkpoint": "none", "dispatch": "llep"}, "accumulate"),
    "qwen3-W8-S16384-none-llep": ("qwen3-30b-a3b", 8, 16384, {"checkpoint": "none", "dispatch": "llep"}, "accumulate"),
    "qwen3-W8-S32768-none-ep": ("qwen3-30b-a3b", 8, 32768, {"checkpoint": "none", "dispatch": "ep"}, "freed"),
    "dsv2-W8-S16384-none-destination": ("deepseek-v2-lite", 8, 16384,
                                        {"checkpoint": "none", "dispatch_residue": "destination"}, "freed"),
    "gptoss-W1-S8192-none": ("gpt-oss-20b", 1, 8192, {"checkpoint": "none"}, "freed"),
    # held-out round 8's W = 1 MoE backward rows under without checkpointing
    "gptoss-W1-S32768-none": ("gpt-oss-20b", 1, 32768, {"checkpoint": "none"}, "freed"),
    "qwen3-W1-S32768-none": ("qwen3-30b-a3b", 1, 32768, {"checkpoint": "none"}, "accumulate"),
    "dsv2-W1-S131072-none": ("deepseek-v2-lite", 1, 131072, {"checkpoint": "none"}, "freed"),
    "dsv2-W8-S393216-none": ("deepseek-v2-lite", 8, 393216, {"checkpoint": "none"}, "accumulate"),
}

_labels: list[tuple[str, int]] = []
"""(phase label, address of its marker block) in call order."""


MARK_BYTES = 997 * 512
"""A marker block's size: one no other tensor of these steps has (0.5 MB, allocated and freed at
once, so it moves no phase's peak by more than 0.01%)."""


def _phase_marker(torch, label: str) -> None:
    t = torch.empty(MARK_BYTES, dtype=torch.uint8, device="cuda")
    _labels.append((label, t.data_ptr()))
    del t


def _install_markers(torch) -> None:
    from planner.runtime import phase_recorder as pr

    cls = pr.PhaseRecorder
    if getattr(cls, "_marked", False):
        return
    start, call, finish = cls.start, cls.__call__, cls.finish

    def m_start(self):
        _phase_marker(torch, "step_start")
        start(self)

    def m_call(self, name, r=None):
        _phase_marker(torch, f"{name}[{r}]" if r is not None else name)
        call(self, name, r)

    def m_finish(self):
        _phase_marker(torch, "step_end")
        return finish(self)

    cls.start, cls.__call__, cls.finish, cls._marked = m_start, m_call, m_finish, True


def _site(frames: list[dict]) -> str:
    mine = [f for f in frames if "/planner/" in f.get("filename", "")]
    if not mine:  # an autograd-thread allocation has C++ frames only (``--stacks all``)
        op = next((f["name"] for f in frames if "Backward" in f.get("name", "") and "apply" in f.get("name", "")),
                  None) or next((f["name"] for f in frames if "at::native::" in f.get("name", "")), None)
        if op is not None:
            return f"<c++> {op[:160]}"
        top = frames[0] if frames else {}
        return f"<torch> {Path(top.get('filename', '?')).name}:{top.get('line', 0)} {top.get('name', '?')}"
    return " < ".join(f"{f['filename'].split('/planner/')[-1]}:{f['line']} {f['name']}" for f in mine[:3])


def _replay(events, free_action):
    """Yield (index, event, live, total) over the allocator's trace."""
    live: dict[int, tuple[int, list]] = {}
    total = 0
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
        elif e["action"] == free_action and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
        yield i, e, live, total


def analyse(snap: dict, labels: list[tuple[str, int]]) -> dict:
    """Replay the allocator's trace; per phase of the last step, the live bytes at its peak by site."""
    events = [e for dev in snap["device_traces"] for e in dev]
    free_action = "free_requested" if any(e["action"] == "free_requested" for e in events) else "free_completed"
    marks, totals = [], []
    for i, e, _, total in _replay(events, free_action):
        totals.append(total)
        if (e["action"] == "alloc" and len(marks) < len(labels) and e["addr"] == labels[len(marks)][1]
                and e["size"] == MARK_BYTES):
            marks.append(i)
    if len(marks) != len(labels):
        return {"error": f"{len(marks)} markers for {len(labels)} labels"}
    last = max(i for i, (lab, _) in enumerate(labels) if lab == "step_start")
    bounds = [(lab, m) for (lab, _), m in zip(labels[last:], marks[last:])]
    peaks = {}
    for j in range(len(bounds) - 1):
        lab, lo, hi = bounds[j][0], bounds[j][1], bounds[j + 1][1]
        k = max(range(lo + 2, hi) if hi > lo + 2 else range(lo, hi), key=totals.__getitem__)  # after the marker
        peaks[k] = lab
    out = {}
    for i, _, live, total in _replay(events, free_action):
        if i in peaks:
            groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            sizes: dict[str, list[int]] = defaultdict(list)
            for size, frames in live.values():
                site = _site(frames)
                g = groups[site]
                g[0] += size
                g[1] += 1
                sizes[site].append(size)
            top = sorted(groups.items(), key=lambda kv: -kv[1][0])[:TOP]
            out[peaks[i]] = {"peak_bytes": total, "event": i,
                             "groups": [{"site": s, "bytes": b, "blocks": n,
                                         "largest_blocks": sorted(sizes[s], reverse=True)[:LARGEST]}
                                        for s, (b, n) in top]}
    return out


def run(name: str, out: Path, stacks: str = "python") -> dict:
    import torch

    from planner.runtime import validate as v

    model, W, S, ov, lt = CASES[name]
    pf = truncate(build_planfile(model=model, gpus=W, seq_len=S, overrides=ov or None), LAYERS).planfile
    _labels.clear()
    _install_markers(torch)
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, context="alloc", stacks=stacks)
    t0 = time.perf_counter()
    try:
        o = v.validate(pf, steps=STEPS, grad_lifetime=lt)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    res = {"case": name, "model": model, "W": W, "S": S, "overrides": ov, "lifetime": lt,
           "wall_s": time.perf_counter() - t0, "validate": o.to_json(), "phases": analyse(snap, list(_labels))}
    del snap
    (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/snapshots"))
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--stacks", choices=("python", "all"), default="python",
                    help="all: C++ frames too, which name the autograd node of a backward allocation (slower)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for name in args.case or list(CASES):
        if time.perf_counter() - t0 > args.budget_s:
            print(f"{name}: skipped (time budget)", flush=True)
            continue
        try:
            r = run(name, out, args.stacks)
            print(f"{name}: {r['wall_s']:.1f} s, phases {len(r['phases'])}", flush=True)
        except Exception as e:  # noqa: BLE001 - record and go on
            print(f"{name}: error {type(e).__name__}: {str(e)[:300]}", flush=True)
            (out / f"{name}.error.txt").write_text(f"{type(e).__name__}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
