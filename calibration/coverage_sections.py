"""The sections of ``planner calibrate`` that cover where the time model would otherwise
extrapolate: long-context attention variants, the dispatch kernels at every shipped width, SCO
against plain checkpointing, and the FSDP2 baseline's host seconds.

Each runs under its own wall budget (``calibration.wall_budget.Clock``); a point that would pass it
is skipped and named in the run's ``skipped`` list, and the profile then lacks that point (the time
model lists the rule it applies there under ``assumed``).
"""

from __future__ import annotations

SECTIONS = ("dispatch_widths", "sco", "baseline_host", "attention_long")
"""Run order: the long-context attention last, as the only section whose points are skipped on a
normal run (its budget decides how far in ``S`` it reaches)."""


BUDGETED = ("dispatch_widths", "sco", "attention_long")
"""The sections with a wall budget (``baseline_host`` runs fixed cases, about a minute)."""


def default_budget_s(section: str, grid: str) -> float:
    """The wall budget of a ``BUDGETED`` section on ``grid`` (``full``, ``quick`` or ``smoke``)."""
    from calibration import attention_long, dispatch_widths, sco_overlap

    return {"attention_long": attention_long.BUDGET_S, "dispatch_widths": dispatch_widths.BUDGET_S,
            "sco": sco_overlap.BUDGET_S}[section][grid]


def run(section: str, grid: str, device, prov: dict, *, budget_s: float | None, log, shared: dict | None = None
        ) -> tuple[dict, list[str]]:
    """``({curve name: curve mapping}, skipped)`` of one section, the curves validated by the caller.

    Args:
        section: one of ``SECTIONS``.
        grid: ``full``, ``quick`` or ``smoke``.
        budget_s: the section's wall budget (``None``: ``default_budget_s``).
        shared: the ``dispatch_kernels`` section's sustained-GEMM and host-loop documents, reused by
            ``dispatch_widths`` instead of measuring them again.
    """
    from calibration.wall_budget import Clock

    if section == "baseline_host":   # fixed cases, no budget
        from calibration import step_host

        doc = step_host.measure(grid == "smoke", prov["command"])
        skipped = [f"baseline_host {f['model']} ac={f['ac']}: {f['error']}" for f in doc["failed"]]
        return ({"baseline_host": step_host.fragment(doc)["curves"]["baseline_host"]} if doc["cases"] else {}), skipped
    if section not in BUDGETED:
        raise ValueError(f"unknown coverage section {section!r}; one of {', '.join(SECTIONS)}")
    clock = Clock(budget_s or default_budget_s(section, grid), log=log)
    if section == "attention_long":
        from calibration import attention_long
        from calibration.coverage import attention_tables

        doc = attention_long.measure(attention_long.GRIDS[grid], device, clock, attention_long.MIN_TIME_S[grid], log=log)
        tables = attention_tables(doc, prov)
        return ({"attention_long": tables} if tables else {}), clock.skipped
    if section == "dispatch_widths":
        from calibration import dispatch_widths
        from calibration.coverage import dispatch_curves

        doc = dispatch_widths.measure(grid, device, clock, prov, prov["command"], shared=shared, log=log)
        curves = dispatch_curves(doc)
        return ({"dispatch_kernels_widths": curves} if curves else {}), clock.skipped
    from calibration import sco_overlap

    curve = sco_overlap.curve(sco_overlap.measure(sco_overlap.GRIDS[grid], device, clock, log=log), prov)
    return ({"sco": curve} if curve else {}), clock.skipped
