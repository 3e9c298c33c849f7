"""Does the host's seconds per GEMM launch depend on how many distinct shapes a loop runs?

    python3 bench/host_shapes.py --out "$OUT"       # one H200, seconds
    python3 bench/host_shapes.py --smoke --out /tmp/hs

``calibration.dispatch_kernels.host_blocks`` times the expert loops at one tiny row count, so every
block's GEMMs have the same shape. In a step, each (chunk, slot) block has its own row count. This
times ``CALLS`` launches of ``torch.mm`` (and of one gated-MLP forward block) at Qwen3-30B-A3B's
widths, host clock only (the GPU is synchronised after the loop), with the row count constant,
cycling over ``FEW`` values, or distinct at every call. Writes ``host_shapes.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

H, J = 2048, 1536
CALLS = 2000
FEW = 16
ROWS = (300, 2300)


def _rows(kind: str, n: int, lo: int, hi: int) -> list[int]:
    if kind == "constant":
        return [lo + (hi - lo) // 4] * n
    if kind == "few":
        return [lo + (i % FEW) * (hi - lo) // FEW for i in range(n)]
    return [lo + (i * (hi - lo)) // n for i in range(n)]


def measure(smoke: bool) -> dict:
    import torch
    import torch.nn.functional as F

    cuda = torch.cuda.is_available() and not smoke
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    h, j, n, (lo, hi) = (64, 48, 200, (8, 200)) if smoke else (H, J, CALLS, ROWS)
    dt = torch.bfloat16
    x = torch.randn(hi, h, device=dev, dtype=dt)
    w_up = torch.randn(h, j, device=dev, dtype=dt)
    w_down = torch.randn(j // 2, h, device=dev, dtype=dt)
    sync = (lambda: torch.cuda.synchronize()) if cuda else (lambda: None)
    out = {}
    for op in ("mm", "mlp_block"):
        for kind in ("constant", "few", "distinct"):
            rows = _rows(kind, n, lo, hi)
            best = None
            for rep in range(3):
                sync()
                t0 = time.perf_counter()
                for m in rows:
                    if op == "mm":
                        torch.mm(x[:m], w_up)
                    else:
                        gu = torch.mm(x[:m], w_up)
                        g, u = gu.chunk(2, dim=1)
                        torch.mm(F.silu(g) * u, w_down)
                host = time.perf_counter() - t0
                sync()
                wall = time.perf_counter() - t0
                if rep and (best is None or host < best[0]):
                    best = (host, wall)
            out[f"{op}:{kind}"] = dict(host_us_per_call=best[0] / n * 1e6, wall_us_per_call=best[1] / n * 1e6,
                                       distinct_rows=len(set(rows)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    from calibration.io import command_line
    from planner.runtime.measure import provenance
    from planner.schema.io import write_text_atomic

    cmd = command_line("python3 bench/host_shapes.py", argv)
    doc = {"provenance": provenance(cmd), "command": cmd, "rows": measure(args.smoke)}
    lines = [f"# Host µs per launch by shape variety ({doc['provenance']['device']})", "",
             f"`{cmd}` — host instance `{doc['provenance'].get('host_instance') or 'unknown'}`", "",
             "| op | rows | distinct | host µs / call | wall µs / call |", "|---|---|---|---|---|"]
    for k, r in doc["rows"].items():
        op, kind = k.split(":")
        lines.append(f"| {op} | {kind} | {r['distinct_rows']} | {r['host_us_per_call']:.1f} | {r['wall_us_per_call']:.1f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "host_shapes.json", json.dumps(doc, indent=1))
    write_text_atomic(out / "host_shapes.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
