"""Command-line options: the launch options every plan command shares, and the knob options,
derived from the knob registry (``planner.schema.knobs``), never declared here a second time."""


import inspect
from typing import Annotated, Any, Optional

import typer

from planner.budget.frontier import MIN_HEADROOM
from planner.errors import InvalidPlan, PlanError
from planner.schema.knobs import ALIASES, KNOBS, Knob, default, enum_of
from planner.schema.plan import ROUTING_DEFAULT_TEXT
from planner.units import parse_count


def default_calibration_path() -> str:
    """Where ``planner calibrate`` writes without ``--out``: the user's config folder, not the cwd."""
    import os
    from pathlib import Path

    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return str(Path(base) / "moe-planner" / "clusters" / "measured.yaml")


Model = Annotated[Optional[str], typer.Argument(help="Profile name (see `planner models`), model YAML, or HF config.json.")]
ModelReq = Annotated[str, typer.Argument(help="Profile name, model YAML, or HF config.json.")]
PlanOpt = Annotated[Optional[str], typer.Option("--plan", help="Plan file (search --out); flags override its fields.", show_default="none")]
Cluster = Annotated[Optional[str], typer.Option("--cluster", help="Cluster profile name or YAML.", show_default="h200")]
Gpus = Annotated[Optional[int], typer.Option("--gpus", help="W: ranks (GPUs) in the job.", show_default="the plan file's; required without --plan")]
GpusReq = Annotated[int, typer.Option("--gpus", help="W: ranks (GPUs) in the job.", show_default="the plan file's; required without --plan")]
SeqLen = Annotated[Optional[str], typer.Option("--seq-len", help="S: context length (128k, 1m, 131072).", show_default="the plan file's; required without --plan")]
SeqLenReq = Annotated[str, typer.Option("--seq-len", help="S: context length (128k, 1m).")]
Seqs = Annotated[Optional[int], typer.Option("--seqs-per-microbatch", help="Sequences of length S per sequence group per micro-step.", show_default="1 (the plan file's with --plan)")]
GBT = Annotated[Optional[str], typer.Option("--global-batch-tokens", help="Tokens per optimizer step.", show_default="one micro-step: W/D sequences of S")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object (errors too).", show_default="off")]
HbmGib = Annotated[Optional[float], typer.Option("--hbm-gib", help="HBM per GPU, GiB, replacing the cluster profile's.", show_default="the profile's")]
HostRamGib = Annotated[Optional[float], typer.Option("--host-ram-gib", help="Host RAM per node, GiB, replacing the cluster profile's.", show_default="the profile's")]
GpusPerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (ranks sharing a node's host RAM), replacing the profile's.", show_default="the profile's")]
MtpTrained = Annotated[Optional[bool], typer.Option("--mtp-trained/--no-mtp-trained", help="Whether the model's MTP layers are trained (count in Θ).", show_default="the model file's mtp_trained (true)")]
Baseline = Annotated[bool, typer.Option("--baseline", help="Evaluate the FSDP2 baseline.", show_default="off: the composed stack")]
Progress = Annotated[bool, typer.Option(help="Show a progress bar.")]


def headroom_option(what: str):
    return Annotated[Optional[float], typer.Option(
        help=f"Fraction of the usable capacity {what} leaves free.", show_default=f"{MIN_HEADROOM}")]


Routing = Annotated[Optional[str], typer.Option(help="balanced | worst | R/H, for both stacks.",
                                                show_default=ROUTING_DEFAULT_TEXT)]
DispatchBoundC = enum_of("dispatch_bound")
DtypeC = enum_of("dtype")
BoundOpt = Annotated[DispatchBoundC, typer.Option(help="Dispatch size the verdicts use.")]
DtypeOpt = Annotated[DtypeC, typer.Option(help="Activation dtype.")]
DEFAULT_BOUND = DispatchBoundC(default("dispatch_bound"))
DEFAULT_DTYPE = DtypeC(default("dtype"))


FLAG_OF_FIELD: dict[str, tuple[str, ...]] = {
    "plan.world_size": ("--gpus",),
    "workload.seq_len": ("--seq-len", "--seq-lens"),
    "workload.seqs_per_microbatch": ("--seqs-per-microbatch",),
    "workload.global_batch_tokens": ("--global-batch-tokens",),
    "cluster.topology.gpus_per_node": ("--gpus-per-node",),
    **{k.path: (k.flag,) for k in KNOBS.values() if k.cli is not None and k.cli.parse != "gib"},
    **{KNOBS[b].path: (KNOBS[a].flag,) for a, b in ALIASES.items()},
}
"""Schema path → the flags that set it, for the errors about a value the user typed: a refusal
of ``plan.baseline.tp`` reads ``--tp (3) must …`` when ``--tp`` was on the command line
(``named_by_flag``). The knobs' entries come from the registry (``Knob.path``, ``Knob.flag``;
``--expert-parallel`` sets the baseline's ``ep``). Left out: the fields whose flag takes another
unit (``--sco-host-gib``, ``--hbm-gib``, ``--host-ram-gib`` hold bytes; their flags are checked in
GiB where they are parsed) and those no flag sets (``plan.baseline.dp_replicate``, ``model.*``)."""


def typed_flags(args: list[str]) -> set[str]:
    """The long options on a command line, as click reads them: ``--tp 3`` and ``--tp=3`` give
    ``--tp``; nothing after ``--`` is an option."""
    args = args[:args.index("--")] if "--" in args else args
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def named_by_flag(e: PlanError, args: list[str]) -> PlanError:
    """``e`` naming the flag the user typed where it names the schema field that flag set
    (``FLAG_OF_FIELD``). A field not set by a flag on this command line keeps its path: it names
    the field of the plan, model or cluster file it came from (``check --plan FILE``), or a
    derived default."""
    if not isinstance(e, InvalidPlan):
        return e
    typed = typed_flags(args)
    flag = next((f for f in FLAG_OF_FIELD.get(e.field, ()) if f in typed), None)
    return e if flag is None else e.renamed(flag)


def count(v: str | None, field: str) -> int | None:
    """``128k`` → 131072 (``None`` stays ``None``)."""
    return None if v is None else parse_count(v, field)


def value(e):
    """An enum option's value (anything else unchanged)."""
    return getattr(e, "value", e)


def topology(hbm_gib, host_ram_gib, gpus_per_node) -> dict:
    from planner.schema.cluster_ref import topology_overrides

    return topology_overrides(hbm_gib=hbm_gib, host_ram_gib=host_ram_gib, gpus_per_node=gpus_per_node)


def launch(*, model, plan, cluster, gpus, seq_len, global_batch_tokens, seqs_per_microbatch, hbm_gib,
           host_ram_gib, gpus_per_node, mtp_trained) -> dict[str, Any]:
    """The launch options in ``api.build`` terms."""
    return dict(model=model, plan_file=plan, cluster=cluster, gpus=gpus, seqs_per_microbatch=seqs_per_microbatch,
                mtp_trained=mtp_trained, seq_len=count(seq_len, "--seq-len"),
                global_batch_tokens=count(global_batch_tokens, "--global-batch-tokens"),
                cluster_overrides=topology(hbm_gib, host_ram_gib, gpus_per_node))


def _shown(k: Knob) -> str:
    """The ``--help`` default of a knob, read from the registry."""
    if k.cli.show_default is not None:
        return k.cli.show_default
    return "derived (README: defaults)" if k.default is None else str(k.default)


_TYPER_TYPE = {"count": str, "params": str, "gib": float}
"""Command-line type of a parsed knob (``Cli.parse``); the rest take their schema type."""


def _knob_parameter(k: Knob) -> inspect.Parameter:
    if k.annotation is bool:
        ann = Annotated[bool, typer.Option(k.flag, help=k.cli.help, show_default=_shown(k))]
        return inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=ann)
    if k.choices:
        typ = enum_of(k.name)
    else:
        typ = _TYPER_TYPE.get(k.cli.parse) or next(t for t in (int, float, str) if t in (k.annotation, *
                                                                                  getattr(k.annotation, "__args__", ())))
    decls = [k.cli.flag] if k.cli.flag else []
    ann = Annotated[Optional[typ], typer.Option(*decls, help=k.cli.help, show_default=_shown(k))]
    return inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)


KNOB_OPTIONS = tuple(_knob_parameter(k) for k in KNOBS.values() if k.cli is not None)
"""One option per knob with a ``Cli`` declaration, in registry order."""


def knob_options(fn):
    """Give a command taking ``**knobs`` one option per registry knob (``KNOB_OPTIONS``): the
    command declares its own options, the registry declares the knobs', and typer reads both from
    the signature. ``knobs`` then holds the knob flags as typed (``None``: not given)."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    fn.__signature__ = sig.replace(parameters=[*own, *KNOB_OPTIONS])
    return fn
