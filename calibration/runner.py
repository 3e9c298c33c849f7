"""``calibration.run``: measure every section of the chosen grid and write a cluster profile.

Nothing is written until every section has run: the profile is assembled, validated
(``planner.timing.curves.parse_cluster``) and then written with ``write_yaml_atomic``, so an
exception or ``KeyboardInterrupt`` at any point leaves the old profile intact. A section that
raises an ordinary exception is reported (stderr, the markdown summary, ``LAST_RUN.failed``) and
leaves its curve absent; interrupts propagate.

The topology written is the one detected on this machine (``topology_status: measured``); use
``calibration.merge`` to fold the measurements into a declared profile instead.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field

from calibration import config
from calibration.config import CUDA_ONLY, check_request
from calibration.io import Interrupted, output_paths, write_outputs  # noqa: F401 - re-exported
from planner.schema import cluster_constants

ASSUMED = {c.name: (c.default, ("policy: " if c.default_status == "policy" else "") + c.default_note)
           for c in cluster_constants.CONSTANTS}
"""Value and note of each memory constant when this run does not measure it (the registry's unmeasured
default, ``planner.schema.cluster_constants``): status ``policy`` for the reserve floors (chosen
margins), ``assumed`` for the rest."""

POLICY = tuple(c.name for c in cluster_constants.CONSTANTS if c.default_status == "policy")


@dataclass
class RunState:
    """What one run measured, for the summary and the tests."""

    curves: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    host_mem_bw: float = 0.0
    dispatch_shared: dict | None = None
    """The ``dispatch_kernels`` section's sustained-GEMM and host-loop documents (reused by
    ``dispatch_widths``)."""


LAST_RUN: list[RunState] = []
"""The state of the most recent ``run`` (one element)."""


def _ensure_alloc_conf() -> None:
    """Expandable segments for the allocator, unless the user chose otherwise (before CUDA starts)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


class _Bar:
    """A rich progress bar, or nothing."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self._p, self._task = enabled, total, None, None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)

            self._p = Progress(TextColumn("[bold]calibrate[/] {task.description:<14}"), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(), transient=False)
            self._p.__enter__()
            self._task = self._p.add_task("", total=self.total)
        return self

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)

    def section(self, name: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=name)

    def tick(self, n: int = 1) -> None:
        if self._p is not None:
            self._p.advance(self._task, n)

    def log(self, msg: str) -> None:
        if self._p is not None:
            self._p.console.print(msg)
        else:
            print(re.sub(r"\[/?[a-z ]*\]", "", msg), file=sys.stderr)


def _units(grid: config.Grid, sections) -> int:
    from calibration import chunks, compute, optimizer, transfer

    n = {**compute.counts(grid), **transfer.counts(grid), **optimizer.counts(grid),
         "chunk_count": chunks.count(grid.name == "smoke")}
    return sum(n.get(s, 1) for s in sections)


def _measured(value: float, note: str, prov: dict) -> dict:
    return {"value": float(value), "status": "measured", "provenance": prov, "note": note}


def _coverage_section(name: str, grid, device, prov, st: RunState, bar: _Bar, budgets: dict) -> None:
    from calibration import coverage_sections
    from planner.schema.curves import Curves

    curves, skipped = coverage_sections.run(name, grid.name, device, prov, budget_s=budgets.get(name),
                                            log=bar.log, shared=st.dispatch_shared)
    validated = Curves.model_validate(curves)   # a malformed section fails alone
    st.curves.update({k: getattr(validated, k) for k in curves})
    st.skipped += [f"{name}: {why}" for why in skipped]
    bar.tick(1)


def _section(name: str, grid, device, prov, st: RunState, bar: _Bar, budgets: dict | None = None) -> None:
    from calibration import chunks, compute, constants, coverage_sections, optimizer, transfer

    tick = bar.tick
    if name in coverage_sections.SECTIONS:
        _coverage_section(name, grid, device, prov, st, bar, budgets or {})
    elif name == "constants":
        ctx, method = constants.context_bytes()
        st.memory["_context_init"] = (ctx, method)
        for key, (v, note) in constants.blas_workspaces().items():
            st.memory[key] = _measured(v, note, prov)
        st.memory["flash_workspace_bytes_per_elem"] = _measured(*constants.flash_workspace(grid), prov)
        st.memory["pin_seconds_per_gib"] = _measured(*constants.pin_seconds_per_gib(grid), prov)
        st.memory["host_baseline_bytes_per_rank"] = _measured(*constants.host_baseline(), prov)
        tick(1)
    elif name == "gemm":
        st.curves["gemm"] = compute.gemm_table(grid, device, prov, tick)
    elif name == "gemm_fp32":
        st.curves["gemm_fp32"] = compute.gemm_fp32_table(grid, device, prov, tick)
    elif name == "grouped_gemm":
        st.curves["grouped_gemm"] = compute.grouped_gemm_table(grid, device, prov, tick)
    elif name == "attention":
        st.curves["attention_fwd"], st.curves["attention_bwd"] = compute.attention_tables(grid, device, prov, tick)
    elif name == "transfer":
        st.curves.update(transfer.transfer_curves(grid, device, prov, tick))
    elif name == "gpu_adamw":
        st.curves["gpu_adamw"] = optimizer.gpu_adamw_curve(grid, device, prov, tick)
    elif name == "cpu_adamw":
        st.curves["cpu_adamw"] = optimizer.cpu_adamw_table(grid, prov, tick)
    elif name == "cpu_cast":
        st.curves["cpu_cast"] = optimizer.cpu_cast_table(grid, prov, tick)
    elif name == "fragmentation":
        st.memory["fragmentation_fraction"] = _measured(*constants.fragmentation(grid), prov)
        tick(1)
    elif name == "host_copy":
        st.host_mem_bw = transfer.host_copy_bytes_per_s(grid)
        tick(1)
    elif name == "chunk_count":
        try:
            st.curves["chunk_count"] = chunks.chunk_curve(smoke=grid.name == "smoke", device=device, prov=prov,
                                                          tick=tick, min_time_s=grid.min_time_s, iters=grid.iters)
        except chunks.Skipped as why:
            st.skipped.append(f"chunk_count: {why}")
            bar.log(f"[yellow]skipped[/] {why}")
    elif name == "dispatch_kernels":
        from calibration import dispatch_kernels
        from planner.schema.curves import DispatchKernelsCurve

        doc = dispatch_kernels.measure(grid.name == "smoke", prov["command"])
        st.dispatch_shared = {"sustained": doc["sustained"], "host_blocks": doc["host_blocks"]}
        st.curves["dispatch_kernels"] = DispatchKernelsCurve.model_validate(
            {**dispatch_kernels.curve_data(doc), "provenance": {**doc["provenance"], **prov}})
        tick(1)
    elif name == "memory_sizes":
        from calibration import memory_sizes
        from planner.schema.curves import MemorySizesCurve

        doc = memory_sizes.measure(grid.name == "smoke", prov["command"])
        st.curves["memory_sizes"] = MemorySizesCurve.model_validate(
            {**memory_sizes.curve_data(doc), "provenance": {**doc["provenance"], **prov}})
        tick(1)
    else:
        raise AssertionError(f"unknown section {name}")


def _topology(prov: dict, st: RunState) -> dict:
    import torch

    mem_total = 0
    try:
        with open("/proc/meminfo") as fh:
            mem_total = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cuda = torch.cuda.is_available()
    return {"gpu_name": prov["device"],
            "hbm_bytes": int(torch.cuda.get_device_properties(0).total_memory) if cuda else int(mem_total),
            "gpus_per_node": max(1, torch.cuda.device_count() if cuda else 1),
            "host_ram_bytes": int(mem_total), "host_cores": os.cpu_count() or 1,
            "host_mem_bw_bytes_per_s": float(st.host_mem_bw) if st.host_mem_bw > 0 else 1.0,
            "interconnect": "",
            "topology_status": "measured"}


def _dump(curve):
    """JSON data of a curve, or of a list or mapping of curves (``dispatch_kernels_widths``,
    ``attention_long``)."""
    if isinstance(curve, list):
        return [_dump(c) for c in curve]
    if isinstance(curve, dict):
        return {k: _dump(c) for k, c in curve.items()}
    return curve.model_dump(mode="json")


def _assemble(name: str, prov: dict, st: RunState):
    from calibration.constants import expandable_segments
    from planner.timing.curves import parse_cluster

    memory = {k: st.memory.get(k) or {"value": v, "status": "policy" if k in POLICY else "assumed",
                                      "note": note.removeprefix("policy: ")}
              for k, (v, note) in ASSUMED.items()}
    memory["expandable_segments"] = expandable_segments()
    data = {"name": name, "topology": _topology(prov, st), "memory": memory,
            "curves": {k: _dump(c) for k, c in st.curves.items()}}
    return parse_cluster(data)


def request_from_flags(sections: str | None, attention_budget_s: float | None) -> tuple:
    """``(only, budgets)`` of ``run`` from the command-line flags ``--sections A,B`` (items
    stripped, empty ones dropped) and ``--attention-budget-s``."""
    only = tuple(x.strip() for x in sections.split(",") if x.strip()) if sections is not None else None
    return only, ({"attention_long": attention_budget_s} if attention_budget_s is not None else None)


def preflight(*, quick: bool, smoke: bool = False, only=None, budgets=None) -> None:
    """What ``run`` refuses before measuring (a full grid without CUDA, sections and budgets
    ``config.check_request`` refuses for the grid chosen here), with the command-line flags' names,
    before the command makes a folder or anything else."""
    import torch

    cuda = torch.cuda.is_available()
    check_request(only, budgets, config.choose(quick=quick, smoke=smoke, cuda=cuda), cuda, names=config.FLAG_NAMES)


def run(out_path, *, quick: bool, progress: bool = True, command: str, smoke: bool = False,
        name: str | None = None, only: tuple[str, ...] | None = None, budgets: dict | None = None):
    """Calibrate this machine and write its cluster profile to ``out_path`` (atomically).

    Args:
        out_path: the profile YAML to write; a markdown summary goes next to it (``<stem>.summary.md``).
        quick: a coarse grid on a GPU; on a machine without CUDA, the small CPU profile CI uses.
        progress: show a rich progress bar.
        command: the command line recorded in every curve's provenance.
        smoke: every section at tiny shapes on any device (code-path check; not a real profile).
        name: profile name (default: the file's stem).
        only: run just these sections (a partial profile to merge with ``calibration.merge``).
        budgets: wall budget in seconds per coverage section (``calibration.coverage_sections``;
            absent: the grid's default).
    Returns:
        The ``ClusterSpec`` written.
    Raises:
        planner.errors.InvalidPlan: a full calibration without CUDA, ``only`` or ``budgets`` that
        ``config.check_request`` refuses, an ``out_path`` that names a folder, or measurements that
        do not validate (nothing is written then).
    """
    _ensure_alloc_conf()
    import torch

    from planner.runtime.measure import provenance

    cuda = torch.cuda.is_available()
    grid = config.choose(quick=quick, smoke=smoke, cuda=cuda)
    check_request(only, budgets, grid, cuda)
    out, summary = output_paths(out_path)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    prov = provenance(command)
    st = RunState()
    LAST_RUN[:] = [st]
    sections = [s for s in grid.sections if (cuda or s not in CUDA_ONLY) and (only is None or s in only)]
    st.skipped += [f"{s}: needs CUDA" for s in grid.sections      # a requested one is refused by check_request
                   if s not in sections and s in CUDA_ONLY and not cuda and only is None]
    t_all = time.perf_counter()
    with _Bar(progress, _units(grid, sections)) as bar:
        for sec in sections:
            bar.section(sec)
            t0 = time.perf_counter()
            try:
                _section(sec, grid, device, prov, st, bar, budgets or {})
            except Exception as err:  # noqa: BLE001 - one broken section must not lose the others
                st.failed.append(f"{sec}: {type(err).__name__}: {err}")
                bar.log(f"[red]failed[/] {sec}: {type(err).__name__}: {err}")
            st.timings[sec] = time.perf_counter() - t0
            if cuda:
                torch.cuda.empty_cache()
    ctx0, _ = st.memory.pop("_context_init", (None, ""))
    if cuda and "constants" in sections:  # a partial run loads too few kernels to size the context
        from calibration.constants import context_bytes

        try:
            ctx1, method = context_bytes()
            st.memory["cuda_context_bytes"] = _measured(
                ctx1, f"device used ({method}) − allocator reserved at the end of the run, kernels of "
                      f"every section loaded; right after CUDA init it was {ctx0} B", prov)
        except Exception as err:  # noqa: BLE001 - keep the rest of the profile
            st.failed.append(f"cuda_context_bytes: {type(err).__name__}: {err}")
    st.timings["total"] = time.perf_counter() - t_all
    spec = _assemble(name or out.stem, prov, st)
    from calibration.report import summary_markdown

    text = summary_markdown(
        f"Calibration ({grid.name}) of {prov['device']}", prov, spec.curves,
        {k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v
         for k, v in dict(spec.memory).items()}, st.timings, st.skipped + st.failed)
    write_outputs(out, summary, spec.model_dump(mode="json"), text)
    return spec
