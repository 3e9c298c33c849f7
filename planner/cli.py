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

from planner.errors import InvalidPlan, PlanError
from planner.units import GiB, parse_count, parse_params

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Per-rank memory and step-time planner for long-context MoE training.")
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


class DtypeC(str, Enum):
    bf16 = "bf16"
    fp32 = "fp32"


class ACC(str, Enum):
    full = "full"
    selective = "selective"
    none = "none"


Model = Annotated[Optional[str], typer.Argument(help="Profile name (see `planner models`), model YAML, or HF config.json.")]
PlanOpt = Annotated[Optional[str], typer.Option("--plan", help="Plan file (search --out); flags override its fields.")]
Cluster = Annotated[Optional[str], typer.Option("--cluster", help="Cluster profile name or YAML [default: h200].")]
Gpus = Annotated[Optional[int], typer.Option("--gpus", help="W: ranks (GPUs) in the job.")]
SeqLen = Annotated[Optional[str], typer.Option("--seq-len", help="S: context length (128k, 1m, 131072).")]
GBT = Annotated[Optional[str], typer.Option("--global-batch-tokens", help="Tokens per optimizer step.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


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


def _common(model, plan, cluster, gpus, seq_len, gbt, ov) -> dict:
    return dict(model=model, plan_file=plan, cluster=cluster, gpus=gpus,
                seq_len=_count(seq_len, "--seq-len"), global_batch_tokens=_count(gbt, "--global-batch-tokens"),
                overrides=ov)


@app.command()
def check(
    model: Model = None, plan: PlanOpt = None, cluster: Cluster = None, gpus: Gpus = None,
    seq_len: SeqLen = None, global_batch_tokens: GBT = None,
    dispatch: Annotated[Optional[DispatchC], typer.Option(help="Expert dispatch operator.")] = None,
    expert_parallel: Annotated[Optional[int], typer.Option(help="E_p (baseline: ep).")] = None,
    token_budget: Annotated[Optional[str], typer.Option(help="c: per-source tokens per chunk.")] = None,
    max_chunks: Annotated[Optional[int], typer.Option(help="K_max.")] = None,
    llep_alpha: Annotated[Optional[float], typer.Option(help="α: LLEP capacity factor.")] = None,
    llep_min_tokens: Annotated[Optional[int], typer.Option(help="m: min tokens per spilled GEMM.")] = None,
    llep_lambda: Annotated[Optional[float], typer.Option(help="λ: imbalance threshold.")] = None,
    routing: Annotated[Optional[str], typer.Option(help="balanced | worst | R/H (e.g. 80/16).")] = None,
    dispatch_bound: Annotated[Optional[BoundC], typer.Option(help="Dispatch size the verdict uses.")] = None,
    vocab: Annotated[Optional[VocabC], typer.Option(help="Vocabulary head.")] = None,
    vocab_parallel: Annotated[Optional[int], typer.Option(help="P: vocabulary group size.")] = None,
    vocab_blocks: Annotated[Optional[int], typer.Option(help="B_v: blocks per vocab shard.")] = None,
    optimizer: Annotated[Optional[OptimizerC], typer.Option(help="Optimizer placement.")] = None,
    bucket_params: Annotated[Optional[str], typer.Option(help="β: bucket size in params (100M).")] = None,
    staging_slots: Annotated[Optional[int], typer.Option(help="s: staging slots.")] = None,
    seq_parallel: Annotated[Optional[int], typer.Option(help="D: Ulysses degree.")] = None,
    checkpoint: Annotated[Optional[CheckpointC], typer.Option(help="Activation checkpointing.")] = None,
    sco_host_gib: Annotated[Optional[float], typer.Option(help="SCO host budget per rank, GiB (pinned).")] = None,
    max_imports: Annotated[Optional[int], typer.Option(help="n_import_max.")] = None,
    dtype: Annotated[Optional[DtypeC], typer.Option(help="Activation dtype.")] = None,
    baseline: Annotated[bool, typer.Option("--baseline", help="Evaluate the FSDP2 baseline.")] = False,
    tp: Annotated[Optional[int], typer.Option(help="Baseline tensor parallel.")] = None,
    cp: Annotated[Optional[int], typer.Option(help="Baseline context parallel.")] = None,
    dp_shard: Annotated[Optional[int], typer.Option(help="Baseline FSDP shard degree.")] = None,
    ac: Annotated[Optional[ACC], typer.Option(help="Baseline activation checkpointing.")] = None,
    cpu_offload: Annotated[bool, typer.Option("--cpu-offload", help="Baseline CPUOffloadPolicy.")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Print every term's formula and value.")] = False,
    json_out: Json = False,
) -> None:
    """Does this configuration fit, per rank, in HBM and host RAM? Which term binds?"""
    from planner import api
    from planner.report.check_view import render_check

    ov = _overrides(**{k: v for k, v in locals().items() if k in _OV_KEYS})
    rep = api.check(**_common(model, plan, cluster, gpus, seq_len, global_batch_tokens, ov))
    for w in rep.warnings:
        err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
    if json_out:
        _print_json(rep.to_json())
    else:
        render_check(rep, out, explain=explain)
    raise typer.Exit(0 if rep.fits else 1)


_OV_KEYS = {"dispatch", "expert_parallel", "token_budget", "max_chunks", "llep_alpha", "llep_min_tokens",
            "llep_lambda", "routing", "dispatch_bound", "vocab", "vocab_parallel", "vocab_blocks", "optimizer",
            "bucket_params", "staging_slots", "seq_parallel", "checkpoint", "sco_host_gib", "max_imports",
            "dtype", "baseline", "tp", "cp", "dp_shard", "ac", "cpu_offload"}


def _frontier(kind: str, ctx: typer.Context, **kw) -> None:
    from planner import api
    from planner.report.check_view import render_frontier

    extra = kw.pop("extra")
    ov = _overrides(**{k: v for k, v in kw.items() if k in _OV_KEYS})
    common = _common(kw["model"], kw["plan"], kw["cluster"], kw["gpus"], kw["seq_len"], kw["global_batch_tokens"], ov)
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
    seq_step: Annotated[str, typer.Option(help="Grid step of N (tokens per rank).")] = "1024",
    max_seq_len: Annotated[str, typer.Option(help="Largest S scanned.")] = "16m",
    **kw,
) -> None:
    """Largest context length that fits (whole-grid scan; the peak is not monotone in S)."""
    kw["extra"] = {"seq_step": parse_count(seq_step, "--seq-step"), "max_seq_len": parse_count(max_seq_len, "--max-seq-len")}
    _frontier("context", None, **kw)


@app.command("max-batch")
@_frontier_signature
def max_batch(
    max_tokens: Annotated[str, typer.Option(help="Largest tokens per sequence group scanned.")] = "16m",
    **kw,
) -> None:
    """Largest global batch per micro-step that fits at the given S (whole-grid scan)."""
    kw["extra"] = {"max_tokens": parse_count(max_tokens, "--max-tokens")}
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
    gpus: Annotated[int, typer.Option("--gpus", help="W: ranks (GPUs) in the job.")],
    seq_len: Annotated[str, typer.Option("--seq-len", help="S: context length (128k, 1m).")],
    cluster: Cluster = None, global_batch_tokens: GBT = None,
    routing: Annotated[str, typer.Option(help="balanced | worst | R/H, for both stacks.")] = "balanced",
    dispatch_bound: Annotated[BoundC, typer.Option(help="Dispatch size the verdicts use.")] = BoundC.guarantee,
    dtype: Annotated[DtypeC, typer.Option(help="Activation dtype.")] = DtypeC.bf16,
    top: Annotated[int, typer.Option(help="How many composed plans to list.")] = 5,
    out_file: Annotated[Optional[str], typer.Option("--out", help="Write the best plan as a plan file.")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    json_out: Json = False,
) -> None:
    """Fastest configuration that fits, beside the fastest FSDP2 baseline that fits."""
    from planner import api
    from planner.report.search_view import render_search
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
                         routing=routing, dispatch_bound=_v(dispatch_bound), dtype=_v(dtype), top=top, progress=cb)
    finally:
        if prog:
            prog.stop()
    if out_file and (rep.result.top or rep.closest is not None):
        write_yaml_atomic(out_file, rep.planfile(0).model_dump(mode="json"), "--out")
    if json_out:
        _print_json(rep.to_json())
    else:
        render_search(rep, out)
        if out_file and (rep.result.top or rep.closest is not None):
            which = "best" if rep.result.top else "closest (none fits)"
            err.print(f"wrote the {which} plan to {out_file} (planner check --plan {out_file})")
    raise typer.Exit(0 if rep.result.top else 1)


@app.command()
def sweep(
    model: Annotated[str, typer.Argument(help="Profile name, model YAML, or HF config.json.")],
    gpus: Annotated[int, typer.Option("--gpus", help="W: ranks (GPUs) in the job.")],
    seq_lens: Annotated[str, typer.Option("--seq-lens", help="Comma-separated context lengths (32k,64k,...).")],
    cluster: Cluster = None,
    routing: Annotated[str, typer.Option(help="balanced | worst | R/H, for both stacks.")] = "balanced",
    dtype: Annotated[DtypeC, typer.Option(help="Activation dtype.")] = DtypeC.bf16,
    csv: Annotated[Optional[str], typer.Option("--csv", help="Write the sweep as CSV.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write a PNG (needs the plot extra).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    json_out: Json = False,
) -> None:
    """Per context length: best composed plan and best baseline, peak per live set, verdict, throughput."""
    from planner import api
    from planner.report.sweep_view import frame, render_sweep, write_csv, write_plot
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
    prog, cb = _progress("sweeping", progress and not json_out)
    try:
        if prog:
            prog.start()
        rows = api.sweep(model=model, cluster=cluster, gpus=gpus, seq_lens=sorted(lens), routing=routing,
                         dtype=_v(dtype), progress=cb)
    finally:
        if prog:
            prog.stop()
    if csv:
        write_csv(rows, csv)
    if plot:
        write_plot(rows, plot, f"{model} on {gpus} GPUs: per-rank peak by live set")
    if json_out:
        _print_json(json.loads(frame(rows).to_json(orient="records")))
    else:
        render_sweep(rows, out)
    raise typer.Exit(0)


@app.command()
def calibrate(
    out_file: Annotated[Optional[str], typer.Option("--out", help="Profile to write [default: profiles/clusters/<gpu>.yaml measured copy].")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Coarse grids; on a CPU-only machine a small CPU profile.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Measure this machine's curves and constants and write a cluster profile (needs the runtime extra)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InvalidPlan("planner calibrate", "torch", "is not installed (it needs the runtime extra)",
                          "pip install 'moe-planner[runtime]'")
    import calibration
    path = out_file or "profiles/clusters/measured.yaml"
    spec = calibration.run(path, quick=quick, progress=progress, command=" ".join(["planner", *sys.argv[2:]]))
    err.print(f"wrote {path} ({spec.name}): use it with --cluster {path}; to fold a GPU calibration into a declared "
              f"profile of the same GPU: python3 -m calibration.merge PROFILE {path}")


@app.command()
def models(json_out: Json = False) -> None:
    """List the shipped model profiles."""
    from planner.report.models_view import models_table

    models_table(out, json_out)


@app.command("import-hf")
def import_hf(config: Annotated[str, typer.Argument(help="Hugging Face config.json")],
              output: Annotated[Optional[str], typer.Option("-o", "--output", help="Write the model YAML here.")] = None,
              name: Annotated[Optional[str], typer.Option(help="Profile name [default: folder or file stem].")] = None) -> None:
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


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to exit codes (2 invalid input, 3 internal error with traceback).

    Usage errors (bad option values, unknown options or commands, missing values) exit 2 with one
    ``error:`` line; bare ``planner`` prints the help and exits 2 (click's convention).
    """
    usage_types, abort_types = _usage_exception_types()
    try:
        rv = app(args=argv, prog_name="planner", standalone_mode=False)
        code = int(rv or 0)
    except PlanError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        code = e.exit_code
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
