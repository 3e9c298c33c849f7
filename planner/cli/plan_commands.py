"""``check``, ``max-context`` and ``max-batch``: one configuration's verdict, and its frontiers.

Each command declares its own options, takes the knob options from the registry
(``options.knob_options``), and forwards everything by keyword to one api function.
"""


from typing import Annotated, Optional

import typer

from planner.cli.app import app, out, print_json, warn
from planner.cli.options import (GBT, Baseline, Cluster, Gpus, GpusPerNode, HbmGib, HostRamGib, Json, Model,
                                 MtpTrained, PlanOpt, SeqLen, Seqs, count, headroom_option, knob_options, launch)
from planner.errors import InvalidPlan
from planner.schema.knobs import plan_overrides
from planner.units import parse_count



@app.command()
@knob_options
def check(
    model: Model = None, plan: PlanOpt = None, cluster: Cluster = None, gpus: Gpus = None,
    seq_len: SeqLen = None, global_batch_tokens: GBT = None, seqs_per_microbatch: Seqs = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    mtp_trained: MtpTrained = None, baseline: Baseline = False,
    min_headroom: headroom_option("a plan that fits (its headroom line; the verdict is against the usable capacity)") = None,
    explain: Annotated[bool, typer.Option("--explain", help="Print every term's formula and value.", show_default="off")] = False,
    json_out: Json = False, **knobs,
) -> None:
    """Does this configuration fit, per rank, in HBM and host RAM? Which term binds?"""
    from planner import api
    from planner.report.check_view import render_check

    rep = api.check(**launch(model=model, plan=plan, cluster=cluster, gpus=gpus, seq_len=seq_len,
                             global_batch_tokens=global_batch_tokens, seqs_per_microbatch=seqs_per_microbatch,
                             hbm_gib=hbm_gib, host_ram_gib=host_ram_gib, gpus_per_node=gpus_per_node,
                             mtp_trained=mtp_trained),
                    overrides=plan_overrides(knobs, baseline=baseline), min_headroom=min_headroom)
    warn(rep.warnings)
    if json_out:
        print_json(rep.to_json())
    else:
        render_check(rep, out, explain=explain)
    raise typer.Exit(0 if rep.fits else 1)


def _not_scanned(command: str, flag: str, given, why: str) -> None:
    """Refuse the flag of the quantity ``command`` scans: it would be silently ignored."""
    if given is not None:
        raise InvalidPlan(flag, given, f"does not apply to {command}", f"drop it: {why}")


def _frontier(scan: str, build_kw: dict, overrides: dict, json_out: bool, **scan_kw) -> None:
    """Both frontier commands: forward to ``api.<scan>`` by keyword, print, exit 0 when a point fits."""
    from planner import api
    from planner.report.check_view import render_frontier

    rep = getattr(api, scan)(**build_kw, overrides=overrides, **scan_kw)
    if json_out:
        print_json(rep.to_json())
    else:
        render_frontier(rep, out)
    raise typer.Exit(0 if rep.scan.best is not None else 1)


@app.command("max-context")
@knob_options
def max_context(
    model: Model = None, plan: PlanOpt = None, cluster: Cluster = None, gpus: Gpus = None,
    seq_len: SeqLen = None, global_batch_tokens: GBT = None, seqs_per_microbatch: Seqs = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    mtp_trained: MtpTrained = None, baseline: Baseline = False,
    seq_step: Annotated[Optional[str], typer.Option(help="Grid step of S (total context, like --max-seq-len), rounded up to a multiple of D.", show_default="1k × D")] = None,
    max_seq_len: Annotated[str, typer.Option(help="Largest S (total context) scanned.")] = "16m",
    min_headroom: headroom_option("a fitting point") = None,
    json_out: Json = False, **knobs,
) -> None:
    """Largest context length that fits (whole-grid scan; the peak is not monotone in S)."""
    _not_scanned("max-context", "--seq-len", seq_len, "it scans S; bound the scan with --max-seq-len and --seq-step")
    _frontier("max_context", launch(model=model, plan=plan, cluster=cluster, gpus=gpus, seq_len=seq_len,
                                   global_batch_tokens=global_batch_tokens, seqs_per_microbatch=seqs_per_microbatch,
                                   hbm_gib=hbm_gib, host_ram_gib=host_ram_gib, gpus_per_node=gpus_per_node,
                                   mtp_trained=mtp_trained), plan_overrides(knobs, baseline=baseline), json_out,
              seq_step=count(seq_step, "--seq-step"), max_seq_len=parse_count(max_seq_len, "--max-seq-len"),
              min_headroom=min_headroom)


@app.command("max-batch")
@knob_options
def max_batch(
    model: Model = None, plan: PlanOpt = None, cluster: Cluster = None, gpus: Gpus = None,
    seq_len: SeqLen = None, global_batch_tokens: GBT = None, seqs_per_microbatch: Seqs = None,
    hbm_gib: HbmGib = None, host_ram_gib: HostRamGib = None, gpus_per_node: GpusPerNode = None,
    mtp_trained: MtpTrained = None, baseline: Baseline = False,
    max_tokens: Annotated[str, typer.Option(help="Largest tokens per sequence group scanned.")] = "16m",
    min_headroom: headroom_option("a fitting point") = None,
    json_out: Json = False, **knobs,
) -> None:
    """Largest global batch per micro-step that fits at the given S (whole-grid scan)."""
    _not_scanned("max-batch", "--seqs-per-microbatch", seqs_per_microbatch,
                 "it scans the sequences per micro-batch; bound the scan with --max-tokens")
    _frontier("max_batch", launch(model=model, plan=plan, cluster=cluster, gpus=gpus, seq_len=seq_len,
                                 global_batch_tokens=global_batch_tokens, seqs_per_microbatch=seqs_per_microbatch,
                                 hbm_gib=hbm_gib, host_ram_gib=host_ram_gib, gpus_per_node=gpus_per_node,
                                 mtp_trained=mtp_trained), plan_overrides(knobs, baseline=baseline), json_out,
              max_tokens=parse_count(max_tokens, "--max-tokens"), min_headroom=min_headroom)
