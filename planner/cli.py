"""``planner``: thin typer commands over ``planner.api`` (DESIGN §10).

Exit codes: 0 fits, 1 does not fit, 2 invalid input (one line, no traceback), 3 internal error.
"""

import json
import math
import sys
import traceback
from decimal import Decimal
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console

from planner.budget.frontier import MIN_HEADROOM
from planner.errors import InvalidPlan, PlanError
from planner.units import GiB, parse_count, parse_params

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Per-rank memory and step-time planner for long-context MoE training.")


def _version(value: bool) -> None:
    if value:
        from planner import __version__

        sys.stdout.write(f"planner (moe-planner) {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Per-rank memory and step-time planner for long-context MoE training."""
_WIDTH = None if sys.stdout.isatty() else 160
"""Rich wraps at 80 columns when not on a terminal; pipes and logs get 160."""
out = Console(width=_WIDTH)
err = Console(stderr=True, width=_WIDTH)


class DispatchC(str, Enum):
    ep = "ep"
    llep = "llep"
    pipelined_llep = "pipelined_llep"


class VocabC(str, Enum):
    dense = "dense"
    vocab_parallel = "vocab_parallel"
    ring_dtp = "ring_dtp"


class OptimizerC(str, Enum):
    gpu = "gpu"
    cpu_offload = "cpu_offload"
    stream_offload = "stream_offload"


class CheckpointC(str, Enum):
    none = "none"
    per_layer = "per_layer"
    sco = "sco"


class BoundC(str, Enum):
    guarantee = "guarantee"
    expected = "expected"


class ResidueC(str, Enum):
    source = "source"
    destination = "destination"


class DtypeC(str, Enum):
    bf16 = "bf16"
    fp32 = "fp32"


class ACC(str, Enum):
    full = "full"
    selective = "selective"
    none = "none"


ROUTING_DEFAULT = "the named skew where the dispatch has no launch-time bound, else balanced (README: routing)"
"""``--help`` text of the routing default (``planner.plans.routing.default_routing``)."""


def _d(name: str, part: str = "composed") -> str:
    """The ``--help`` default of a plan knob, read from the schema (one source per fact)."""
    from planner.schema.plan import BaselineKnobs, ComposedKnobs, Plan

    cls = {"composed": ComposedKnobs, "baseline": BaselineKnobs, "plan": Plan}[part]
    v = cls.model_fields[name].default
    return "derived (README: defaults)" if v is None else str(v)


def default_calibration_path() -> str:
    """Where ``planner calibrate`` writes without ``--out``: the user's config folder, not the cwd."""
    import os
    from pathlib import Path

    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return str(Path(base) / "moe-planner" / "clusters" / "measured.yaml")


Model = Annotated[Optional[str], typer.Argument(help="Profile name (see `planner models`), model YAML, or HF config.json.")]
PlanOpt = Annotated[Optional[str], typer.Option("--plan", help="Plan file (search --out); flags override its fields.", show_default="none")]
Cluster = Annotated[Optional[str], typer.Option("--cluster", help="Cluster profile name or YAML.", show_default="h200")]
Gpus = Annotated[Optional[int], typer.Option("--gpus", help="W: ranks (GPUs) in the job.", show_default="the plan file's; required without --plan")]
SeqLen = Annotated[Optional[str], typer.Option("--seq-len", help="S: context length (128k, 1m, 131072).", show_default="the plan file's; required without --plan")]
Seqs = Annotated[Optional[int], typer.Option("--seqs-per-microbatch", help="Sequences of length S per sequence group per micro-step.", show_default="1 (the plan file's with --plan)")]
GBT = Annotated[Optional[str], typer.Option("--global-batch-tokens", help="Tokens per optimizer step.", show_default="one micro-step: W/D sequences of S")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object (errors too).", show_default="off")]
HbmGib = Annotated[Optional[float], typer.Option("--hbm-gib", help="HBM per GPU, GiB, replacing the cluster profile's.", show_default="the profile's")]
HostRamGib = Annotated[Optional[float], typer.Option("--host-ram-gib", help="Host RAM per node, GiB, replacing the cluster profile's.", show_default="the profile's")]
GpusPerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (ranks sharing a node's host RAM), replacing the profile's.", show_default="the profile's")]


class StackC(str, Enum):
    best = "best"
    composed = "composed"
    fsdp2 = "fsdp2"


def _print_json(doc) -> None:
    """One JSON object on stdout (plain: rich's highlighter is slow on large documents)."""
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")


def _count(v: str | None, field: str) -> int | None:
    return None if v is None else parse_count(v, field)


def _v(e):
    return None if e is None else (e.value if isinstance(e, Enum) else e)


def _overrides(**kw) -> dict:
    ov = {k: _v(v) for k, v in kw.items() if v is not None and v is not False}
    if kw.get("baseline"):
        ov["stack"] = "fsdp2"
        if "expert_parallel" in ov:
            ov["ep"] = ov.pop("expert_parallel")
    ov.pop("baseline", None)
    if "token_budget" in ov:
        ov["token_budget"] = parse_count(ov["token_budget"], "--token-budget")
    if "bucket_params" in ov:
        ov["bucket_params"] = parse_params(ov["bucket_params"], "--bucket-params")
    if "sco_host_gib" in ov:
        gib_ = ov.pop("sco_host_gib")
        if not math.isfinite(gib_) or gib_ < 0:
            raise InvalidPlan("--sco-host-gib", gib_, "must be >= 0 and finite", "give a budget in GiB, e.g. 64")
        ov["sco_host_bytes"] = int(Decimal(repr(gib_)) * GiB)
    if "routing" in ov:
        from planner.schema.plan import Plan

        from planner.schema.io import validate
        validate(Plan, {"world_size": 1, "routing": ov["routing"]}, "plan")
    return ov


def _topology(hbm_gib, host_ram_gib, gpus_per_node) -> dict:
    from planner.schema.cluster_ref import topology_overrides

    return topology_overrides(hbm_gib=hbm_gib, host_ram_gib=host_ram_gib, gpus_per_node=gpus_per_node)


def _common(model, plan, cluster, gpus, seq_len, gbt, ov, hbm_gib=None, host_ram_gib=None,
            gpus_per_node=None, seqs=None, mtp_trained=None) -> dict:
    return dict(model=model, plan_file=plan, cluster=cluster, gpus=gpus, seqs_per_microbatch=seqs,
                mtp_trained=mtp_trained,
                seq_len=_count(seq_len, "--seq-len"), global_batch_tokens=_count(gbt, "--global-batch-tokens"),
                overrides=ov, cluster_overrides=_topology(hbm_gib, host_ram_gib, gpus_per_node))


@app.command()
def check(
    model: Model = None, plan: PlanOpt = None, cluster: Cluster = None, gpus: Gpus = None,
    seq_len: SeqLen = None, global_batch_tokens: GBT = None, seqs_per_microbatch: Seqs = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    mtp_trained: Annotated[Optional[bool], typer.Option("--mtp-trained/--no-mtp-trained", help="Whether the model's MTP layers are trained (count in Θ).", show_default="the model file's mtp_trained (true)")] = None,
    dispatch: Annotated[Optional[DispatchC], typer.Option(help="Expert dispatch operator.", show_default=_d("dispatch", "composed"))] = None,
    dispatch_residue: Annotated[Optional[ResidueC], typer.Option(
        help="PipelinedLLEP state across chunks: source (bounded for any router) | destination.",
        show_default=_d("dispatch_residue", "composed"))] = None,
    expert_parallel: Annotated[Optional[int], typer.Option(help="E_p (baseline: ep).", show_default=_d("expert_parallel", "composed"))] = None,
    token_budget: Annotated[Optional[str], typer.Option(help="c: per-source tokens per chunk.", show_default=_d("token_budget", "composed"))] = None,
    max_chunks: Annotated[Optional[int], typer.Option(help="K_max.", show_default=_d("max_chunks", "composed"))] = None,
    llep_alpha: Annotated[Optional[float], typer.Option(help="α: LLEP capacity factor.", show_default=_d("llep_alpha", "composed"))] = None,
    llep_min_tokens: Annotated[Optional[int], typer.Option(help="m: min tokens per spilled GEMM.", show_default=_d("llep_min_tokens", "composed"))] = None,
    llep_lambda: Annotated[Optional[float], typer.Option(help="λ: imbalance threshold.", show_default=_d("llep_lambda", "composed"))] = None,
    routing: Annotated[Optional[str], typer.Option(help="balanced | worst | R/H (e.g. 80/16).", show_default=ROUTING_DEFAULT)] = None,
    dispatch_bound: Annotated[Optional[BoundC], typer.Option(help="Dispatch size the verdict uses.", show_default=_d("dispatch_bound", "plan"))] = None,
    vocab: Annotated[Optional[VocabC], typer.Option(help="Vocabulary head.", show_default=_d("vocab", "composed"))] = None,
    vocab_parallel: Annotated[Optional[int], typer.Option(help="P: vocabulary group size.", show_default=_d("vocab_parallel", "composed"))] = None,
    vocab_blocks: Annotated[Optional[int], typer.Option(help="B_v: blocks per vocab shard.", show_default=_d("vocab_blocks", "composed"))] = None,
    optimizer: Annotated[Optional[OptimizerC], typer.Option(help="Optimizer placement.", show_default=_d("optimizer", "composed"))] = None,
    bucket_params: Annotated[Optional[str], typer.Option(help="β: bucket size in params (100M).", show_default=_d("bucket_params", "composed"))] = None,
    staging_slots: Annotated[Optional[int], typer.Option(help="s: staging slots.", show_default=_d("staging_slots", "composed"))] = None,
    seq_parallel: Annotated[Optional[int], typer.Option(help="D: Ulysses degree.", show_default=_d("seq_parallel", "composed"))] = None,
    checkpoint: Annotated[Optional[CheckpointC], typer.Option(help="Activation checkpointing.", show_default=_d("checkpoint", "composed"))] = None,
    sco_host_gib: Annotated[Optional[float], typer.Option(help="SCO host budget per rank, GiB (pinned).", show_default="what host RAM leaves")] = None,
    max_imports: Annotated[Optional[int], typer.Option(help="n_import_max.", show_default=_d("max_imports", "composed"))] = None,
    dtype: Annotated[Optional[DtypeC], typer.Option(help="Activation dtype.", show_default=_d("dtype", "plan"))] = None,
    baseline: Annotated[bool, typer.Option("--baseline", help="Evaluate the FSDP2 baseline.", show_default="off: the composed stack")] = False,
    tp: Annotated[Optional[int], typer.Option(help="Baseline tensor parallel.", show_default=_d("tp", "baseline"))] = None,
    cp: Annotated[Optional[int], typer.Option(help="Baseline context parallel.", show_default=_d("cp", "baseline"))] = None,
    dp_shard: Annotated[Optional[int], typer.Option(help="Baseline FSDP shard degree.", show_default=_d("dp_shard", "baseline"))] = None,
    ac: Annotated[Optional[ACC], typer.Option(help="Baseline activation checkpointing.", show_default=_d("ac", "baseline"))] = None,
    cpu_offload: Annotated[bool, typer.Option("--cpu-offload", help="Baseline CPUOffloadPolicy.", show_default="off")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Print every term's formula and value.", show_default="off")] = False,
    json_out: Json = False,
) -> None:
    """Does this configuration fit, per rank, in HBM and host RAM? Which term binds?"""
    from planner import api
    from planner.report.check_view import render_check

    ov = _overrides(**{k: v for k, v in locals().items() if k in _OV_KEYS})
    rep = api.check(**_common(model, plan, cluster, gpus, seq_len, global_batch_tokens, ov, hbm_gib, host_ram_gib,
                              gpus_per_node, seqs_per_microbatch, mtp_trained))
    for w in rep.warnings:
        err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
    if json_out:
        _print_json(rep.to_json())
    else:
        render_check(rep, out, explain=explain)
    raise typer.Exit(0 if rep.fits else 1)


_OV_KEYS = {"dispatch", "dispatch_residue", "expert_parallel", "token_budget", "max_chunks", "llep_alpha", "llep_min_tokens",
            "llep_lambda", "routing", "dispatch_bound", "vocab", "vocab_parallel", "vocab_blocks", "optimizer",
            "bucket_params", "staging_slots", "seq_parallel", "checkpoint", "sco_host_gib", "max_imports",
            "dtype", "baseline", "tp", "cp", "dp_shard", "ac", "cpu_offload"}


def _frontier(kind: str, ctx: typer.Context, **kw) -> None:
    from planner import api
    from planner.report.check_view import render_frontier

    extra = kw.pop("extra")
    ov = _overrides(**{k: v for k, v in kw.items() if k in _OV_KEYS})
    common = _common(kw["model"], kw["plan"], kw["cluster"], kw["gpus"], kw["seq_len"], kw["global_batch_tokens"], ov,
                     kw["hbm_gib"], kw["host_ram_gib"], kw["gpus_per_node"], kw["seqs_per_microbatch"],
                     kw["mtp_trained"])
    rep = api.max_context(**common, **extra) if kind == "context" else api.max_batch(**common, **extra)
    if kw["json_out"]:
        _print_json(rep.to_json())
    else:
        render_frontier(rep, out)
    raise typer.Exit(0 if rep.scan.best is not None else 1)


def _frontier_signature(fn):
    """Give a frontier command check's options (minus --explain) plus its own."""
    import inspect

    base = [p for n, p in inspect.signature(check).parameters.items() if n != "explain"]
    own = [p for p in inspect.signature(fn).parameters.values()
           if p.name not in {q.name for q in base} and p.kind != inspect.Parameter.VAR_KEYWORD]
    fn.__signature__ = inspect.Signature(base + own)
    fn.__annotations__ = {p.name: p.annotation for p in base + own}
    return fn


@app.command("max-context")
@_frontier_signature
def max_context(
    seq_step: Annotated[Optional[str], typer.Option(help="Grid step of S (total context, like --max-seq-len), rounded up to a multiple of D.", show_default="1k × D")] = None,
    max_seq_len: Annotated[str, typer.Option(help="Largest S (total context) scanned.")] = "16m",
    min_headroom: Annotated[Optional[float], typer.Option(
        help="Fraction of the usable capacity a fitting point leaves free.", show_default=f"{MIN_HEADROOM}")] = None,
    **kw,
) -> None:
    """Largest context length that fits (whole-grid scan; the peak is not monotone in S)."""
    kw["extra"] = {"seq_step": _count(seq_step, "--seq-step"), "max_seq_len": parse_count(max_seq_len, "--max-seq-len"),
                   "min_headroom": min_headroom}
    _frontier("context", None, **kw)


@app.command("max-batch")
@_frontier_signature
def max_batch(
    max_tokens: Annotated[str, typer.Option(help="Largest tokens per sequence group scanned.")] = "16m",
    min_headroom: Annotated[Optional[float], typer.Option(
        help="Fraction of the usable capacity a fitting point leaves free.", show_default=f"{MIN_HEADROOM}")] = None,
    **kw,
) -> None:
    """Largest global batch per micro-step that fits at the given S (whole-grid scan)."""
    kw["extra"] = {"max_tokens": parse_count(max_tokens, "--max-tokens"), "min_headroom": min_headroom}
    _frontier("batch", None, **kw)


def _progress(label: str, enabled: bool):
    """A rich progress bar on stderr (``None`` when disabled or not a terminal)."""
    if not enabled or not err.is_terminal:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    prog = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True)
    task = prog.add_task(label, total=None)
    return prog, (lambda done, total: prog.update(task, completed=done, total=total))


MAX_TOP = 1000
"""Most plans ``search --top`` lists."""
MAX_SWEEP_LENGTHS = 64
"""Most lengths one ``sweep`` runs (each is a search)."""


@app.command()
def search(
    model: Annotated[str, typer.Argument(help="Profile name, model YAML, or HF config.json.")],
    gpus: Annotated[int, typer.Option("--gpus", help="W: ranks (GPUs) in the job.", show_default="the plan file's; required without --plan")],
    seq_len: Annotated[str, typer.Option("--seq-len", help="S: context length (128k, 1m).")],
    cluster: Cluster = None, global_batch_tokens: GBT = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    routing: Annotated[Optional[str], typer.Option(help="balanced | worst | R/H, for both stacks.", show_default=ROUTING_DEFAULT)] = None,
    dispatch_bound: Annotated[BoundC, typer.Option(help="Dispatch size the verdicts use.")] = BoundC.guarantee,
    dtype: Annotated[DtypeC, typer.Option(help="Activation dtype.")] = DtypeC.bf16,
    top: Annotated[int, typer.Option(help="How many composed plans to list.")] = 5,
    min_headroom: Annotated[Optional[float], typer.Option(
        help="Fraction of the usable capacity a listed plan leaves free.", show_default=f"{MIN_HEADROOM}")] = None,
    stack: Annotated[StackC, typer.Option(help="Which plan --out writes: the faster stack that fits (best), or one stack.")] = StackC.best,
    out_file: Annotated[Optional[str], typer.Option("--out", help="Write the chosen plan (--stack) as a plan file.", show_default="none: nothing written")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    json_out: Json = False,
) -> None:
    """Fastest configuration that fits, beside the fastest FSDP2 baseline that fits."""
    from planner import api
    from planner.report.search_view import describe_choice, render_search
    from planner.schema.io import check_writable, write_yaml_atomic

    if not 1 <= top <= MAX_TOP:
        raise InvalidPlan("--top", top, f"must be in [1, {MAX_TOP}]", "list at least one plan, at most a few")
    if out_file:
        check_writable(out_file, "--out")
    prog, cb = _progress("searching", progress and not json_out)
    try:
        if prog:
            prog.start()
        rep = api.search(model=model, cluster=cluster, gpus=gpus, seq_len=parse_count(seq_len, "--seq-len"),
                         global_batch_tokens=_count(global_batch_tokens, "--global-batch-tokens"),
                         routing=routing, dispatch_bound=_v(dispatch_bound), dtype=_v(dtype), top=top,
                         stack=_v(stack), cluster_overrides=_topology(hbm_gib, host_ram_gib, gpus_per_node),
                         progress=cb, min_headroom=min_headroom)
    finally:
        if prog:
            prog.stop()
    doc = rep.planfile_doc() if out_file else None
    if doc is not None:
        write_yaml_atomic(out_file, doc, "--out")
    if json_out:
        _print_json(rep.to_json())
    else:
        render_search(rep, out)
        if doc is not None:
            err.print(f"wrote {describe_choice(rep)} to {out_file} (planner check --plan {out_file})",
                      markup=False, highlight=False)
    raise typer.Exit(0 if rep.chosen is not None and rep.chosen[1] else 1)


@app.command()
def sweep(
    model: Annotated[str, typer.Argument(help="Profile name, model YAML, or HF config.json.")],
    gpus: Annotated[int, typer.Option("--gpus", help="W: ranks (GPUs) in the job.", show_default="the plan file's; required without --plan")],
    seq_lens: Annotated[str, typer.Option("--seq-lens", help="Comma-separated context lengths (32k,64k,...).")],
    cluster: Cluster = None, global_batch_tokens: GBT = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    routing: Annotated[Optional[str], typer.Option(help="balanced | worst | R/H, for both stacks.", show_default=ROUTING_DEFAULT)] = None,
    dtype: Annotated[DtypeC, typer.Option(help="Activation dtype.")] = DtypeC.bf16,
    min_headroom: Annotated[Optional[float], typer.Option(
        help="Fraction of the usable capacity a chosen plan leaves free.", show_default=f"{MIN_HEADROOM}")] = None,
    csv: Annotated[Optional[str], typer.Option("--csv", help="Write the sweep as CSV.", show_default="none")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write the plot; the suffix picks the format (.png, .pdf, .svg; needs the plot extra).", show_default="none")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    json_out: Json = False,
) -> None:
    """Per context length: best composed plan and best baseline, peak per live set, verdict, throughput."""
    from planner import api
    from planner.report.sweep_view import frame, plot_format, render_sweep, write_csv, write_plot
    from planner.schema.io import check_writable

    lens = [parse_count(x, "--seq-lens") for x in seq_lens.split(",") if x.strip()]
    if not lens:
        raise InvalidPlan("--seq-lens", seq_lens, "must list at least one length", "write e.g. 32k,64k,128k")
    if len(lens) > MAX_SWEEP_LENGTHS:
        raise InvalidPlan("--seq-lens", f"{len(lens)} lengths", f"must list at most {MAX_SWEEP_LENGTHS}",
                          "sweep fewer lengths (each runs a search)")
    for path, field in ((csv, "--csv"), (plot, "--plot")):
        if path:
            check_writable(path, field)
    if plot:
        plot_format(plot)
    prog, cb = _progress("sweeping", progress and not json_out)
    try:
        if prog:
            prog.start()
        rows = api.sweep(model=model, cluster=cluster, gpus=gpus, seq_lens=sorted(lens), routing=routing,
                         dtype=_v(dtype), global_batch_tokens=_count(global_batch_tokens, "--global-batch-tokens"),
                         cluster_overrides=_topology(hbm_gib, host_ram_gib, gpus_per_node), progress=cb, min_headroom=min_headroom)
    finally:
        if prog:
            prog.stop()
    if csv:
        write_csv(rows, csv)
    if plot:
        write_plot(rows, plot, f"{model} on {gpus} GPUs: per-rank peak by live set, and throughput")
    if json_out:
        _print_json(json.loads(frame(rows).to_json(orient="records")))
    else:
        render_sweep(rows, out)
    raise typer.Exit(0)


@app.command("min-gpus")
def min_gpus(
    model: Annotated[str, typer.Argument(help="Profile name, model YAML, or HF config.json.")],
    seq_len: Annotated[str, typer.Option("--seq-len", help="S: context length (128k, 1m).")],
    cluster: Cluster = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    routing: Annotated[Optional[str], typer.Option(help="balanced | worst | R/H, for both stacks.", show_default=ROUTING_DEFAULT)] = None,
    dispatch_bound: Annotated[BoundC, typer.Option(help="Dispatch size the verdicts use.")] = BoundC.guarantee,
    dtype: Annotated[DtypeC, typer.Option(help="Activation dtype.")] = DtypeC.bf16,
    max_gpus: Annotated[int, typer.Option(help="Largest W tried (powers of two).")] = 4096,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    json_out: Json = False,
) -> None:
    """Smallest W (a power of two) at which some composed plan fits; the FSDP2 baseline's beside it."""
    from planner import api
    from planner.report.search_view import render_min_gpus

    prog, cb = _progress("trying W", progress and not json_out)
    try:
        if prog:
            prog.start()
        rep = api.min_gpus(model=model, seq_len=parse_count(seq_len, "--seq-len"), cluster=cluster,
                           cluster_overrides=_topology(hbm_gib, host_ram_gib, gpus_per_node), routing=routing,
                           dispatch_bound=_v(dispatch_bound), dtype=_v(dtype), max_gpus=max_gpus, progress=cb)
    finally:
        if prog:
            prog.stop()
    if json_out:
        _print_json(rep.to_json())
    else:
        render_min_gpus(rep, out)
    raise typer.Exit(0 if rep.composed is not None else 1)


@app.command()
def calibrate(
    out_file: Annotated[Optional[str], typer.Option("--out", help="Profile to write.", show_default=default_calibration_path())] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Coarse grids; on a CPU-only machine a small CPU profile.", show_default="off")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Measure this machine's curves and constants and write a cluster profile (needs the runtime extra)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InvalidPlan("planner calibrate", "torch", "is not installed (it needs the runtime extra)",
                          "pip install 'moe-planner[runtime]'")
    import calibration
    path = out_file
    if path is None:
        from pathlib import Path

        path = default_calibration_path()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    spec = calibration.run(path, quick=quick, progress=progress, command=" ".join(["planner", *sys.argv[2:]]))
    err.print(f"wrote {path} ({spec.name}): use it with --cluster {path}; to fold a GPU calibration into a declared "
              f"profile of the same GPU: python3 -m calibration.merge PROFILE {path}")


class GradLifetimeC(str, Enum):
    freed = "freed"
    accumulate = "accumulate"


@app.command()
def validate(
    plan: Annotated[str, typer.Argument(help="Plan file (planner search --out).")],
    layers: Annotated[Optional[int], typer.Option(help="Truncate to N decoder layers (widths, N and degrees kept).")] = None,
    steps: Annotated[int, typer.Option(help="Steps to run; the last one is compared.")] = 3,
    rank: Annotated[Optional[int], typer.Option(help="Rank to run (default: the rank class that binds).")] = None,
    grad_lifetime: Annotated[GradLifetimeC, typer.Option(help="freed: zero_grad(set_to_none=True) between steps; accumulate: gradients kept.")] = GradLifetimeC.freed,
    json_out: Json = False,
) -> None:
    """Run the plan's own step on this GPU and print predicted beside measured memory per phase (needs torch and a GPU)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InvalidPlan("planner validate", "torch", "is not installed (it needs the runtime extra)",
                          "pip install 'moe-planner[runtime]' on a machine with a GPU")
    runner = importlib.import_module("planner.runtime.validate")  # torch-side; loaded only here
    raise typer.Exit(runner.main(plan, layers=layers, steps=steps, rank=rank, grad_lifetime=_v(grad_lifetime),
                                 json_out=json_out, console=out))


@app.command()
def models(json_out: Json = False) -> None:
    """List the shipped model profiles."""
    from planner.report.models_view import models_table

    models_table(out, json_out)


@app.command("import-hf")
def import_hf(config: Annotated[str, typer.Argument(help="Hugging Face config.json")],
              output: Annotated[Optional[str], typer.Option("-o", "--output", help="Write the model YAML here.", show_default="stdout")] = None,
              name: Annotated[Optional[str], typer.Option(help="Profile name.", show_default="the config's folder or file stem")] = None) -> None:
    """Turn a Hugging Face config.json into a model profile."""
    from pathlib import Path

    from planner.schema.hf_import import import_hf as _imp
    from planner.schema.hf_import import profile_yaml
    from planner.schema.io import check_writable, read_structured, write_text_atomic

    if output:
        check_writable(output, "--output")
    data = read_structured(config)
    if not isinstance(data, dict):
        raise InvalidPlan(config, type(data).__name__, "must hold a JSON object", "pass a config.json")
    from planner.api import refuse_planner_file

    refuse_planner_file(data, config)
    stem = Path(config).parent.name if Path(config).name == "config.json" else Path(config).stem
    spec, warnings = _imp(data, name=name or stem)
    for w in warnings:
        err.print(f"[yellow]warning:[/] {w}")
    text = profile_yaml(spec)
    if output:
        write_text_atomic(output, text, "--output")
        err.print(f"wrote {output}: {spec.param_counts()['total'] / 1e9:.2f}B parameters")
    else:
        sys.stdout.write(text)


def _usage_exception_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage-error classes, abort classes) of every click flavour in use: typer >= 0.29 raises its
    vendored ``typer._click`` exceptions, older typer raises ``click``'s own."""
    import importlib

    usage: list[type] = []
    aborts: list[type] = [typer.Abort]
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        usage.append(mod.ClickException)
        if hasattr(mod, "Abort"):
            aborts.append(mod.Abort)
    return tuple(usage), tuple(aborts)


def _usage_line(e: Exception) -> str:
    """One ``error: …; fix: …`` line for a click/typer usage error (DESIGN §10)."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "planner"
    try:
        msg = e.format_message()
    except Exception:  # noqa: BLE001 - any click flavour: fall back to the plain message
        msg = str(e)
    cause = getattr(e, "__cause__", None)
    errors = getattr(cause, "errors", None)
    if callable(errors):                  # typer coerces through pydantic: name the value typed
        try:
            value = errors()[0].get("input")
        except Exception:  # noqa: BLE001
            value = None
        if value is not None and repr(value) not in msg:
            msg = f"{msg} (got {value!r})"
    msg = " ".join(msg.replace("Value error, ", "").split()).rstrip(".")
    return f"error: {msg}; fix: see '{where} --help' for the commands and options"


def _json_error(message: str, field, code: int) -> None:
    """Under ``--json`` an error is one JSON object on stdout too (the line stays on stderr)."""
    sys.stdout.write(json.dumps({"error": message, "field": None if field is None else str(field),
                                 "exit_code": code}) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to exit codes (2 invalid input, 3 internal error with traceback).

    Usage errors (bad option values, unknown options or commands, missing values) exit 2 with one
    ``error:`` line; bare ``planner`` prints the help and exits 2 (click's convention).
    """
    usage_types, abort_types = _usage_exception_types()
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        rv = app(args=argv, prog_name="planner", standalone_mode=False)
        code = int(rv or 0)
    except PlanError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        code = e.exit_code
        if as_json:
            _json_error(str(e), getattr(e, "field", None), code)
    except typer.Exit as e:
        code = e.exit_code
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except abort_types:
        code = 130
    except usage_types as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()
        else:
            err.print(_usage_line(e), markup=False, highlight=False, soft_wrap=True)
            if as_json:
                param = getattr(e, "param", None)
                opts = getattr(param, "opts", None) or [getattr(param, "name", None)]
                _json_error(_usage_line(e).removeprefix("error: "), opts[0] if param is not None else None, 2)
        code = 2
    except Exception:  # noqa: BLE001 - bugs
        traceback.print_exc()
        err.print("internal error: please report it with the traceback above", markup=False)
        code = 3
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
