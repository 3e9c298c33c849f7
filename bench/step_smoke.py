"""Smoke test of the composed step on one GPU: a few steps of truncated shipped models, the peak
allocated / reserved bytes per phase (DESIGN §3.1) from the allocator's counters, and step time.

    python bench/step_smoke.py --out $OUT            # on the GPU (W = 1, real NCCL group of one)
    python bench/step_smoke.py --dry-run --out /tmp  # on the CPU: tiny widths, gloo, same code path

Writes ``$OUT/step_smoke.json``: per (model, operator set) the losses, step times and per-phase peaks
(``forward[r]``, ``head``, ``backward[r]``, ``optimizer``) of the last step. This is a smoke test
(does every family and operator set run on the flash / efficient kernels, and what does it take),
not the validation of the budget (``planner validate``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

MODELS = ("gpt-oss-20b", "qwen3-30b-a3b", "deepseek-v2-lite")
OPERATOR_SETS = {
    "pipelined_llep+ring_dtp+sco+stream_offload": dict(dispatch="pipelined_llep", vocab="ring_dtp",
                                                       checkpoint="sco", optimizer="stream_offload"),
    "ep+dense+per_layer+gpu": dict(dispatch="ep", vocab="dense", checkpoint="per_layer", optimizer="gpu"),
}
LAYERS, SEQ_LEN, STEPS = 2, 4096, 3
DRY = dict(hidden_size=64, vocab_size=512, num_heads=4, num_kv_heads=2, expert_ffn=32, dense_ffn=96,
           shared_expert_ffn=48)
"""Width overrides of ``--dry-run`` (heads and ranks shrunk to match)."""


def _spec(name: str, dry: bool):
    from planner.schema import ModelSpec
    from planner.schema.io import load_model

    spec = load_model(name)
    if not dry:
        return spec
    d = spec.model_dump()
    d.update({k: v for k, v in DRY.items() if d.get(k)} | dict(hidden_size=64, vocab_size=512,
                                                               num_experts=8, top_k=2))
    d["head_dim"] = 16
    if d["attention"] != "gqa":
        d["num_kv_heads"] = d["num_heads"] = 4
    if d["mla"]:
        d["mla"] = dict(q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
        d["head_dim"], d["v_head_dim"] = 16, 8
    if d["sliding_window"]:
        d["sliding_window"] = 16
    return ModelSpec(**d)


def one(name: str, ops: dict, dry: bool) -> dict:
    import torch

    from planner.runtime.mop import build_composed_step
    from planner.schema import PlanFile
    from planner.schema.io import load_cluster
    from planner.schema.plan import ComposedKnobs, Plan
    from planner.schema.workload import Workload

    seq = 64 if dry else SEQ_LEN
    pf = PlanFile(model=_spec(name, dry), cluster=load_cluster("h200"), workload=Workload(seq_len=seq),
                  plan=Plan(world_size=1, composed=ComposedKnobs(**ops, bucket_params=1 << 20 if dry else 100_000_000,
                                                                 sco_host_bytes=1 << 30)))
    cuda = torch.cuda.is_available() and not dry
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    step = build_composed_step(pf, num_layers=LAYERS, device=dev, dtype=None if cuda else torch.float32)
    peaks: dict = {}
    cur = ["build"]

    def on_phase(name_, r):
        if cuda:
            peaks[cur[0]] = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]
            torch.cuda.reset_peak_memory_stats()
        cur[0] = name_ if r is None else f"{name_}[{r}]"

    step.on_phase = on_phase
    g = torch.Generator().manual_seed(0)
    V = pf.model.vocab_size
    losses, times = [], []
    for _ in range(STEPS):
        t = torch.randint(0, V, (1, 1, seq + 1), generator=g).to(dev)
        peaks.clear()
        t0 = time.perf_counter()
        losses.append(float(step.step(t[..., :-1], t[..., 1:])))
        on_phase("end", None)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step.close()
    out = dict(model=name, operators=ops, layers=LAYERS, seq_len=seq, losses=losses, step_s=times,
               phase_peak_allocated_reserved_bytes=dict(peaks))
    del step
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    dry = args.dry_run or not torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29547")
    if not dry:
        torch.cuda.set_device(0)
    dist.init_process_group("gloo" if dry else "nccl", rank=0, world_size=1)
    results = []
    for name in MODELS:
        for label, ops in OPERATOR_SETS.items():
            try:
                results.append(one(name, ops, dry))
            except Exception as e:                     # record and go on: a smoke test of many cases
                results.append(dict(model=name, operators=ops, error=f"{type(e).__name__}: {e}"))
            r = results[-1]
            print(name, label, r.get("error") or f"losses {r['losses']} step_s {[round(t, 3) for t in r['step_s']]}",
                  flush=True)
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, "step_smoke.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(dry_run=dry, torch=torch.__version__, results=results), f, indent=1)
    os.replace(tmp, os.path.join(args.out, "step_smoke.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
