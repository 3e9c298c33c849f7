"""The committed ``planner validate`` measurements held against the planner as it is now.

    python3 bench/validate_table.py                 # both stacks, markdown to stdout
    python3 bench/validate_table.py --json          # one record per case

Reads ``bench/results/validate/validate.json``, ``validate_w1.json`` and ``validate_fsdp2.json`` (H200 runs of
``bench/validate.py`` / ``bench/validate_fsdp2.py``), rebuilds every case's plan the way those
scripts do, predicts it with the current formula (``planner.runtime.validate_plan.predict``) and
compares it with the recorded measurement (``planner.runtime.validate_compare.compare``): per case
the peak, the lowest and the highest per-phase ratio, the number of judged rows within tolerance,
and the step time at W = 1. The measurements are never recomputed here: a row says which commit
measured it. Runs on any machine (no torch needed).

Every committed run predates ``bench/_validate_runner.fresh`` and ran its cases one after another in
one process, where cuBLAS keeps a handle's workspaces until ``clearCublasWorkspaces``: a case's
measurement holds the cuBLASLt workspaces an earlier case of the run allocated (gpt-oss's biased
linears) beside its own. The table takes those carried bytes (``carried_workspace_bytes``) off the
measurement, so the formula is held against what the case itself allocated.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.api.build import build_planfile  # noqa: E402
from planner.budget.build import make_context  # noqa: E402
from planner.budget.workspace import blaslt_bytes  # noqa: E402
from planner.runtime.phase_times import grouped  # noqa: E402
from planner.runtime.validate import COMPARED_BOUND, other_gpu  # noqa: E402
from planner.runtime.validate_compare import compare, memory_ok  # noqa: E402
from planner.runtime.validate_plan import predict, truncate  # noqa: E402
from planner.schema.profiles import shipped_cluster_for  # noqa: E402
from planner.units import GiB  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "validate"


class _Sample:
    def __init__(self, peak: int, start: int) -> None:
        self.peak_bytes, self.start_bytes = peak, start


def _samples(result: dict, case: str, carried: int = 0) -> tuple[dict, int]:
    """Phase samples and the step-start bytes back from a recorded ``validate --json`` (every
    committed record carries its per-phase ``measured`` samples), less ``carried`` bytes that an
    earlier case of the same process left (``carried_workspace_bytes``).

    Raises:
        ValueError: a record without measured phases (written before ``validate`` recorded them).
    """
    phases = {lab: _Sample(int(p["measured"]["peak_bytes"]) - carried, int(p["measured"]["start_bytes"]) - carried)
              for lab, p in (result.get("phases") or {}).items() if p.get("measured")}
    if not phases:
        raise ValueError(f"case {case}: the record has no measured phases; re-run it with "
                         "bench/validate.py (or bench/validate_fsdp2.py)")
    start = next((int(r["measured"]) for r in result["rows"] if r["what"] == "persistent"), 0)
    return phases, start - carried


STEMS = ("validate", "validate_w1", "validate_w1_run3", "validate_w1_run4", "validate_w1_run5", "validate_fsdp2",
         "validate_fsdp2_run2", "validate_expandable", "validate_fsdp2_expandable", "validate_w1_expandable",
         "validate_heldout", "validate_heldout_r2", "validate_heldout_r3", "validate_heldout_r4", "validate_heldout_r5",
         "validate_heldout_r6", "validate_fsdp2_run3_expandable", "validate_w1_run6_expandable",
         "validate_heldout_r5_rerun", "validate_heldout_r6_rerun", "validate_heldout_r7", "validate_heldout_r8",
         "validate_heldout_r9", "validate_heldout_r10", "validate_heldout_r11", "validate_heldout_r12",
         "validate_w1_pinned_expandable", "validate_fsdp2_pinned_expandable", "validate_w1_h100_expandable",
         "validate_fsdp2_h100_expandable", "validate_w1_h100_cal_expandable", "validate_fsdp2_h100_cal_expandable",
         "validate_w1_h100_si_expandable", "validate_w1_64k_h100_si_expandable", "validate_fsdp2_h100_si_expandable",
         "validate_w1_h200_si_expandable", "validate_fsdp2_h200_si_expandable",
         "validate_w1_h100_d700f3ef_expandable", "validate_fsdp2_h100_d700f3ef_expandable",
         "validate_w1_h100_9f4ff8ea_expandable", "validate_fsdp2_h100_9f4ff8ea_expandable")
"""The committed runs: the composed matrix, the composed W = 1 runs at three context lengths (timed
as the median of steps 2–4), the FSDP2 baseline's cases, and held-out cases of both stacks run
through the CLI (``validate_heldout``, one process each). The ``*_expandable`` and held-out runs ran
in the cluster file's allocator mode (``planner.runtime.allocator``), the others in PyTorch's
default mode."""


def _fsdp2(stem: str, c: dict | None = None) -> bool:
    """A case of the FSDP2 baseline: its own ``stack`` (``validate_heldout``), else its run's."""
    if c is not None and "stack" in c:
        return c["stack"] == "fsdp2"
    return stem.startswith("validate_fsdp2")


CARRYING_STEMS = ("validate", "validate_w1", "validate_w1_run3", "validate_w1_run4", "validate_fsdp2")
"""Runs made before ``bench/_validate_runner.fresh``: a case's measurement holds the cuBLASLt
workspaces earlier cases of the run allocated (``carried_workspace_bytes``)."""
FRESH_STEMS = tuple(s for s in STEMS if s not in CARRYING_STEMS)
"""Runs made with each case's cuBLAS workspaces cleared first (``bench/_validate_runner.fresh``):
nothing carries over between their cases."""


def carried_workspace_bytes(own: int, held: int) -> int:
    """Bytes of cuBLASLt workspace a case's measurement holds beyond its own ``own``: the process
    already holds ``held`` (the most any earlier case allocated; cuBLAS keys a workspace by handle
    and stream, the forward's and the backward's thread are the same across cases, so a later case
    reuses what is there and adds what is not)."""
    return max(0, held - own)


INSTANCE_SECTIONS = ("dispatch_kernels", "step_host")
"""The host calibrations one instance can re-run in half a minute (``--calibration``)."""
INSTANCE_ROOTS = ("calibration", "dispatch_same_instance")
"""Folders under ``bench/results`` whose subfolders ``--calibration`` names: an instance's host
calibrations (``{section}.yaml``), or a run of ``bench/dispatch_same_instance.sh`` (the sections
inside its ``measured.yaml``, which ``python3 -m calibration`` wrote on that instance)."""


def _instance_dir(folder: str) -> Path:
    if not folder or folder in (".", "..") or "/" in folder:
        raise ValueError(f"--calibration {folder!r}: must name a folder of bench/results/calibration or "
                         "bench/results/dispatch_same_instance (e.g. instance_7542d85e)")
    for root in INSTANCE_ROOTS:
        if (RESULTS.parent / root / folder).is_dir():
            return RESULTS.parent / root / folder
    raise ValueError(f"--calibration {folder!r}: no such folder under bench/results/{{{','.join(INSTANCE_ROOTS)}}}; "
                     "name one that exists (e.g. instance_7542d85e)")


def _section(d: Path, section: str) -> dict | None:
    """The fragment of one section: its own file, else its curve inside the run's ``measured.yaml``."""
    from calibration.io import read_yaml

    if (d / f"{section}.yaml").exists():
        return read_yaml(d / f"{section}.yaml")
    if (d / "measured.yaml").exists():
        curve = (read_yaml(d / "measured.yaml").get("curves") or {}).get(section)
        if isinstance(curve, dict) and curve.get("status") == "measured":
            return {"curves": {section: curve}}
    return None


@functools.lru_cache(maxsize=None)
def _instance_fragments(folder: str) -> tuple:
    d = _instance_dir(folder)
    found = tuple(f for f in (_section(d, section) for section in INSTANCE_SECTIONS) if f is not None)
    if not found:
        raise ValueError(f"--calibration {folder!r}: {d} holds none of {', '.join(INSTANCE_SECTIONS)} (as "
                         "{section}.yaml or inside measured.yaml); give a folder that does (e.g. instance_7542d85e)")
    return found


def calibration_devices(folder: str) -> set[str]:
    """The GPUs the calibration sections under ``bench/results/calibration/folder`` were measured on."""
    return {c.get("provenance", {}).get("device", "") for frag in _instance_fragments(folder)
            for c in (frag.get("curves") or {}).values() if isinstance(c, dict)} - {""}


def instance_cluster(folder: str, cluster):
    """``cluster`` with the calibration sections under ``bench/results/calibration/folder`` merged in;
    ``cluster`` unchanged when they were measured on another GPU (a run is predicted with its own
    GPU's curves only)."""
    from calibration.merge import merged

    if cluster.topology.gpu_name not in calibration_devices(folder):
        return cluster
    return merged(cluster.model_dump(mode="json"), _instance_fragments(folder))


@functools.lru_cache(maxsize=None)
def _whole_profile(path: str, base_name: str):
    """The shipped profile ``base_name`` with the profile at ``path`` merged in; None when that
    profile was measured on another GPU (read once per pair)."""
    from calibration.merge import merged
    from planner.schema.io import load_cluster

    base = load_cluster(base_name)
    measured = load_cluster(path)
    if measured.topology.gpu_name != base.topology.gpu_name:
        return None
    return merged(base.model_dump(mode="json"), [path])


def profile_cluster(path: str, cluster):
    """``cluster`` with every measured curve and constant of the profile at ``path`` (a ``planner
    calibrate`` output) merged in, as ``python3 -m calibration.merge`` merges it; ``cluster`` unchanged
    when that profile was measured on another GPU."""
    return _whole_profile(str(path), cluster.name) or cluster


def cases(stem: str, calibration: str | None = None, profile: str | None = None):
    """``(case, plan file)`` of every case that ran, in run order; each case carries
    ``carried_bytes`` (``carried_workspace_bytes``; 0 for ``FRESH_STEMS``). The plan's cluster is the
    shipped profile of the run's GPU (``shipped_cluster_for``). ``calibration``: a folder of
    ``INSTANCE_ROOTS`` whose sections are merged into every case's cluster (``instance_cluster``);
    ``profile``: a whole measured profile merged in (``profile_cluster``)."""
    doc = json.loads((RESULTS / f"{stem}.json").read_text())
    cluster = shipped_cluster_for(doc.get("provenance", {}).get("device", ""))
    held = 0
    for c in doc["cases"]:
        if c.get("status") != "ran":
            continue
        knobs = c.get("knobs") or {}   # the baseline's knobs, or a composed case's operator choices
        ov = {"stack": "fsdp2", **knobs} if _fsdp2(stem, c) else (dict(knobs) or None)
        pf = truncate(build_planfile(model=c["model"], gpus=c["W"], seq_len=c["S"], overrides=ov, cluster=cluster),
                      c["layers"]).planfile
        if calibration is not None:
            pf = pf.model_copy(update={"cluster": instance_cluster(calibration, pf.cluster)})
        if profile is not None:
            pf = pf.model_copy(update={"cluster": profile_cluster(profile, pf.cluster)})
        own = blaslt_bytes(make_context(pf.model, pf.cluster, pf.workload, pf.plan))
        carried = 0 if stem in FRESH_STEMS else carried_workspace_bytes(own, held)
        held = max(held, own)
        yield {**c, "carried_bytes": carried}, pf


def row(stem: str, c: dict, pf) -> dict:
    res = c["result"]
    pred = predict(pf, c["lifetime"], timing=c["W"] == 1, dispatch_bound=COMPARED_BOUND,   # as validate compares
                   rank=c["result"].get("rank", 0))
    carried = int(c.get("carried_bytes", 0))
    samples, start = _samples(res, c.get("name") or c["model"], carried)
    device = res.get("device", "")
    time_judged = c["W"] == 1 and not other_gpu(device, pf.cluster)   # real, on the profile's own GPU
    rows = [r for r in compare(pred, samples, start, step_s=res.get("step_s"), judge_time=time_judged)
            if r.unit == "bytes" and r.judged and r.measured]
    ratios = [r.ratio for r in rows]
    lo = min(rows, key=lambda r: r.ratio)
    hi = max(rows, key=lambda r: r.ratio)
    meas_peak = int(res["measured_peak_bytes"]) - carried
    return {"stem": stem, "stack": "fsdp2" if _fsdp2(stem, c) else "composed", "case": c.get("name") or c["model"],
            "model": c["model"], "W": c["W"], "S": c["S"], "lifetime": c["lifetime"],
            "peak_predicted": pred.peak_bytes, "peak_measured": meas_peak,
            "peak_ok_conservative": pred.peak_bytes >= meas_peak * 0.99,
            "min_ratio": min(ratios), "min_row": f"{lo.phase} {lo.what}", "max_ratio": max(ratios),
            "max_row": f"{hi.phase} {hi.what}", "rows_ok": sum(memory_ok(int(r.predicted), int(r.measured)) for r in rows),
            "rows": len(rows), "device": device, "time_judged": time_judged,
            "step_s_measured": res.get("step_s"), "step_s_predicted": pred.step_s,
            "step_components_predicted": pred.step_components, "step_phases_predicted": pred.step_phases,
            "phase_s_measured": grouped(res["measured_phase_s"]) if res.get("measured_phase_s") else None,
            "carried_bytes": carried}


def markdown(records: list[dict]) -> str:
    out = ["| stack | case | W | S | gradients | peak GiB pred / meas | lowest phase | highest phase | rows ok | step s meas / pred |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        t = (f"{r['step_s_measured']:.2f} / {r['step_s_predicted']:.2f}"
             if r["W"] == 1 and r["step_s_measured"] and r["step_s_predicted"] else "")
        if t and not r["time_judged"]:
            t += f" (on {r['device']}: not judged)"
        under = "**" if r["min_ratio"] < 0.99 else ""
        out.append(f"| {r['stack']} | {r['case']} | {r['W']} | {r['S']} | {r['lifetime']} | "
                   f"{r['peak_predicted'] / GiB:.2f} / {r['peak_measured'] / GiB:.2f} | "
                   f"{under}{r['min_ratio']:.3f}{under} ({r['min_row']}) | {r['max_ratio']:.3f} ({r['max_row']}) | "
                   f"{r['rows_ok']}/{r['rows']} | {t} |")
    return "\n".join(out)


W_GROUPS = ((1,), (4, 8), (16, 32), (64,))
"""The summary's world-size groups (every W the runs emulate)."""


def summary(records: list[dict], stack: str) -> str:
    """One line per model and W group of ``stack``'s records: the lengths, the cases, the lowest and
    highest phase ratio (with its phase) and the judged rows within both bounds."""
    out = [f"| {stack} | W | S | cases | lowest phase ratio | highest phase ratio | rows ok |",
           "|---|---|---|---|---|---|---|"]
    for ws in W_GROUPS:
        for model in sorted({r["model"] for r in records}):
            rs = [r for r in records if r["stack"] == stack and r["model"] == model and r["W"] in ws]
            if not rs:
                continue
            lo, hi = min(rs, key=lambda r: r["min_ratio"]), max(rs, key=lambda r: r["max_ratio"])
            lengths = ", ".join(f"{S // 1024}k" for S in sorted({r["S"] for r in rs}))
            out.append(f"| {model} | {', '.join(map(str, sorted({r['W'] for r in rs})))} | {lengths} | {len(rs)} | "
                       f"{lo['min_ratio']:.3f} ({lo['min_row'].replace(' phase total', '')}) | "
                       f"{hi['max_ratio']:.3f} ({hi['max_row'].replace(' phase total', '')}) | "
                       f"{sum(r['rows_ok'] for r in rs)}/{sum(r['rows'] for r in rs)} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--summary", action="store_true", help="one line per model and W group, both stacks")
    ap.add_argument("--stems", nargs="+", default=None, choices=STEMS, metavar="STEM",
                    help="runs to read (default: every committed run, STEMS)")
    ap.add_argument("--calibration", default=None, metavar="DIR",
                    help="predict with the host calibrations of bench/results/calibration/DIR (or of the "
                         "same-instance run bench/results/dispatch_same_instance/DIR) merged into the profile of "
                         "the runs made on the same GPU (e.g. instance_7542d85e, the instance of "
                         "validate_w1_pinned_expandable; h200_dec975e8, of validate_*_h200_si_expandable; runs "
                         "on another GPU keep their own profile)")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="predict with this measured profile (the output of planner calibrate on the runs' "
                         "instance) merged whole into the shipped profile of the runs made on its GPU")
    args = ap.parse_args(argv)
    if args.profile is not None and not Path(args.profile).is_file():
        ap.error(f"--profile {args.profile!r}: no such file; give the YAML that planner calibrate wrote")
    if args.calibration is not None:
        try:
            _instance_fragments(args.calibration)
        except ValueError as e:
            ap.error(str(e))
    stems = list(dict.fromkeys(args.stems or STEMS))
    recs = [row(stem, c, pf) for stem in stems for c, pf in cases(stem, args.calibration, args.profile)]
    if args.summary:
        print(summary(recs, "composed") + "\n\n" + summary(recs, "fsdp2"))
        return 0
    print(json.dumps(recs, indent=1) if args.json else markdown(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
