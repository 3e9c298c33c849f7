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
from pathlib import Path

from calibration import config
from calibration.io import write_text_atomic, write_yaml_atomic
from planner.errors import InvalidPlan, PlanError
from planner.schema import cluster_constants
from planner.schema.io import check_writable

ASSUMED = {c.name: (c.default, ("policy: " if c.default_status == "policy" else "") + c.default_note)
           for c in cluster_constants.CONSTANTS}
"""Value and note of each memory constant when this run does not measure it (the registry's unmeasured
default, ``planner.schema.cluster_constants``): status ``policy`` for the reserve floors (chosen
margins), ``assumed`` for the rest."""

POLICY = tuple(c.name for c in cluster_constants.CONSTANTS if c.default_status == "policy")

CUDA_ONLY = ("constants", "fragmentation", "dispatch_kernels", "memory_sizes")


@dataclass
class RunState:
    """What one run measured, for the summary and the tests."""

    curves: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    host_mem_bw: float = 0.0


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


def _section(name: str, grid, device, prov, st: RunState, bar: _Bar) -> None:
    from calibration import chunks, compute, constants, optimizer, transfer

    tick = bar.tick
    if name == "constants":
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


def _assemble(name: str, prov: dict, st: RunState):
    from calibration.constants import expandable_segments
    from planner.timing.curves import parse_cluster

    memory = {k: st.memory.get(k) or {"value": v, "status": "policy" if k in POLICY else "assumed",
                                      "note": note.removeprefix("policy: ")}
              for k, (v, note) in ASSUMED.items()}
    memory["expandable_segments"] = expandable_segments()
    data = {"name": name, "topology": _topology(prov, st), "memory": memory,
            "curves": {k: c.model_dump(mode="json") for k, c in st.curves.items()}}
    return parse_cluster(data)


def run(out_path, *, quick: bool, progress: bool = True, command: str, smoke: bool = False,
        name: str | None = None, only: tuple[str, ...] | None = None):
    """Calibrate this machine and write its cluster profile to ``out_path`` (atomically).

    Args:
        out_path: the profile YAML to write; a markdown summary goes next to it (``<stem>.summary.md``).
        quick: a coarse grid on a GPU; on a machine without CUDA, the small CPU profile CI uses.
        progress: show a rich progress bar.
        command: the command line recorded in every curve's provenance.
        smoke: every section at tiny shapes on any device (code-path check; not a real profile).
        name: profile name (default: the file's stem).
        only: run just these sections (a partial profile to merge with ``calibration.merge``).
    Returns:
        The ``ClusterSpec`` written.
    Raises:
        planner.errors.InvalidPlan: a full calibration without CUDA, or measurements that do not
        validate (nothing is written then).
    """
    out, summary = output_paths(out_path)
    _ensure_alloc_conf()
    import torch

    from planner.runtime.measure import provenance

    cuda = torch.cuda.is_available()
    grid = config.choose(quick=quick, smoke=smoke, cuda=cuda)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    prov = provenance(command)
    st = RunState()
    LAST_RUN[:] = [st]
    sections = [s for s in grid.sections if (cuda or s not in CUDA_ONLY) and (only is None or s in only)]
    st.skipped += [f"{s}: needs CUDA" for s in grid.sections
                   if s not in sections and s in CUDA_ONLY and not cuda and (only is None or s in only)]
    t_all = time.perf_counter()
    with _Bar(progress, _units(grid, sections)) as bar:
        for sec in sections:
            bar.section(sec)
            t0 = time.perf_counter()
            try:
                _section(sec, grid, device, prov, st, bar)
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
    _write_outputs(out, summary, spec.model_dump(mode="json"), text)
    return spec


class Interrupted(PlanError):
    """An interrupt after the profile was replaced: the profile is complete, the summary is not."""

    exit_code = 130


def output_paths(out_path) -> tuple[Path, Path]:
    """(profile, summary) paths, both checked writable before anything is measured. The summary is
    ``<stem>.summary.md`` beside the profile, so it never replaces the profile or a ``<stem>.md``.

    Raises:
        planner.errors.InvalidPlan: ``--out`` ends in ``.md`` (the summary's extension), or a path
            cannot be written.
    """
    out = Path(out_path)
    if out.suffix.lower() == ".md":
        raise InvalidPlan("--out", str(out), "ends in .md, the extension of the calibration summary",
                          "give the profile a .yaml name (its summary goes to <stem>.summary.md)")
    summary = out.with_name(f"{out.stem}.summary.md")
    check_writable(out, "--out")
    check_writable(summary, "--out (its summary)")
    return out, summary


def _write_outputs(out: Path, summary: Path, profile: dict, text: str) -> None:
    """Profile then summary, each atomically; SIGTERM during the writes raises ``SystemExit`` so
    the temp file is removed (``write_bytes_atomic``'s ``finally``)."""
    import signal
    import threading

    def _term(signum, frame):
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _term) if main else None
    written = False
    try:
        write_yaml_atomic(out, profile, "--out")
        written = True
        write_text_atomic(summary, text, "--out (its summary)")
    except (KeyboardInterrupt, SystemExit):
        if written:
            raise Interrupted(f"interrupted after {out} was written (the profile is complete); its summary "
                              f"{summary} was not written") from None
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)
