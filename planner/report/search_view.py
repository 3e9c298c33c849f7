"""Rich rendering of ``planner search``."""

from __future__ import annotations

import re

from rich.console import Console
from rich.table import Table

from planner.units import fmt_count, gib


def _knobs(plan) -> str:
    if plan.stack == "composed":
        k = plan.composed
        s = (f"D={k.seq_parallel} E_p={k.expert_parallel} P={k.vocab_parallel} · {k.dispatch}"
             + (f" c={k.token_budget}" if k.dispatch == "pipelined_llep" else "")
             + f" · {k.vocab}" + (f" B_v={k.vocab_blocks}" if k.vocab == "ring_dtp" else "")
             + f" · {k.optimizer}" + (f" β={k.bucket_params / 1e6:.0f}M s={k.staging_slots}"
                                      if k.optimizer == "stream_offload" else "")
             + f" · {k.checkpoint}" + (f" {gib(k.sco_host_bytes):.0f} GiB" if k.checkpoint == "sco" else ""))
        return s
    b = plan.baseline
    return (f"tp={b.tp} cp={b.cp} dp_shard={b.dp_shard} ep={b.ep} · AC {b.ac}"
            + (" · CPU offload" if b.cpu_offload else ""))


_COLL = re.compile(r"^collectives\.(\w+)\.(\d+): (.*)$")


def summarize_assumed(items: list[str], width: int = 150) -> list[str]:
    """Fold the per-curve collective assumptions into one line per rule; shorten the rest."""
    rules: dict[str, list[str]] = {}
    out = []
    for a in items:
        m = _COLL.match(a)
        if m:
            rules.setdefault(m.group(3), []).append(f"{m.group(1)}@{m.group(2)}")
        else:
            out.append(a if len(a) <= width else a[: width - 1] + "…")
    for rule, where in rules.items():
        line = f"collectives {', '.join(sorted(set(where)))}: {rule}"
        out.append(line if len(line) <= width else line[: width - 1] + "…")
    return out


def render_search(rep, console: Console) -> None:
    """Top composed plans, the best FSDP2 baseline, and the rejection tallies."""
    r = rep.result
    console.print(f"[bold]{rep.model.name}[/] on {rep.world_size} × {rep.cluster.topology.gpu_name} at "
                  f"S = {fmt_count(rep.workload.seq_len)} · routing {r.top[0].plan.routing if r.top else 'balanced'}")
    t = Table(title="fastest configurations that fit")
    for col in ("#", "stack", "configuration", "step s", "tok/s/GPU", "TFLOP/s/GPU", "peak GiB", "binds in"):
        t.add_column(col, justify="left" if col in ("stack", "configuration", "binds in") else "right")
    rows = [(str(i + 1), c) for i, c in enumerate(r.top)] + ([("base", r.baseline)] if r.baseline else [])
    for tag, c in rows:
        t.add_row(tag, "composed" if c.plan.stack == "composed" else "FSDP2", _knobs(c.plan), f"{c.step_s:.3f}",
                  f"{c.tokens_per_s_per_gpu:,.0f}", f"{c.tflops_per_gpu:.0f}", f"{gib(c.peak_bytes):.1f}",
                  c.binding_phase, end_section=tag == str(len(r.top)))
    console.print(t)
    if r.top and r.baseline:
        ratio = r.baseline.step_s / r.top[0].step_s
        console.print(f"composed vs FSDP2-best: {ratio:.2f}× " + ("faster" if ratio >= 1 else
                      f"(the FSDP2 baseline is {1 / ratio:.2f}× faster under this time model)"))
    elif r.top:
        console.print("[yellow]no FSDP2 configuration fits[/] at this context length")
    else:
        console.print("[red]no composed configuration fits[/]")
    closest = getattr(rep, "closest", None)
    if closest is not None and not r.top:
        plan, peak, cap = closest
        console.print(f"closest composed plan: {_knobs(plan)} with a peak of {gib(peak):.1f} GiB against "
                      f"{gib(cap):.1f} GiB usable (`--out` writes it; `planner check --plan` shows what binds)")
    sens = getattr(rep, "routing_sensitivity", {}) or {}
    if rep.model.is_moe:
        from planner.report.check_view import sensitivity_text

        for name, label in (("composed", "#1"), ("baseline", "base")):
            if name in sens:
                console.print(f"routing sensitivity of {label} (HBM peak): {sensitivity_text(sens[name])}")
    console.print(f"composed: {r.tally.text()}")
    console.print(f"FSDP2:    {r.baseline_tally.text()}")
    if r.assumed:
        console.print(f"[yellow]assumed ({len(r.assumed)}, all in --json):[/]")
        for line in summarize_assumed(r.assumed):
            console.print(f"  - {line}", markup=False, highlight=False)
    if r.gaps:
        console.print(f"[yellow]time-model gaps ({len(r.gaps)}):[/] " + "; ".join(r.gaps[:3]))
    console.print(f"searched in {rep.elapsed_s:.2f} s", style="dim")
