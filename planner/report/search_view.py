"""Rich rendering of ``planner search``."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.units import fmt_count, fmt_share, gib, plural


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
    seen: dict[str, int] = {}
    for line in out:   # rules that differ only past the shortened width read as one line
        seen[line] = seen.get(line, 0) + 1
    return [line if n == 1 else f"{line} (×{n}, --json lists each)" for line, n in seen.items()]


def render_search(rep, console: Console) -> None:
    """Top composed plans, the best FSDP2 baseline, and the rejection tallies."""
    r = rep.result
    console.print(f"[bold]{escape(rep.model.name)}[/] on {rep.world_size} × {escape(rep.cluster.topology.gpu_name)} at "
                  f"S = {fmt_count(rep.workload.seq_len)} · routing "
                  + (rep.routing if getattr(rep, "routing", None) else "each plan's default (README: routing)"))
    t = Table(title="fastest configurations that fit")
    for col in ("#", "stack", "configuration", "step s", "tok/s/GPU", "TFLOP/s/GPU", "peak GiB", "binds in"):
        t.add_column(col, justify="left" if col in ("stack", "configuration", "binds in") else "right")
    rows = [(str(i + 1), c) for i, c in enumerate(r.top)] + ([("base", r.baseline)] if r.baseline else [])
    for tag, c in rows:
        t.add_row(tag, "composed" if c.plan.stack == "composed" else "FSDP2", _knobs(c.plan),
                  f"{c.step_s:.4f}",
                  f"{c.tokens_per_s_per_gpu:,.0f}", f"{c.tflops_per_gpu:.0f}", f"{gib(c.peak_bytes):.1f}",
                  c.binding_phase, end_section=tag == str(len(r.top)))
    console.print(t)
    if r.top and r.baseline:
        ratio = r.speedup
        console.print(f"composed vs FSDP2-best: {ratio:.2f}× " + ("faster" if ratio >= 1 else
                      f"(the FSDP2 baseline is {1 / ratio:.2f}× faster under this time model)")
                      + " in tokens/s/GPU")
    elif r.top:
        console.print("[yellow]no FSDP2 configuration fits[/] at this context length")
    else:
        console.print("[red]no composed configuration fits[/]")
    for st, c in rep.closest.items():
        name = "composed" if st == "composed" else "FSDP2"
        console.print(f"closest {name} plan: {_knobs(c.plan)}: {c.why()}", markup=False, highlight=False)
    console.print(f"--stack {rep.stack}: {describe_choice(rep)}", markup=False, highlight=False)
    sens = getattr(rep, "routing_sensitivity", {}) or {}
    if rep.model.is_moe:
        from planner.report.check_view import sensitivity_text

        for name, label in (("composed", "#1"), ("baseline", "base")):
            if name in sens:
                console.print(f"routing sensitivity of {label} (HBM peak): {sensitivity_text(sens[name])}")
        if hasattr(rep, "routing_basis"):
            groups: dict[tuple, list[str]] = {}
            for tag, c in rows:
                b = rep.routing_basis(c.plan)
                groups.setdefault((b["routing"], b["why"]), []).append("#" + tag if tag != "base" else tag)
            for (routing, why), tags in groups.items():
                console.print(f"routing of {', '.join(tags)}: {routing} · {why}", markup=False, highlight=False)
    console.print(f"composed: {r.tally.text()}")
    console.print(f"FSDP2:    {r.baseline_tally.text()}")
    if r.assumed:
        console.print(f"[yellow]assumed ({len(r.assumed)}, all in --json):[/]")
        for line in summarize_assumed(r.assumed):
            console.print(f"  - {line}", markup=False, highlight=False)
    if r.gaps:
        console.print(f"[yellow]time-model gaps ({len(r.gaps)}):[/] " + "; ".join(r.gaps[:3]))
    console.print(f"searched in {rep.elapsed_s:.2f} s", style="dim")


def describe_choice(rep) -> str:
    """Which plan ``--out`` writes under ``--stack``, in words."""
    ch = rep.chosen
    name = "composed" if rep.chosen_stack == "composed" else "FSDP2"
    if ch is None:
        return f"no {name} plan to write"
    why = ""
    if rep.stack == "best" and ch[1]:
        r = rep.result
        why = (" (the faster of the two stacks that fit)" if r.top and r.baseline
               else " (the only stack that fits)")
    elif rep.stack == "best":
        why = " (neither stack fits: the one whose closest plan overshoots less)"
    return (f"the fastest {name} plan" if ch[1] else f"the closest {name} plan (none fits)") + why


def render_min_gpus(rep, console: Console) -> None:
    """The smallest W of each stack, and what the memory model found at each W tried."""
    S = fmt_count(rep.workload.seq_len)
    for name, w in (("composed stack", rep.composed), ("FSDP2 baseline", rep.baseline)):
        tried = max(r["world_size"] for r in rep.tried)
        console.print(f"{name}: " + (f"fits from W = {plural(w, 'GPU', grouped=False)}" if w else f"does not fit up to W = {tried}")
                      + f" at S = {S}", markup=False, highlight=False)
    for r in rep.tried:
        parts = []
        for st, name in (("composed", "composed"), ("fsdp2", "FSDP2")):
            if f"{st}_fit" in r:
                pk = r[f"{st}_lowest_peak_bytes"]
                parts.append(f"{name} {r[st + '_fit']} fit" + (f" (lowest peak {gib(pk):.1f} GiB)" if pk else ""))
        console.print(f"  W = {r['world_size']}: " + ", ".join(parts), markup=False, highlight=False)
    console.print(f"a plan fits when its peak leaves {fmt_share(rep.min_headroom)} of the usable capacity free "
                  f"(--min-headroom, as in search) and it fits the host RAM; memory model only (the search's "
                  f"candidate space); `planner search` at that W ranks the plans", style="dim")
