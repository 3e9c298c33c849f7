"""How a plan file names its cluster: by profile and checksum, not by embedding the profile.

A plan file written by ``search --out`` (and the ``plan`` of ``check --json``) carries

    cluster: {profile: h200, sha256: "…", topology: {hbm_bytes: …}}

``profile`` is a shipped profile name or a YAML path (``search --out`` writes it absolute; a relative
one is read from the plan file's folder), ``sha256`` the checksum of that
profile as loaded (``cluster_checksum``), and ``topology`` the command-line overrides
(``--hbm-gib``, ``--host-ram-gib``, ``--gpus-per-node``) applied on top of it. Older plan files that
embed the whole profile are still read as they are.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

from planner.errors import InvalidPlan
from planner.schema.cluster import MAX_DEVICE_BYTES, MAX_HOST_RAM_BYTES, ClusterSpec, Topology, check_usable_hbm
from planner.schema.documents import read_structured, validate
from planner.schema.profiles import _looks_like_path, load_cluster
from planner.schema.planfile import PlanFile
from planner.units import GiB

DEFAULT_CLUSTER = "h200"
"""The cluster profile used when neither ``--cluster`` nor a plan file names one."""
REFERENCE_KEYS = ("profile", "sha256", "topology")
"""The keys of a plan file's ``cluster:`` reference."""
TOPOLOGY_FLAGS = {"hbm_bytes": "--hbm-gib", "host_ram_bytes": "--host-ram-gib", "gpus_per_node": "--gpus-per-node"}
"""Topology fields the command line may override, and their flags."""
_GIB_FLAGS = {"hbm_bytes": ("--hbm-gib", MAX_DEVICE_BYTES, 141), "host_ram_bytes": ("--host-ram-gib", MAX_HOST_RAM_BYTES, 2048)}
"""Per GiB flag: the flag, its schema bound (``Topology``'s: 1 PiB of HBM, 64 PiB of host RAM) and a
plausible example value."""
MAX_GPUS_PER_NODE = 4096
"""Largest ``--gpus-per-node`` accepted."""


def topology_overrides(*, hbm_gib: float | None = None, host_ram_gib: float | None = None,
                       gpus_per_node: int | None = None) -> dict[str, int]:
    """The command-line topology overrides as ``Topology`` fields (bytes, counts).

    Raises:
        InvalidPlan: a size that is not finite and positive, or beyond the bounds.
    """
    out: dict[str, int] = {}
    for key, gib_ in (("hbm_bytes", hbm_gib), ("host_ram_bytes", host_ram_gib)):
        if gib_ is None:
            continue
        flag, top, example = _GIB_FLAGS[key]
        if not math.isfinite(gib_) or not 0 < gib_ <= top / GiB:
            raise InvalidPlan(flag, gib_, f"must be > 0 and <= {top / GiB:.0f} GiB", f"give GiB, e.g. {flag} {example}")
        out[key] = int(Decimal(repr(float(gib_))) * GiB)
    if gpus_per_node is not None:
        if not 0 < gpus_per_node <= MAX_GPUS_PER_NODE:
            raise InvalidPlan("--gpus-per-node", gpus_per_node, f"must be in 1..{MAX_GPUS_PER_NODE}",
                              "give the GPUs of one node, e.g. --gpus-per-node 8")
        out["gpus_per_node"] = int(gpus_per_node)
    return out


def apply_topology(spec: ClusterSpec, topology: dict[str, int] | None) -> ClusterSpec:
    """``spec`` with its declared topology fields replaced (validated as a ``Topology``)."""
    if not topology:
        return spec
    bad = sorted(set(topology) - set(TOPOLOGY_FLAGS))
    if bad:
        raise InvalidPlan(f"cluster.topology.{bad[0]}", topology[bad[0]], "cannot be overridden in a plan file",
                          f"override only {', '.join(TOPOLOGY_FLAGS)}, or write a cluster profile")
    topo = validate(Topology, {**spec.topology.model_dump(), **topology}, "cluster.topology")
    out = spec.model_copy(update={"topology": topo})
    check_usable_hbm(out)
    return out


def cluster_checksum(spec: ClusterSpec) -> str:
    """SHA-256 of the profile's canonical JSON (first 16 hex digits)."""
    text = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile_name(ref: str | None) -> str:
    """How a plan file names a profile: the shipped name, or the YAML's absolute path."""
    ref = ref or DEFAULT_CLUSTER
    return str(Path(ref).resolve()) if _looks_like_path(ref) else ref


def cluster_reference(ref: str | None, base: ClusterSpec, topology: dict[str, int] | None = None) -> dict[str, Any]:
    """The ``cluster:`` section of a plan file for profile ``ref`` (loaded as ``base``) with
    ``topology`` overrides."""
    doc: dict[str, Any] = {"profile": profile_name(ref), "sha256": cluster_checksum(base)}
    if topology:
        doc["topology"] = dict(topology)
    return doc


def is_reference(section: Any) -> bool:
    return isinstance(section, dict) and "profile" in section


def resolve_reference(section: dict, where: str) -> ClusterSpec:
    """The profile a reference names, its checksum verified (the overrides not yet applied).

    Raises:
        InvalidPlan: the profile's checksum differs from the one the plan file recorded.
    """
    name = section.get("profile")
    extra = [k for k in section if k not in REFERENCE_KEYS]
    if extra:
        raise InvalidPlan(f"cluster.{extra[0]}", section[extra[0]], "is not a known key of a cluster reference",
                          f"remove it (the keys of cluster: {', '.join(REFERENCE_KEYS)}), or embed a whole "
                          "cluster profile without profile:")
    if not isinstance(name, str) or not name:
        raise InvalidPlan("cluster.profile", name, "must name a cluster profile", "write e.g. profile: h200")
    spec = load_cluster(name, "cluster.profile")
    want, got = section.get("sha256"), cluster_checksum(spec)
    if want is not None and str(want) != got:
        raise InvalidPlan(f"{where} cluster.sha256", want,
                          f"does not match the profile {name} (now {got}): the profile changed since the plan was written",
                          "re-run `planner search … --out` to refresh the plan, or delete the sha256 line to accept "
                          "the profile as it is now")
    return spec


def read_plan_document(path: str) -> tuple[PlanFile, dict | None, ClusterSpec | None]:
    """A plan file, its cluster reference and the referenced profile before the reference's
    overrides (``None, None`` when the file embeds the profile). A relative ``profile:`` path is
    read from the plan file's folder, not the current one, and the returned reference names it
    absolute."""
    data = read_structured(path)
    ref = base = None
    if isinstance(data, dict) and isinstance(data.get("model"), str):
        name = data["model"]
        raise InvalidPlan("model", name, "must be the model's fields, not a profile name",
                          f"a plan file embeds the whole model: write one with planner search {name} --gpus W "
                          "--seq-len S --out plan.yaml")
    if isinstance(data, dict) and isinstance(data.get("cluster"), str):
        name = data["cluster"]
        raise InvalidPlan("cluster", name, "must be a mapping that names the profile, not a bare name",
                          f"write cluster: {{profile: {name}}}")
    if isinstance(data, dict) and is_reference(data.get("cluster")):
        ref = dict(data["cluster"])
        name = ref.get("profile")
        if isinstance(name, str) and _looks_like_path(name) and not Path(name).is_absolute():
            ref["profile"] = str((Path(path).parent / name).resolve())   # as written plan files name it
        topo = ref.get("topology")
        if "topology" in ref and not (isinstance(topo, dict) and all(isinstance(k, str) for k in topo)):
            raise InvalidPlan("cluster.topology", topo, "must be a mapping of topology fields to values",
                              f"write e.g. topology: {{hbm_bytes: 85899345920}} (fields {', '.join(TOPOLOGY_FLAGS)}), "
                              "or delete the line")
        base = resolve_reference(ref, path)
        data = {**data, "cluster": apply_topology(base, topo)}
    if not isinstance(data, dict):
        raise InvalidPlan(path, type(data).__name__, "is not a plan file (it holds no key: value mapping)",
                          "give a plan file written by `planner search --out`")
    _refuse_profile_as_plan(path, data)
    return validate(PlanFile, data, ""), ref, base


def _refuse_profile_as_plan(path: str, data: dict) -> None:
    """A model profile, Hugging Face config or cluster profile given where a plan file is read."""
    if {"plan", "workload", "model"} & set(data):
        return
    if "topology" in data:
        raise InvalidPlan(path, "a cluster profile", "is a cluster profile, not a plan file",
                          f"give it as --cluster {path} with a model (planner check MODEL --gpus W --seq-len S "
                          f"--cluster {path}), or write a plan with planner search … --out plan.yaml")
    if {"num_layers", "num_hidden_layers", "model_type"} & set(data):
        raise InvalidPlan(path, "a model", "is a model (a profile or a Hugging Face config), not a plan file",
                          f"give it as MODEL: planner check {path} --gpus W --seq-len S, or write a plan with "
                          f"planner search {path} … --out plan.yaml")


def planfile_doc(pf: PlanFile, ref: dict | None) -> dict:
    """``pf`` as a plan-file document, naming the cluster by ``ref`` (embedding it when ``None``)."""
    doc = pf.model_dump(mode="json")
    if ref is not None:
        doc["cluster"] = ref
    return doc
