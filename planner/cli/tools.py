"""``calibrate``, ``validate``, ``models`` and ``import-hf``: the commands around the planner."""


import sys
from typing import Annotated, Optional

import typer

from planner.cli.app import app, err, out
from planner.cli.options import Json, default_calibration_path, value
from planner.errors import InvalidPlan
from planner.schema.knobs import enum_of


@app.command()
def calibrate(
    out_file: Annotated[Optional[str], typer.Option("--out", help="Profile to write.", show_default=default_calibration_path())] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Coarse grids; on a CPU-only machine a small CPU profile.", show_default="off")] = False,
    sections: Annotated[Optional[str], typer.Option(help="Comma-separated subset of sections (a partial profile, to fold in with python3 -m calibration.merge).", show_default="every section")] = None,
    attention_budget_s: Annotated[Optional[float], typer.Option("--attention-budget-s", help="Wall budget of the long-context attention section; points beyond it are skipped, named in the summary, and priced by the rules listed under 'assumed'.", show_default="240 s; 60 s with --quick")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Measure this machine's curves and constants and write a cluster profile (needs the runtime extra).

    Every curve the time model reads: GEMM and attention tables, long-context attention variants, copies, AdamW (GPU and host), the chunk-count curve, the dispatch kernels at every shipped width, SCO against plain checkpointing, the FSDP2 host rows, and the memory constants. 5.5 minutes on one H100 with --attention-budget-s 160 (measured before lengths were grouped by variant), most of it that budget."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InvalidPlan("planner calibrate", "torch", "is not installed (it needs the runtime extra)",
                          "pip install 'moe-planner[runtime]'")
    import calibration
    from calibration.io import command_line
    from calibration.runner import preflight, request_from_flags

    only, budgets = request_from_flags(sections, attention_budget_s)
    preflight(quick=quick, only=only, budgets=budgets)
    path = out_file
    if path is None:
        from pathlib import Path

        path = default_calibration_path()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    spec = calibration.run(path, quick=quick, progress=progress, command=command_line("planner", sys.argv[1:]),
                           only=only, budgets=budgets)
    say = dict(markup=False, highlight=False, soft_wrap=True)
    err.print(f"wrote {path} ({spec.name}): use it with --cluster {path}"
              + (f"; to fold it into a declared profile of the same GPU: python3 -m calibration.merge PROFILE {path}"
                 if spec.topology.gpu_name != "cpu" else ""), **say)
    from calibration.io import summary_path
    from calibration.runner import LAST_RUN

    st, summary = LAST_RUN[0], summary_path(path)
    if st.skipped:
        err.print(f"skipped {len(st.skipped)} (listed in {summary}; the time model names its rule for each under "
                  f"'assumed'): " + "; ".join(st.skipped[:3]) + (" …" if len(st.skipped) > 3 else ""), **say)
    for msg in st.failed:
        err.print(f"FAILED: {msg}", **say)
    if st.failed:
        raise typer.Exit(1)


GradLifetimeC = enum_of("grad_lifetime")


@app.command()
def validate(
    plan: Annotated[str, typer.Argument(help="Plan file (planner search --out).")],
    layers: Annotated[Optional[int], typer.Option(help="Truncate to N decoder layers (widths, N and degrees kept).", show_default="all layers")] = None,
    steps: Annotated[int, typer.Option(help="Steps to run (a real run steps on until its timed window is filled); the last one is compared.")] = 3,
    rank: Annotated[Optional[int], typer.Option(help="Rank to run.", show_default="the rank class that binds")] = None,
    grad_lifetime: Annotated[Optional[GradLifetimeC], typer.Option(help="freed: zero_grad(set_to_none=True) between steps; accumulate: gradients kept. Default: an FSDP2 plan's baseline.grad_lifetime, freed for the composed stack.")] = None,
    json_out: Json = False,
) -> None:
    """Run the plan's own step on this GPU and print predicted beside measured memory per phase (needs torch and a GPU)."""
    import importlib
    import importlib.util
    import os

    from planner.schema.io import shipped

    if plan in shipped("models") and not os.path.exists(plan):
        raise InvalidPlan("PLAN", plan, "is a model name, not a plan file",
                          f"write a plan first: planner search {plan} --gpus W --seq-len S --out plan.yaml")
    from planner.schema.io import load_planfile

    load_planfile(plan)   # a bad plan file is named first, with or without torch
    if importlib.util.find_spec("torch") is None:
        raise InvalidPlan("planner validate", "torch", "needs torch, which is not installed",
                          "install the runtime extra on a machine with a GPU: pip install 'moe-planner[runtime]' "
                          "(torch>=2.11 with CUDA)")
    runner = importlib.import_module("planner.runtime.validate")  # torch-side; loaded only here
    raise typer.Exit(runner.main(plan, layers=layers, steps=steps, rank=rank, grad_lifetime=value(grad_lifetime),
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
    from planner.schema.hf_import import default_profile_name, profile_doc, profile_yaml
    from planner.schema.io import check_writable, read_structured, structured_text, write_text_atomic

    if output is not None:
        check_writable(output, "--output")
        if Path(output).exists() and Path(output).resolve() == Path(config).resolve():
            raise InvalidPlan("--output", output, "is the config being imported",
                              "write the profile to another file, e.g. -o model.yaml")
    data = read_structured(config)
    if not isinstance(data, dict):
        raise InvalidPlan(config, type(data).__name__, "must hold a JSON object", "pass a config.json")
    from planner.api import refuse_planner_file

    refuse_planner_file(data, config)
    spec, warnings = _imp(data, name=name or default_profile_name(config))
    for w in warnings:
        err.print(f"[yellow]warning:[/] {w}")
    text = profile_yaml(spec)
    if output is not None:
        write_text_atomic(output, structured_text(output, profile_doc(spec), text), "--output")
        err.print(f"wrote {output}: {spec.param_counts()['total'] / 1e9:.2f}B parameters", markup=False, highlight=False)
    else:
        sys.stdout.write(text)
