"""Bench: the expert GEMMs on zero against random activation operands, on one instance.

Usage (H200, ~1 min; CPU: ``--smoke``, tiny shapes, same code paths):

    python3 bench/gemm_operands.py --out $OUT

``bench/dispatch.py`` emulates each rank of an ``E_p > 1`` plan under the fake process group, whose
all-to-alls are no-ops: the received rows, and in backward the received gradients, are unwritten
memory, zeros when it is fresh. Every expert GEMM of such a rank then has a zero activation operand
(forward ``up = x@Wgu`` on zero ``x``, ``down`` on ``h = 0``; backward ``g_down = h.t()@go``,
``gh = go@Wd.t()``, ``g_up = x.t()@ggu``, ``gx = ggu@Wu.t()`` on zero ``go``/``ggu``), while every
calibration GEMM is timed on random operands. This bench times each role of the runtime's call
(``calibration.dispatch_kernels.gemm_layouts``' layouts, random weights) with random and with zero
activations, at shape A and B widths and the emulated ranks' block rows:

- ``roles``: each GEMM alone in the calibration's 20 ms windows (``time_rep``);
- ``stream``: the layer's expert GEMMs back to back as ``GroupedMLP`` runs them (``blocks`` blocks
  of forward up + down, then the four backward GEMMs per block), repeated for about
  ``STREAM_S`` seconds: the load of a dispatch bench step.

``zeros / random`` below 1 is the speed the emulated rows gain from their unwritten buffers.
Writes ``$OUT/gemm_operands.json`` and ``.md``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FULL = {"A": dict(H=7168, I=2048, rows=(32768, 8192), blocks=16), "B": dict(H=4096, I=4096, rows=(8192, 32768), blocks=16)}
SMOKE = {"A": dict(H=64, I=32, rows=(32, 16), blocks=2), "B": dict(H=32, I=32, rows=(16,), blocks=2)}
MIN_TIME_S = 0.02
"""Window of each role's timing (``calibration.dispatch_kernels.FULL['min_time_s']``)."""
STREAM_S = 0.5
"""Length of the back-to-back stream (CPU smoke: a hundredth)."""
DATA = ("random", "zeros")


def role_calls(r: int, H: int, I: int, zero: bool, dev, dt) -> dict:
    """``{role: ((m, n, k), callable)}`` of one block of ``r`` rows, activations zero if ``zero``."""
    import torch

    make = torch.zeros if zero else torch.randn
    x, h, go, ggu = (make(r, d, device=dev, dtype=dt) for d in (H, I, H, 2 * I))
    wu, wd = torch.randn(H, 2 * I, device=dev, dtype=dt), torch.randn(I, H, device=dev, dtype=dt)
    return {"up": ((r, 2 * I, H), lambda: x @ wu), "down": ((r, H, I), lambda: h @ wd),
            "g_down": ((I, H, r), lambda: h.t() @ go), "gh": ((r, I, H), lambda: go @ wd.t()),
            "g_up": ((H, 2 * I, r), lambda: x.t() @ ggu), "gx": ((r, H, 2 * I), lambda: ggu @ wu.t())}


def measure(shapes: dict, dev, dt, stream_s: float) -> tuple[list[dict], list[dict]]:
    """``(roles rows, stream rows)`` (module docstring)."""
    import torch

    from planner.runtime.measure import time_rep, time_reps

    roles, streams = [], []
    for shape, c in shapes.items():
        H, I = c["H"], c["I"]
        for r in c["rows"]:
            got = {}
            for data in DATA:
                calls = role_calls(r, H, I, data == "zeros", dev, dt)
                for role, ((m, n, k), fn) in calls.items():
                    got[(role, data)] = ((m, n, k), time_rep(fn, min_time_s=MIN_TIME_S, iters=3, device=dev))

                def step(calls=calls):
                    for _ in range(c["blocks"]):
                        for role in ("up", "down"):
                            calls[role][1]()
                    for _ in range(c["blocks"]):
                        for role in ("g_down", "gh", "g_up", "gx"):
                            calls[role][1]()
                one = time_reps(step, 1, iters=1, warmup=1, device=dev)
                reps = max(1, math.ceil(stream_s / one))
                streams.append(dict(shape=shape, H=H, I=I, rows=r, blocks=c["blocks"], data=data, reps=reps,
                                    step_s=time_reps(step, reps, iters=1, warmup=0, device=dev)))
                del calls
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            for role in ("up", "down", "g_down", "gh", "g_up", "gx"):
                (m, n, k), t_rand = got[(role, "random")]
                t_zero = got[(role, "zeros")][1]
                roles.append(dict(shape=shape, H=H, I=I, rows=r, role=role, m=m, n=n, k=k, random_s=t_rand,
                                  zeros_s=t_zero, zeros_over_random=t_zero / t_rand))
    return roles, streams


def markdown(roles: list[dict], streams: list[dict]) -> str:
    lines = ["| shape | rows | role | m | n | k | random ms | zeros ms | zeros / random |", "|" + "---|" * 9]
    lines += [f"| {r['shape']} | {r['rows']} | {r['role']} | {r['m']} | {r['n']} | {r['k']} | "
              f"{r['random_s'] * 1e3:.3f} | {r['zeros_s'] * 1e3:.3f} | {r['zeros_over_random']:.3f} |" for r in roles]
    lines += ["", "| shape | rows | blocks | data | calls | ms per step | zeros / random |", "|" + "---|" * 7]
    by = {(s["shape"], s["rows"], s["data"]): s["step_s"] for s in streams}
    lines += [f"| {s['shape']} | {s['rows']} | {s['blocks']} | {s['data']} | {s['reps']} | {s['step_s'] * 1e3:.2f} | "
              f"{s['step_s'] / by[(s['shape'], s['rows'], 'random')]:.3f} |" for s in streams]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU), same code paths")
    args = ap.parse_args(argv)
    import torch

    from _common import write_results

    cuda = torch.cuda.is_available() and not args.smoke
    dev = torch.device("cuda" if cuda else "cpu")
    roles, streams = measure(SMOKE if args.smoke else FULL, dev, torch.bfloat16,
                             STREAM_S if cuda else STREAM_S / 100)
    write_results(args.out, "gemm_operands", {"roles": roles, "stream": streams, "smoke": args.smoke},
                  markdown(roles, streams))
    print(markdown(roles, streams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
