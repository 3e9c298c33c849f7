"""``bench/calibrate_coverage.py``'s ``coverage.json`` → a cluster-profile fragment for ``calibration.merge``.

    python3 -m calibration.coverage COVERAGE_JSON [MORE_JSON ...] --out FRAGMENT.yaml [--chunk-curves FILE.json]
    python3 -m calibration.merge planner/profiles/clusters/h200.yaml FRAGMENT.yaml

Curves of the fragment (every one with the run's provenance, host instance included):

- ``attention_long``: one ``LongAttentionTable`` per attention variant, over the longest prefix of
  sequence lengths at which every measured head count of the variant was timed (points beyond it,
  e.g. ``S`` = 2M at one head, are named in the table's note, not used);
- ``dispatch_kernels_widths``: one ``DispatchKernelsCurve`` per measured ``(H, I, k)``;
  ``dispatch_kernels`` becomes the one at shape A's widths (``REFERENCE_WIDTHS``) when measured;
- ``cpu_adamw``, ``cpu_cast``: the host tables at the benches' parameter count;
- chunk curves: not merged. The coverage run times a point of ≥ 0.5 s by one call (its wall
  budget), where ``calibration/chunks.py`` takes the median of three windows; the profile's
  ``chunk_count`` stays the median-timed one. Every curve of the run goes to ``--chunk-curves``:
  rows of ``test_heldout_timing.py``, held out where their shape is not the profile curve's, a
  repeatability record where it is (H200, 2026-12-01: shape A at K = 10 took 1.35 s in one call
  against the profile's 0.89 s median and the dispatch bench's 0.86 s);
- ``sco``: plain checkpointing against SCO.

Sections the run skipped or failed are left out (the profile keeps its curves there). Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REFERENCE_WIDTHS = (7168, 2048, 8)
"""``(H, I, k)`` of bench shape A: the width of the profile's ``dispatch_kernels`` curve."""


def _prov(doc: dict) -> dict:
    from planner.schema.cluster import Provenance

    return {k: v for k, v in doc["provenance"].items() if k in Provenance.model_fields}


def attention_tables(sec: dict, prov: dict) -> dict:
    """``{variant: LongAttentionTable mapping}`` from the section's rows (module docstring)."""
    by: dict = {}
    for r in sec.get("rows", []):
        by.setdefault(r["variant"], []).append(r)
    out = {}
    for name, rows in by.items():
        heads = sorted({r["heads"] for r in rows})
        got = {(r["seq_len"], r["heads"]): r for r in rows}
        seqs, dropped = [], []
        for S in sorted({r["seq_len"] for r in rows}):
            if not dropped and all((S, h) in got for h in heads):
                seqs.append(S)
            else:
                dropped += [f"S={S} h={h}" for h in heads if (S, h) in got]
        if not seqs:
            continue
        r0 = rows[0]
        used = sorted({got[(S, h)]["run"] for S in seqs for h in heads if "run" in got[(S, h)]})
        runs = [sec["runs"][i] for i in used]   # combined runs: the variant's own, its provenance the last one's
        note = (f"{sec.get('note', '')}; {r0['backend']}; kv heads = heads/{max(1, r0['heads'] // r0['kv_heads'])}"
                + (f"; measured but outside the complete grid (not used): {', '.join(dropped)}" if dropped else "")
                + ("; rows of: " + "; ".join(f"{r['provenance'].get('date', '')} `{r['command']}`" for r in runs)
                   if len(runs) > 1 else ""))
        own = {k: v for k, v in runs[-1]["provenance"].items() if k in prov} if runs else prov
        out[name] = dict(status="measured", provenance=own or prov, note=note, variant=name, d_qk=r0["d_qk"],
                         d_v=r0["d_v"], window=r0.get("window"), sinks=bool(r0.get("sinks")),
                         kv_div=max(1, r0["heads"] // r0["kv_heads"]), backend=r0["backend"], seq_len=seqs,
                         heads=heads, fwd_s=[[got[(S, h)]["fwd_s"] for h in heads] for S in seqs],
                         bwd_s=[[got[(S, h)]["bwd_s"] for h in heads] for S in seqs])
    return out


def dispatch_curves(sec: dict) -> list[dict]:
    """One ``DispatchKernelsCurve`` mapping per measured width."""
    from calibration.dispatch_kernels import curve_data

    return [curve_data(w) for w in sec.get("widths", [])]


def host_tables(sec: dict, prov: dict) -> dict:
    """``cpu_adamw`` and ``cpu_cast`` mappings (``CpuAdamWTable``)."""
    if not sec.get("threads"):
        return {}
    n = int(sec["num_params"])
    common = dict(status="measured", provenance=prov, threads=list(sec["threads"]), num_params=n)
    return {"cpu_adamw": dict(common, s_per_param=list(sec["adamw_s_per_param"]), note=sec["note"].split("; casts")[0]),
            "cpu_cast": dict(common, s_per_param=list(sec["cast_s_per_param"]),
                             note=f"host bf16→fp32 copy_ then fp32→bf16 copy_ of {n} elements (pageable)")}


def combine(docs: list[dict]) -> dict:
    """One coverage document from several runs, in order: attention rows united (a later run's row
    replaces an earlier one at the same variant, ``S`` and heads; each row keeps the index of its run
    in the section's ``runs``), every other section from the last run that has it; provenance the last
    run's."""
    if len(docs) == 1:
        return docs[0]
    out = {k: v for d in docs for k, v in d.items() if k != "attention" and v}
    rows: dict = {}
    runs = []
    for d in docs:
        if not d.get("attention"):
            continue
        runs.append({"provenance": d["provenance"], "command": d["command"]})
        for r in d["attention"].get("rows", []):
            rows[(r["variant"], r["seq_len"], r["heads"])] = {**r, "run": len(runs) - 1}
    att = [d["attention"] for d in docs if d.get("attention")]
    if att:
        out["attention"] = {**att[-1], "rows": list(rows.values()), "runs": runs}
    out["provenance"] = docs[-1]["provenance"]
    return out


def fragment(doc: dict) -> tuple[dict, dict]:
    """``(profile fragment, {tag: held-out chunk curve})`` of a coverage document, validated."""
    from planner.schema.curves import Curves

    prov = _prov(doc)
    curves: dict = {}
    if doc.get("attention"):
        tables = attention_tables(doc["attention"], prov)
        if tables:
            curves["attention_long"] = tables
    if doc.get("dispatch_widths"):
        widths = dispatch_curves(doc["dispatch_widths"])
        if widths:
            curves["dispatch_kernels_widths"] = widths
            ref = [w for w in widths if (w["widths"]["H"], w["widths"]["I"], w["widths"]["k"]) == REFERENCE_WIDTHS]
            if ref:
                curves["dispatch_kernels"] = ref[0]
    if doc.get("host"):
        curves.update(host_tables(doc["host"], prov))
    held = {}
    if doc.get("chunk_curves"):
        note = doc["chunk_curves"]["note"]
        for tag, c in doc["chunk_curves"]["curves"].items():
            if not c["num_chunks"]:
                continue
            held[tag] = dict(status="measured", provenance=prov, note=note + "; points of ≥ 0.5 s timed by one call", **c)
    if doc.get("sco"):
        from calibration.sco_overlap import curve as sco_curve

        sco = sco_curve(doc["sco"], prov)
        if sco:
            curves["sco"] = sco
    Curves.model_validate(curves)   # raises on a malformed section
    return {"curves": curves}, held


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.coverage", description=__doc__.splitlines()[0])
    ap.add_argument("coverage", nargs="+", help="coverage.json of bench/calibrate_coverage.py (several: combined in order)")
    ap.add_argument("--out", required=True, help="profile fragment (YAML) to write")
    ap.add_argument("--chunk-curves", help="write the held-out chunk curves here (JSON)")
    args = ap.parse_args(argv)
    from pydantic import ValidationError

    from calibration.io import write_text_atomic, write_yaml_atomic

    try:
        doc = combine([json.loads(Path(p).read_text()) for p in args.coverage])
        frag, held = fragment(doc)
    except (OSError, ValueError, KeyError, ValidationError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"error: coverage {args.coverage!r}: {first}; fix: pass the coverage.json of "
              "bench/calibrate_coverage.py", file=sys.stderr)
        return 2
    write_yaml_atomic(args.out, frag, "--out")
    print(f"wrote {args.out}: curves {', '.join(sorted(frag['curves']))}")
    if args.chunk_curves:
        write_text_atomic(Path(args.chunk_curves), json.dumps(
            {"provenance": doc["provenance"], "note": "held-out chunk-count curves (calibration.coverage)",
             "curves": held}, indent=1) + "\n", "--chunk-curves")
        print(f"wrote {args.chunk_curves}: chunk curves {', '.join(held) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
