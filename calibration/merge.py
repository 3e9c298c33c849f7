"""``calibration.merge``: fold measured curves and constants into a declared cluster profile.

- The profile's **declared topology is kept as declared** (``gpu_name``, GPUs per node, host RAM
  and cores, interconnect); only measurements move.
- Curves: each curve present in the measured file replaces the profile's; collective curves merge
  per collective and group size. An absent, null or empty curve (a whole profile from ``python -m
  calibration`` writes ``dispatch_kernels_widths: []`` when it did not run the widths) is a section
  the run did not measure and leaves the profile's as it is. A ``dispatch_kernels`` curve without ``dispatch_kernels_widths``
  beside it (``calibration.dispatch_kernels``) also gives every width curve the profile holds its
  host loops and host call seconds: those are measured at tiny rows, the same at every width
  (``calibration.coverage`` copies one host measurement into each width), so a host measured again
  moves them all.
- Memory constants: only those the measured file marks ``measured`` replace the profile's, so its
  ``assumed`` values and notes survive. ``KEEP_LARGER`` constants are never replaced by a
  smaller measurement (a smaller host baseline or CUDA context would make verdicts optimistic). ``expandable_segments`` follows the measured file when it
  measured ``fragmentation_fraction``.
- The result is validated (every curve's device must equal ``topology.gpu_name``) and written
  atomically; a failure leaves the profile untouched.

The measured file is a whole profile (``python -m calibration``), a fragment with
``curves``/``memory`` only (``calibration.collectives``, ``calibration.dispatch_kernels``'s
``dispatch_kernels.yaml``), or a ``calibration.dispatch_kernels`` JSON document, which is converted
to its fragment first (``curves.dispatch_kernels``, the run's provenance kept).

Usage: ``python -m calibration.merge PROFILE MEASURED [MEASURED ...] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from calibration.io import read_yaml, write_yaml_atomic
from planner.errors import InvalidPlan, PlanError
from planner.schema import cluster_constants
from planner.schema.cluster import ClusterSpec
from planner.timing.curves import parse_cluster


KEEP_LARGER = cluster_constants.keep_larger()
"""Constants a smaller measurement never replaces (registry rule ``merge="keep_larger"``,
``planner.schema.cluster_constants``): the host baseline (a bare process is a floor of a training
process) and the CUDA context (it grows with the kernels a run has loaded)."""


def merge_data(base: dict, measured: dict) -> dict:
    """The merged profile mapping (not validated)."""
    if "schema_version" in measured and measured["schema_version"] != base.get("schema_version", 1):
        raise InvalidPlan("schema_version", measured["schema_version"],
                          f"must equal the profile's ({base.get('schema_version', 1)})",
                          "re-run the calibration with this build")
    out = dict(base)
    curves = dict(base.get("curves") or {})
    for key, val in (measured.get("curves") or {}).items():
        if val is None or (isinstance(val, (list, dict)) and not val):   # a section the run did not measure
            continue
        if key == "collectives":
            coll = {k: {int(g): c for g, c in (v or {}).items()} for k, v in (curves.get(key) or {}).items()}
            for cname, per in val.items():
                coll.setdefault(cname, {}).update({int(g): c for g, c in (per or {}).items()})
            curves[key] = coll
        else:
            curves[key] = val
    new_dk = (measured.get("curves") or {}).get("dispatch_kernels")
    if new_dk and not (measured.get("curves") or {}).get("dispatch_kernels_widths") and curves.get("dispatch_kernels_widths"):
        curves["dispatch_kernels_widths"] = [{**w, "host_loops": new_dk["host_loops"], "host_call_s": new_dk["host_call_s"]}
                                             for w in curves["dispatch_kernels_widths"]]
    out["curves"] = curves
    memory = dict(base.get("memory") or {})
    new_mem = measured.get("memory") or {}
    for key, val in new_mem.items():
        if isinstance(val, dict) and val.get("status") == "measured":
            old = memory.get(key)
            if (key in KEEP_LARGER and isinstance(old, dict)
                    and float(old.get("value", 0)) > float(val.get("value", 0))):
                continue
            memory[key] = val
    frag = new_mem.get("fragmentation_fraction")
    if isinstance(frag, dict) and frag.get("status") == "measured" and "expandable_segments" in new_mem:
        memory["expandable_segments"] = new_mem["expandable_segments"]
    out["memory"] = memory
    return out


def read_measured(path) -> dict:
    """A measured file as a profile mapping (module docstring: a dispatch-kernels run is converted)."""
    data = read_yaml(path)
    if "gemm_layouts" in data and "host_blocks" in data and "curves" not in data:
        from calibration.dispatch_kernels import fragment

        return fragment(data)
    return data


def merged(base: dict, measured) -> ClusterSpec:
    """The validated profile of ``base`` (a profile mapping) with each of ``measured`` applied in
    order: a path (``read_measured``: a whole profile, a fragment or a dispatch-kernels run) or a
    mapping already read."""
    data = base
    for m in measured:
        data = merge_data(data, m if isinstance(m, dict) else read_measured(m))
    return parse_cluster(data)


def merge(profile_path, measured_path, *, out_path=None):
    """Merge ``measured_path`` into ``profile_path`` and write the result to ``out_path``
    (default: ``profile_path``) atomically.

    Returns:
        The merged ``ClusterSpec``.
    Raises:
        InvalidPlan: unreadable files, a schema-version mismatch, or a merged profile that does not
        validate (e.g. measured on another device than the declared ``gpu_name``).
    """
    spec = merged(read_yaml(profile_path), [measured_path])
    write_yaml_atomic(out_path or profile_path, spec.model_dump(mode="json"))
    return spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.merge", description=__doc__.split("\n")[0])
    ap.add_argument("profile", help="declared cluster profile (YAML)")
    ap.add_argument("measured", nargs="+", help="measured profile(s) or fragment(s), applied in order")
    ap.add_argument("--out", help="write here instead of over PROFILE")
    args = ap.parse_args(argv)
    try:
        spec = merged(read_yaml(args.profile), args.measured)
        path = write_yaml_atomic(args.out or args.profile, spec.model_dump(mode="json"))
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(f"wrote {Path(path)}; assumed: {', '.join(spec.assumed_constants()) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
