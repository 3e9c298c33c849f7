"""Bench: SCO and OffloadStreamAdamW against their baselines, formula vs measured.

Usage (the whole GPU run takes about 3 minutes on one H200; < 6 min with every mode):

    python3 bench/offload.py --out bench/results                  # bandwidth, SCO, optimizers
    python3 bench/offload.py --race --out bench/results           # + stream-race exactness
    python3 bench/offload.py --smoke --race --out /tmp/offload    # CPU, tiny shapes, same code paths

Modes:
- ``bw``: pinned H2D, D2H and bidirectional bandwidth (1 GiB, our ``PinnedBuffer``).
- ``sco``: 24 decoder layers × 2 checkpointed regions (``L_b = 48``), ``H = 2880``,
  ``N = 69,632``, bf16, narrow interiors (4 heads × 128, gated MLP 8192); host budget ∈
  {0, 8 GiB, 16 GiB, full}: device peak allocated/reserved, step time, pinned host bytes,
  boundaries offloaded; the ``boundaries`` formula's peak and its drop against the measured drop.
- ``opt``: OffloadStreamAdamW time per 10⁹ parameters for β ∈ {50M, 100M, 200M} × s ∈ {2, 3}
  against the host-link floor (12 B each way at the measured bidirectional rate),
  CPUOffloadAdamW at 8 and 16 threads, and GPU fused AdamW; staging and host bytes vs formula.
- ``--race``: ``torch.cuda._sleep`` on the copy and compute streams, deterministic kernels:
  SCO gradients and OffloadStreamAdamW state must stay bitwise equal to their baselines over
  100 iterations (exit code 1 otherwise).

Writes ``offload.json`` and ``offload.md`` under ``--out`` (``offload_smoke.*`` with ``--smoke``),
each with the command line, device, torch/CUDA versions and date.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import offload_opt  # noqa: E402
import offload_sco  # noqa: E402
from planner.runtime.measure import provenance, wall_time  # noqa: E402
from planner.runtime.pinned import PinnedBuffer  # noqa: E402
from planner.units import GiB, MiB  # noqa: E402


def bandwidth(device: torch.device, smoke: bool) -> dict:
    """Pinned H2D, D2H and both at once (separate streams), bytes/s per direction."""
    nbytes = 16 * MiB if smoke else GiB
    up_host, down_host = PinnedBuffer(nbytes), PinnedBuffer(nbytes)
    dev_a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev_b = torch.empty(nbytes, dtype=torch.uint8, device=device)
    cuda = device.type == "cuda"
    s1 = torch.cuda.Stream() if cuda else None
    s2 = torch.cuda.Stream() if cuda else None

    def timed(fn, iters=5):
        return wall_time(fn, iters=iters, warmup=1)

    def h2d():
        dev_a.copy_(up_host.tensor, non_blocking=True)

    def d2h():
        down_host.tensor.copy_(dev_b, non_blocking=True)

    def both():
        if cuda:
            with torch.cuda.stream(s1):
                h2d()
            with torch.cuda.stream(s2):
                d2h()
        else:
            h2d()
            d2h()

    res = {"bytes": nbytes, "h2d_Bps": nbytes / timed(h2d), "d2h_Bps": nbytes / timed(d2h),
           "bidirectional_each_way_Bps": nbytes / timed(both)}
    up_host.release()
    down_host.release()
    return res


def _markdown(doc: dict) -> str:
    p = doc["provenance"]
    lines = [f"# Offload bench ({'smoke, CPU' if doc['smoke'] else p['device']})", "",
             f"`{p['command']}` — torch {p['torch']}, CUDA {p['cuda'] or '-'}, {p['date']}", ""]
    if "bandwidth" in doc:
        bw = doc["bandwidth"]
        lines += ["## Pinned bandwidth", "", "| H2D GB/s | D2H GB/s | bidirectional GB/s each way |",
                  "|---|---|---|",
                  f"| {bw['h2d_Bps']/1e9:.1f} | {bw['d2h_Bps']/1e9:.1f} | {bw['bidirectional_each_way_Bps']/1e9:.1f} |", ""]
    if "sco" in doc:
        lines += offload_sco.markdown(doc["sco"])
    if "optimizer" in doc:
        lines += offload_opt.markdown(doc["optimizer"])
    if "race" in doc:
        r = doc["race"]
        lines += ["## Stream races (sleep-injected, deterministic kernels)", "",
                  f"- SCO: {r['sco']['bitwise_equal']}/{r['sco']['iterations']} iterations bitwise equal "
                  f"(sleep copy {r['sco']['sleep_cycles']['copy']}, compute {r['sco']['sleep_cycles']['compute']} cycles)",
                  f"- OffloadStreamAdamW: {r['optimizer']['bitwise_equal']}/{r['optimizer']['iterations']} steps bitwise "
                  f"equal to fused AdamW ({r['optimizer']['buckets']} buckets); clip norm bitwise equal to torch's "
                  f"in {r['optimizer']['clip_norm_bitwise_equal']}/{r['optimizer']['clip_norm_checks']}", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, same code paths")
    ap.add_argument("--race", action="store_true", help="also run the stream-race exactness checks")
    ap.add_argument("--modes", default="bw,sco,opt", help="comma list of bw, sco, opt")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    if args.race:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.smoke:
        print("no CUDA device: run with --smoke on a CPU", file=sys.stderr)
        return 2
    modes = set(args.modes.split(","))
    doc: dict = {"bench": "offload", "smoke": args.smoke, "provenance": provenance()}
    t0 = time.perf_counter()
    bw = bandwidth(device, args.smoke)
    doc["bandwidth"] = bw
    print(f"[bw] H2D {bw['h2d_Bps']/1e9:.1f} GB/s, D2H {bw['d2h_Bps']/1e9:.1f} GB/s, "
          f"both {bw['bidirectional_each_way_Bps']/1e9:.1f} GB/s each way", flush=True)
    if "sco" in modes:
        doc["sco"] = offload_sco.run(device, args.smoke)
    if "opt" in modes:
        doc["optimizer"] = offload_opt.run(device, args.smoke, bw)
    ok = True
    if args.race:
        doc["race"] = {"sco": offload_sco.race(device, args.smoke), "optimizer": offload_opt.race(device, args.smoke)}
        ok = all(r["bitwise_equal"] == r["iterations"] for r in doc["race"].values())
    doc["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "offload_smoke" if args.smoke else "offload"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2, default=float))
    (out / f"{stem}.md").write_text(_markdown(doc))
    print(f"wrote {out / stem}.json/.md in {doc['wall_s']:.1f} s; race exact: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
