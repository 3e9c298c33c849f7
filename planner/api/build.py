"""Assemble a plan file from a plan file and/or a model plus plan overrides (``build``)."""

from __future__ import annotations

import os
from typing import Any

from planner.errors import InvalidPlan
from planner.schema import PlanFile
from planner.schema.io import load_cluster, load_model_noted, validate
from planner.schema.knobs import KNOBS, check_inert, default, stack_overrides


def build_planfile(**kwargs) -> PlanFile:
    """Assemble an (unresolved) plan file: see ``build`` for the arguments."""
    return build(**kwargs)[0]


def build(*, model: str | None = None, plan_file: str | None = None, cluster: str | None = None,
          gpus: int | None = None, seq_len: int | None = None, global_batch_tokens: int | None = None,
          seqs_per_microbatch: int | None = None, overrides: dict[str, Any] | None = None,
          cluster_overrides: dict[str, int] | None = None,
          mtp_trained: bool | None = None,
          notes: list[str] | None = None) -> tuple[PlanFile, dict | None]:
    """An (unresolved) plan file from a plan file and/or a model plus flag overrides, and the
    reference that names its cluster in a written plan file (``None`` for an old plan file that
    embeds its profile and no ``--cluster``). ``cluster_overrides`` are topology fields
    (``planner.schema.cluster_ref.TOPOLOGY_FLAGS``) replacing the profile's. ``notes`` receives the Hugging Face importer's
    warnings.

    Raises:
        InvalidPlan: neither a model nor a plan file, or ``--gpus``/``--seq-len`` missing.
    """
    from planner.schema.cluster_ref import apply_topology, cluster_reference, read_plan_document

    ov = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(ov) - set(KNOBS)
    if unknown:
        raise TypeError(f"build: unknown plan overrides {sorted(unknown)}")
    cov = dict(cluster_overrides or {})
    if model is not None:
        _refuse_folder(model)
    if plan_file is not None and not plan_file.strip():
        raise InvalidPlan("--plan", plan_file, "is an empty path", "give the plan file `planner search --out` wrote")
    if plan_file:
        pf, file_ref, file_base = read_plan_document(plan_file)
        m = _model(model, notes) if model else pf.model
        if m.name != pf.model.name:
            raise InvalidPlan("MODEL", model, f"differs from the plan file's model ({pf.model.name})",
                              "drop MODEL to check the plan's own model, or write a plan for this one "
                              "(planner search MODEL ... --out)")
        if cluster is not None:
            base = load_cluster(cluster)
            ref = cluster_reference(cluster, base, cov)
        elif file_ref is not None:
            base, cov = file_base, {**file_ref.get("topology", {}), **cov}
            ref = cluster_reference(file_ref["profile"], base, cov)
        else:
            base, ref = pf.cluster, None
        c = apply_topology(base, cov)
        wl = pf.workload.model_dump()
        plan = pf.plan.model_dump()
        if ov.get("stack", plan["stack"]) != plan["stack"]:
            plan["composed" if plan["stack"] == "composed" else "baseline"] = {}
    else:
        if model is None:
            raise InvalidPlan("MODEL", None, "is required", "give a model name/file or --plan FILE")
        from planner.schema.cluster_ref import DEFAULT_CLUSTER

        m, base = _model(model, notes), load_cluster(DEFAULT_CLUSTER if cluster is None else cluster)
        c, ref = apply_topology(base, cov), cluster_reference(cluster, base, cov)
        wl, plan = {}, {"composed": {}, "baseline": {}}
        if gpus is None:
            raise InvalidPlan("--gpus", None, "is required without --plan", "add e.g. --gpus 8")
        if seq_len is None:
            raise InvalidPlan("--seq-len", None, "is required without --plan", "add e.g. --seq-len 128k")
    ov = stack_overrides(ov, ov.get("stack", plan.get("stack", default("stack"))))
    if mtp_trained is not None:
        if not m.mtp_layers:
            raise InvalidPlan("--mtp-trained" if mtp_trained else "--no-mtp-trained", m.name,
                              "applies to a model with MTP layers (this one has none)", "drop the flag")
        m = m.model_copy(update={"mtp_trained": mtp_trained})
    if gpus is not None:
        plan["world_size"] = gpus
    if seq_len is not None:
        wl["seq_len"] = seq_len
    if global_batch_tokens is not None:
        wl["global_batch_tokens"] = global_batch_tokens
    if seqs_per_microbatch is not None:
        wl["seqs_per_microbatch"] = seqs_per_microbatch
    for k, v in ov.items():
        part = KNOBS[k].part
        if part == "plan":
            plan[k] = v
        else:
            plan.setdefault(part, {})[k] = v
    if plan.get("stack", default("stack")) == "composed":
        check_inert(set(ov), plan.get("composed") or {})
    return validate(PlanFile, {"model": m, "cluster": c, "workload": wl, "plan": plan}, ""), ref


def refuse_planner_file(data: dict, path: str) -> None:
    """``import-hf`` given one of the planner's own files: say what the file is and how to use it.

    Raises:
        InvalidPlan: ``data`` is a planner model profile, plan file or cluster profile.
    """
    if {"plan", "workload"} & set(data) and "num_layers" not in data:
        raise InvalidPlan("CONFIG", path, "is a planner plan file, not a Hugging Face config",
                          f"use it as it is: planner check --plan {path}")
    if "topology" in data and "memory" in data:
        raise InvalidPlan("CONFIG", path, "is a planner cluster profile, not a Hugging Face config",
                          f"use it as it is: planner check MODEL --cluster {path}")
    if "num_layers" in data and "hidden_size" in data and "name" in data:
        raise InvalidPlan("CONFIG", path, "is already a planner model profile, not a Hugging Face config",
                          f"use it as it is: planner check {path} --gpus W --seq-len S")


def _refuse_folder(model: str) -> None:
    """A Hugging Face model folder given as MODEL: name the file to pass."""
    from pathlib import Path

    p = Path(model)
    try:
        folder = p.is_dir() and (os.sep in model or (p / "config.json").is_file())
    except OSError:
        return
    if folder:
        fix = (f"pass {p / 'config.json'}" if (p / "config.json").is_file()
               else "pass the folder's config.json (a Hugging Face config) or a model YAML")
        raise InvalidPlan("MODEL", model, "is a folder, not a model file", fix)


def _model(ref: str, notes: list[str] | None):
    spec, warnings = load_model_noted(ref)
    if notes is not None:
        notes.extend(warnings)
    return spec
