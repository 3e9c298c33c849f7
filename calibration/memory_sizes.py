"""The dispatch's memory-bound kernel classes at several sizes, in one process.

    python3 -m calibration.memory_sizes --out DIR            # one H200: under a minute; the largest size
                                                             # holds R·H rows at N = 65536 (~50 GB)
    python3 -m calibration.memory_sizes --smoke --out DIR    # CPU, tiny sizes, same code path
    python3 -m calibration.memory_sizes --convert JSON --out DIR   # an earlier run → fragment

``calibration.dispatch_kernels`` times every memory-bound kernel class of the operators at one size
(``R = 131072`` routes at each width) and the time model would use that rate at every size. This
runs the same kernels (``calibration.dispatch_kernels.memory``) at ``SIZES``: shape-A widths at the
calibration's ``N`` and at 4× it, and shape-B widths at two ``N``; each class's bytes/s relative to
a fused AdamW timed in the same call. Writes ``DIR/memory_sizes.json`` / ``.md`` and the fragment
``DIR/memory_sizes.yaml`` (``curves.memory_sizes``, ``planner.schema.curves.MemorySizesCurve``) for
``python3 -m calibration.merge PROFILE DIR/memory_sizes.yaml``; the time model scales each class's
rate by these points (``planner.timing.memory_sizes``).
"""

from __future__ import annotations

import time
from pathlib import Path

SIZES = (("A", dict(N=16384, H=7168, I=2048, k=8, E=128)), ("A", dict(N=65536, H=7168, I=2048, k=8, E=128)),
         ("B", dict(N=8192, H=4096, I=4096, k=4, E=64)), ("B", dict(N=32768, H=4096, I=4096, k=4, E=64)))
"""(shape, sizes) timed, in this order."""
SMOKE = (("A", dict(N=64, H=64, I=32, k=4, E=16)), ("A", dict(N=256, H=64, I=32, k=4, E=16)))


def measure(smoke: bool, command: str) -> dict:
    import torch

    from calibration.dispatch_kernels import FULL, SMOKE as KS, host_instance, memory
    from planner.runtime.measure import provenance

    cuda = torch.cuda.is_available() and not smoke
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    base = KS if smoke else FULL
    t0 = time.perf_counter()
    doc = {"provenance": {**provenance(command), "host_instance": host_instance()}, "command": command, "runs": []}
    for shape, size in (SMOKE if smoke else SIZES):
        ref, rows = memory(dict(base, **size), dev, torch.bfloat16)
        doc["runs"].append(dict(shape=shape, **size, adamw_bytes_per_s=ref, rows=rows))
        if cuda:
            torch.cuda.empty_cache()
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def curve_data(doc: dict) -> dict:
    """The ``curves.memory_sizes`` mapping (``MemorySizesCurve``) of a run's JSON document."""
    from calibration.dispatch_kernels import CLASSES

    pts = [dict(cls=r.get("cls") or CLASSES[r["kernel"]], kernel=r["kernel"], seconds=r["seconds"],
                model_bytes=r["model_bytes"], bytes_per_s=r["bytes_per_s"],
                vs_reference=r["bytes_per_s"] / run["adamw_bytes_per_s"], N=run["N"], H=run["H"], I=run["I"],
                k=run["k"]) for run in doc["runs"] for r in run["rows"]]
    sizes = ", ".join(f"{run['shape']} N={run['N']}" for run in doc["runs"])
    return dict(status="measured", provenance=doc["provenance"], points=pts,
                note=f"calibration.memory_sizes: the dispatch's memory-bound kernels at {sizes} in one process")


def fragment(doc: dict) -> dict:
    """``{"curves": {"memory_sizes": …}}``, validated."""
    from planner.schema.curves import MemorySizesCurve

    curve = MemorySizesCurve.model_validate(curve_data(doc))
    return {"curves": {"memory_sizes": curve.model_dump(mode="json")}}


def markdown(doc: dict) -> str:
    p = doc["provenance"]
    heads = [f"{r['shape']} N={r['N']}" for r in doc["runs"]]
    lines = [f"# Memory-bound kernel rates by size ({p['device']})", "",
             f"`{doc['command']}` — torch {p['torch']}, {p['date']}, host instance `{p.get('host_instance') or 'unknown'}`",
             "", "Bytes/s over the fused AdamW rate timed in the same call (the model's `vs_reference`).", "",
             "| kernel | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for i, row in enumerate(doc["runs"][0]["rows"]):
        lines.append(f"| {row['kernel']} | " + " | ".join(
            f"{r['rows'][i]['bytes_per_s'] / r['adamw_bytes_per_s']:.3f}" for r in doc["runs"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from calibration.io import (command_line, read_run, section_parser, write_measurement, write_text_atomic,
                                write_yaml_atomic)

    args = section_parser(__doc__, "memory_sizes", "tiny sizes (CPU), same code path").parse_args(argv)

    out = Path(args.out)
    if args.convert:   # the run's own JSON is left as measured; its summary and fragment are written
        doc = read_run(args.convert, "memory_sizes", ("provenance", "command", "runs"))
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "memory_sizes.md", markdown(doc))
        write_yaml_atomic(out / "memory_sizes.yaml", fragment(doc))
        print(f"wrote {out / 'memory_sizes.yaml'} (and .md) from {args.convert}")
        return 0
    doc = measure(args.smoke, command_line("python3 -m calibration.memory_sizes", argv))
    write_measurement(out, "memory_sizes", doc, markdown(doc), fragment(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
