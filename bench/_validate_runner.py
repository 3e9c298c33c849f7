"""What ``bench/validate.py`` and ``bench/validate_fsdp2.py`` share: their options, running one case
through ``planner.runtime.validate.validate`` (the command's code path) inside the wall-clock budget,
and writing ``<stem>.json`` / ``<stem>.md`` with the exit code of the whole matrix."""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

from planner.schema.io import write_text_atomic


def parser(doc: str, default_out: str, budget_s: float, steps: int) -> argparse.ArgumentParser:
    """``--out``, ``--dry-run``, ``--budget-s`` (no case starts after it) and ``--steps``."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", default_out))
    ap.add_argument("--dry-run", action="store_true", help="List the cases and predictions; run nothing.")
    ap.add_argument("--budget-s", type=_positive_seconds, default=budget_s,
                    help="no case starts after this many seconds (finite, > 0)")
    ap.add_argument("--steps", type=_steps, default=steps, help="steps per case (>= 1; the last is compared)")
    return ap


def _positive_seconds(text: str) -> float:
    import math

    v = float(text)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds > 0")
    return v


def _steps(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1 (the last step is compared)")
    return v


def write_plan(out: Path, name: str, pf, lifetime: str, steps: int) -> str:
    """Write the case's plan file under ``out/plans``; return the ``planner validate`` command."""
    import yaml

    path = out / "plans" / f"{name}.yaml"
    write_text_atomic(path, yaml.safe_dump(pf.model_dump(mode="json"), sort_keys=False))
    return f"planner validate {path} --steps {steps} --grad-lifetime {lifetime} --json"


def run_case(c: dict, pf, lifetime: str, args, t0: float) -> None:
    """Fill ``c["status"]`` (``dry run``, ``skipped (time budget)``, ``ran`` with ``result``, or
    ``error: …``: a CUDA out-of-memory is recorded as a miss) and ``c["wall_s"]``."""
    if args.dry_run:
        c["status"] = "dry run"
        return
    if time.perf_counter() - t0 > args.budget_s:
        c["status"] = "skipped (time budget)"
        return
    import torch

    from planner.runtime import validate as run
    from planner.runtime.measure import error_line

    t1 = time.perf_counter()
    fresh(torch)
    from planner.errors import InvalidPlan

    try:
        c.update(status="ran", result=run.validate(pf, steps=args.steps, grad_lifetime=lifetime).to_json())
    except InvalidPlan as e:   # refused before it ran (a plan larger than this GPU): not measured here
        c.update(status=f"skipped ({e})")
    except Exception as e:  # noqa: BLE001 - record and go on (an OOM is a miss)
        c.update(status=f"error: {error_line(e)}")
    c["wall_s"] = time.perf_counter() - t1
    fresh(torch)


def fresh(torch) -> None:
    """Start a case as a fresh process would: no tensors and no cuBLAS workspaces left by an earlier
    case (a handle's workspace persists, and the next case's step-start bytes would hold it beside
    its own: the DeepSeek-V2-Lite W = 64 FSDP2 step start was 4.8 MiB over its own inventory run
    after 7 cases, within 0.5% in a process of its own)."""
    gc.collect()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        clear()
    torch.cuda.empty_cache()


def finish(out: Path, stem: str, title: str, note: str, header: list[str], lines: list[str],
           results: list[dict], args, t0: float) -> int:
    """Write ``stem.json`` (provenance and every case) and ``stem.md`` (one line per case); exit 0
    when every case that ran is within tolerance and none failed (an out-of-memory is a miss), or on a
    dry run; else 1."""
    prov = {}
    if not args.dry_run:
        from planner.runtime.measure import provenance

        prov = provenance()
    doc = {"provenance": prov, "wall_s": time.perf_counter() - t0, "dry_run": args.dry_run, "cases": results}
    write_text_atomic(out / f"{stem}.json", json.dumps(doc, indent=1, default=str) + "\n")
    md = [f"# {title}", "", f"Command: `python3 bench/{stem}.py --out $OUT` ({doc['wall_s']:.0f} s). {note}", "",
          *header, *lines]
    write_text_atomic(out / f"{stem}.md", "\n".join(md) + "\n")
    ran = [c for c in results if c["status"] == "ran"]
    print(f"{len(ran)} of {len(results)} cases ran, {sum(c['result']['ok'] for c in ran)} within tolerance; "
          f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}")
    failed = [c for c in results if c["status"].startswith("error")]
    return 0 if args.dry_run or (ran and all(c["result"]["ok"] for c in ran) and not failed) else 1
