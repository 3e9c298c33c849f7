"""``search``, ``sweep`` and ``min-gpus``: the commands that try many plans."""


import json
import os
from enum import Enum
from typing import Annotated, Optional

import typer

from planner.cli.app import app, err, out, print_json, progress_bar
from planner.cli.options import (DEFAULT_BOUND, DEFAULT_DTYPE, GBT, BoundOpt, Cluster, DtypeOpt, GpusPerNode,
                                 GpusReq, HbmGib, HostRamGib, Json, ModelReq, Progress, Routing, SeqLenReq,
                                 count, headroom_option, topology, value)
from planner.api.search import STACKS
from planner.errors import InvalidPlan
from planner.schema.knobs import default
from planner.units import parse_count

MAX_TOP = 1000
"""Most plans ``search --top`` lists."""
MAX_SWEEP_LENGTHS = 64
"""Most lengths one ``sweep`` runs (each is a search)."""
StackC = Enum("StackChoice", {s: s for s in STACKS}, type=str)
"""``--stack``: what ``search --out`` writes (``planner.api.search.STACKS``)."""


@app.command()
def search(
    model: ModelReq, gpus: GpusReq, seq_len: SeqLenReq,
    cluster: Cluster = None, global_batch_tokens: GBT = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    routing: Routing = default("routing"), dispatch_bound: BoundOpt = DEFAULT_BOUND, dtype: DtypeOpt = DEFAULT_DTYPE,
    top: Annotated[int, typer.Option(help="How many composed plans to list.")] = 5,
    min_headroom: headroom_option("a listed plan") = None,
    stack: Annotated[StackC, typer.Option(help="Which plan --out writes: the faster stack that fits (best), or one stack.")] = StackC.best,
    out_file: Annotated[Optional[str], typer.Option("--out", help="Write the chosen plan (--stack) as a plan file.", show_default="none: nothing written")] = None,
    progress: Progress = True,
    json_out: Json = False,
) -> None:
    """Fastest configuration that fits, beside the fastest FSDP2 baseline that fits."""
    from planner import api
    from planner.report.search_view import describe_choice, render_search
    from planner.schema.io import check_writable, write_yaml_atomic

    if not 1 <= top <= MAX_TOP:
        raise InvalidPlan("--top", top, f"must be in [1, {MAX_TOP}]", "list at least one plan, at most a few")
    if out_file is not None:
        if not out_file.strip():
            raise InvalidPlan("--out", out_file, "is an empty path", "give a file name, e.g. --out plan.yaml")
        check_writable(out_file, "--out")
    with progress_bar("searching", progress and not json_out) as cb:
        rep = api.search(model=model, cluster=cluster, gpus=gpus, seq_len=parse_count(seq_len, "--seq-len"),
                         global_batch_tokens=count(global_batch_tokens, "--global-batch-tokens"),
                         routing=routing, dispatch_bound=value(dispatch_bound), dtype=value(dtype), top=top,
                         stack=value(stack), cluster_overrides=topology(hbm_gib, host_ram_gib, gpus_per_node),
                         progress=cb, min_headroom=min_headroom)
    doc = rep.planfile_doc() if out_file else None
    if doc is not None:
        write_yaml_atomic(out_file, doc, "--out")
    if json_out:
        print_json(rep.to_json())
    else:
        render_search(rep, out)
        if doc is not None:
            err.print(f"wrote {describe_choice(rep)} to {out_file} (planner check --plan {out_file})",
                      markup=False, highlight=False)
    raise typer.Exit(0 if rep.chosen is not None and rep.chosen[1] else 1)


@app.command()
def sweep(
    model: ModelReq, gpus: GpusReq,
    seq_lens: Annotated[str, typer.Option("--seq-lens", help="Comma-separated context lengths (32k,64k,...).")],
    cluster: Cluster = None, global_batch_tokens: GBT = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    routing: Routing = default("routing"), dtype: DtypeOpt = DEFAULT_DTYPE,
    min_headroom: headroom_option("a chosen plan") = None,
    csv: Annotated[Optional[str], typer.Option("--csv", help="Write the sweep as CSV.", show_default="none")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write the plot; the suffix picks the format (.png, .pdf, .svg; needs the plot extra).", show_default="none")] = None,
    progress: Progress = True,
    json_out: Json = False,
) -> None:
    """Per context length: best composed plan and best baseline, peak per live set, verdict, throughput."""
    from planner import api
    from planner.report.sweep_view import frame, plot_format, render_sweep, write_csv, write_plot
    from planner.schema.io import check_writable

    items = seq_lens.split(",")
    if not seq_lens.strip() or any(not x.strip() for x in items):
        raise InvalidPlan("--seq-lens", seq_lens, "has an empty item", "write e.g. 32k,64k,128k")
    lens = [parse_count(x, "--seq-lens") for x in items]
    if len(set(lens)) != len(lens):
        raise InvalidPlan("--seq-lens", seq_lens, "lists a length twice", "list each length once")
    if len(lens) > MAX_SWEEP_LENGTHS:
        raise InvalidPlan("--seq-lens", f"{len(lens)} lengths", f"must list at most {MAX_SWEEP_LENGTHS}",
                          "sweep fewer lengths (each runs a search)")
    for path, field in ((csv, "--csv"), (plot, "--plot")):
        if path is not None:
            if not path.strip():
                raise InvalidPlan(field, path, "is an empty path", f"give a file name, e.g. {field} sweep.csv")
            check_writable(path, field)
    if csv and plot and os.path.realpath(csv) == os.path.realpath(plot):
        raise InvalidPlan("--plot", plot, "is the same file as --csv", "write the plot and the CSV to two files")
    if plot:
        plot_format(plot)
    with progress_bar("sweeping", progress and not json_out) as cb:
        rows = api.sweep(model=model, cluster=cluster, gpus=gpus, seq_lens=sorted(lens), routing=routing,
                         dtype=value(dtype), global_batch_tokens=count(global_batch_tokens, "--global-batch-tokens"),
                         cluster_overrides=topology(hbm_gib, host_ram_gib, gpus_per_node), progress=cb,
                         min_headroom=min_headroom)
    if csv:
        write_csv(rows, csv)
    if plot:
        write_plot(rows, plot, f"{model} on {gpus} GPUs: per-rank peak by live set, and throughput")
    if json_out:
        print_json(json.loads(frame(rows).to_json(orient="records")))
    else:
        render_sweep(rows, out)
    raise typer.Exit(0)


@app.command("min-gpus")
def min_gpus(
    model: ModelReq, seq_len: SeqLenReq,
    cluster: Cluster = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    routing: Routing = default("routing"), dispatch_bound: BoundOpt = DEFAULT_BOUND, dtype: DtypeOpt = DEFAULT_DTYPE,
    max_gpus: Annotated[int, typer.Option(help="Largest W tried (powers of two; past one node, --gpus-per-node times a power of two).")] = 4096,
    min_headroom: headroom_option("a fitting plan") = None,
    progress: Progress = True,
    json_out: Json = False,
) -> None:
    """Smallest W (a power of two; whole nodes past one node) at which some composed plan fits with --min-headroom free; the FSDP2 baseline's beside it."""
    from planner import api
    from planner.report.search_view import render_min_gpus

    with progress_bar("trying W", progress and not json_out) as cb:
        rep = api.min_gpus(model=model, seq_len=parse_count(seq_len, "--seq-len"), cluster=cluster,
                           cluster_overrides=topology(hbm_gib, host_ram_gib, gpus_per_node), routing=routing,
                           dispatch_bound=value(dispatch_bound), dtype=value(dtype), max_gpus=max_gpus,
                           min_headroom=min_headroom, progress=cb)
    if json_out:
        print_json(rep.to_json())
    else:
        render_min_gpus(rep, out)
    raise typer.Exit(0 if rep.composed is not None else 1)
