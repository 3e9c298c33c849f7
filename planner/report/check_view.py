"""Rich rendering of ``planner check`` and the frontier commands."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.budget.terms import LIVE_SETS, PHASE_KINDS
from planner.units import fmt_count, fmt_gib, fmt_share, gib, plural


def _plan_line(rep) -> str:
    """The resolved plan in one line, showing only the knobs the chosen operators use."""
    d = rep.to_json()["derived"]
    p = rep.planfile.plan
    if p.stack == "composed":
        k = p.composed
        parts = [f"composed stack · D={d['seq_parallel']} E_p={d['expert_parallel']} P={d['vocab_parallel']}"]
        if rep.ctx.model.is_moe:
            disp = f"dispatch {k.dispatch}"
            if k.dispatch == "pipelined_llep":
                disp += (f" (c={d['token_budget']}, K={d['num_chunks']}, c_eff={d['chunk_tokens']}, "
                         f"residue {k.dispatch_residue})")
            disp += f" · routing {p.routing}" + (f" · bound {p.dispatch_bound}" if k.dispatch != "ep" else "")
            parts.append(disp)
        parts.append(f"vocab {k.vocab}" + (f" (B_v={d['vocab_blocks']})" if k.vocab == "ring_dtp" else ""))
        parts.append(f"optimizer {k.optimizer}"
                     + (f" (β={k.bucket_params:,}, s={k.staging_slots})" if k.optimizer == "stream_offload" else ""))
        ck = f"checkpoint {k.checkpoint}"
        if k.checkpoint == "sco":
            ck += (f" (host budget {fmt_gib(d['sco_host_bytes'])}/rank, {d['num_offloaded']}/{d['num_boundaries']} "
                   f"boundaries offloaded)")
        parts += [ck, p.dtype]
        return " · ".join(parts)
    b = p.baseline
    return (f"FSDP2 baseline · tp={b.tp} cp={b.cp} dp_shard={b.dp_shard} ep={b.ep} · AC {b.ac} · "
            f"CPU offload {'on' if b.cpu_offload else 'off'} · routing {p.routing} · {p.dtype}")


def _mtp_note(model) -> str:
    """Θ's other reading when the model has MTP layers (a model card counts the main model only)."""
    if not model.mtp_layers:
        return ""
    other = model.param_counts(mtp=not model.mtp_trained)["total"] / 1e9
    return (f" (with {model.mtp_layers} trained MTP layer{'s' if model.mtp_layers > 1 else ''}; "
            f"{other:.1f}B without)" if model.mtp_trained else
            f" (MTP layers not trained; {other:.1f}B with them)")


def render_check(rep, console: Console, explain: bool = False) -> None:
    """Print the verdict: live sets by phase, headroom, binding terms, plan, assumptions."""
    pf = rep.planfile
    W, S, N = pf.plan.world_size, pf.workload.seq_len, int(rep.ctx.tokens_per_rank)
    console.print(f"[bold]{escape(pf.model.name)}[/] on {W} × {escape(pf.cluster.topology.gpu_name)} "
                  f"({escape(pf.cluster.name)}) · S = {fmt_count(S)} ({plural(S, 'token')}) · N = {fmt_count(N)} "
                  f"{'token' if N == 1 else 'tokens'}/rank · Θ = {rep.ctx.num_params / 1e9:.1f}B" + _mtp_note(pf.model))
    topo = (rep.cluster_ref or {}).get("topology")
    if topo:
        from planner.schema.cluster_ref import TOPOLOGY_FLAGS

        console.print("cluster overrides: " + ", ".join(
            f"{TOPOLOGY_FLAGS[k]} {v / 2**30:g}" if k.endswith("_bytes") else f"{TOPOLOGY_FLAGS[k]} {v}"
            for k, v in topo.items()), style="dim", markup=False, highlight=False)
    console.print(_plan_line(rep), style="dim")
    tab = rep.phase_kind_table()
    t = Table(title="per-rank GiB, worst phase of each kind")
    t.add_column("live set")
    for kind in PHASE_KINDS:
        t.add_column(kind, justify="right")
    bind_kind = rep.evaluation.phases[rep.binding].kind
    for ls in [*LIVE_SETS, "total"]:
        cells = []
        for kind in PHASE_KINDS:
            v, _ = tab[ls][kind]
            cell = f"{gib(v):.2f}" if v else "·"
            cells.append(f"[bold]{cell}[/]" if kind == bind_kind and ls in (rep.binding_live_set, "total")
                         else cell)
        t.add_row(f"[bold]{ls}[/]" if ls == "total" else ls, *cells, end_section=ls == LIVE_SETS[-1])
    labels = [tab["total"][k][1] for k in PHASE_KINDS]
    t.caption = "worst phases: " + ", ".join(labels)
    console.print(t)
    if explain:
        render_explain(rep, console)
    head = rep.capacity_bytes - rep.peak_bytes
    console.print(f"peak {fmt_gib(rep.peak_bytes)} in [bold]{rep.binding_phase}[/] · usable capacity "
                  f"{fmt_gib(rep.capacity_bytes)} (HBM {fmt_gib(rep.hbm_bytes)} − context/NCCL "
                  f"{fmt_gib(rep.outside_allocator_bytes)} − reserve) · headroom {fmt_gib(head)}")
    top = ", ".join(f"{x['name']} ({x['live_set']}, {fmt_gib(x['bytes'])})" for x in rep.binding_terms)
    big = rep.largest_live_set
    console.print(f"binding live set: [bold]{rep.binding_live_set}[/] (grows most into {rep.binding_phase})"
                  + (f" · largest there: {big}" if big != rep.binding_live_set else "") + f" · top terms: {top}")
    db = rep.extra.get("dispatch_bounds")
    if db:
        expected = fmt_gib(db["expected"]) if "expected" in db else "not evaluated (E_p too large)"
        console.print(f"dispatch live set (max over phases): guarantee {fmt_gib(db['guarantee'])}, expected "
                      f"{expected} under routing {rep.planfile.plan.routing}; the verdict uses "
                      f"the {rep.planfile.plan.dispatch_bound} (--dispatch-bound)")
    rs = rep.extra.get("routing_sensitivity")
    if rs and rep.ctx.model.is_moe:
        console.print("routing sensitivity (HBM peak): " + sensitivity_text(rs))
    rb = rep.extra.get("routing")
    if rb and rep.ctx.model.is_moe:
        console.print(f"routing of the verdict: {rb['routing']} · {rb['why']}", markup=False, highlight=False)
    h = rep.host
    console.print(f"host RAM per node ({plural(h.ranks_per_node, 'rank', grouped=False)}): {fmt_gib(h.bytes)} of {fmt_gib(h.capacity_bytes)} "
                  f"usable (baseline {fmt_gib(h.baseline_bytes)}, optimizer {fmt_gib(h.optimizer_bytes)}, "
                  f"SCO {fmt_gib(h.sco_bytes)}) · {'fits' if rep.fits_host else '[red]does not fit[/]'}")
    j = rep.extra.get("step", {})
    if j:
        t_txt = (f"{j['step_s']:.3f} s per optimizer step ({j['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU)"
                 if j["step_s"] is not None else "not predicted (time-model gap; see --json step_gaps)")
        console.print(f"step: {t_txt} · {plural(j['tokens_per_step'], 'token')} per step "
                      f"({j['tokens_per_step_per_rank']:,} per rank)")
    if rep.assumed:
        console.print("[yellow]assumed constants:[/] " + ", ".join(rep.assumed))
    if rep.provisional:
        from collections import Counter

        per = Counter(x.split(":")[0] for x in rep.provisional)
        console.print("[yellow]provisional terms[/] (not yet confirmed by a traced or measured step; --explain marks them): "
                      + ", ".join(f"{ls} ({n})" for ls, n in per.items()))
    if rep.fits and rep.under_min_headroom:
        console.print(f"[yellow]headroom:[/] {fmt_share(rep.headroom_fraction)} of the usable capacity free "
                      f"({fmt_gib(rep.capacity_bytes - rep.peak_bytes)}), under the {fmt_share(rep.min_headroom)} "
                      f"(--min-headroom) that search, sweep, min-gpus, max-context and max-batch would keep")
    if rep.fits:
        console.print("[bold green]FITS[/]")
    else:
        why = " and ".join(w for w, bad in (("HBM", not rep.fits_hbm), ("host RAM", not rep.fits_host)) if bad)
        console.print(f"[bold red]DOES NOT FIT[/] ({why})")


def render_explain(rep, console: Console) -> None:
    """Every term that is non-zero in some phase, with its formula, element count, bytes and residency."""
    t = Table(title=f"terms (bytes in the binding phase {rep.binding_phase}; max over phases)")
    for col in ("live set", "term", "formula", "elements", "× B", "binding GiB", "max GiB", "resident in"):
        t.add_column(col, justify="right" if col in ("elements", "× B", "binding GiB", "max GiB") else "left")
    for term, at, mx in rep.term_rows():
        if mx == 0:
            continue
        t.add_row(term.live_set, escape(term.name) + (" *" if term.provisional else ""), escape(term.formula),
                  f"{int(term.count if not hasattr(term.count, 'max') else term.count.max()):,}",
                  str(term.elem_bytes), f"{gib(at):.3f}", f"{gib(mx):.3f}", escape(term.phases_text))
    t.caption = "* provisional: not yet confirmed by a traced or measured step"
    console.print(t)


def render_frontier(rep, console: Console) -> None:
    """Print the result of a frontier scan."""
    j = rep.to_json()
    s = rep.scan
    name = rep.planfile.model.name
    if rep.axis == "seq_len":
        best = j["max_seq_len"]
        what = f"max context {fmt_count(best)} ({plural(best, 'token')})" if best else "nothing fits"
    else:
        best = j["max_global_batch_tokens"]
        n = j["max_seqs_per_microbatch"]
        what = (f"max batch {plural(best, 'token')} per micro-step: {plural(n, 'sequence', grouped=False)} of "
                f"S = {fmt_count(rep.planfile.workload.seq_len)} per sequence group"
                if best else "no batch fits: not even one sequence per sequence group")
    rp = s.plan
    if rp.stack == "fsdp2":
        b = rp.baseline
        stack = f"FSDP2 baseline, tp={b.tp} cp={b.cp} dp_shard={b.dp_shard} ep={b.ep}"
    else:
        c = rp.composed
        stack = f"composed stack, D={c.seq_parallel} E_p={c.expert_parallel} P={c.vocab_parallel}"
    console.print(f"[bold]{escape(name)}[/] on {plural(rep.planfile.plan.world_size, 'GPU', grouped=False)} ({stack} fixed): {what}")
    fail = s.first_fail
    if rep.axis == "seq_len":
        fail_txt = "none" if fail is None else fmt_count(fail)
        console.print(f"scanned {plural(len(s.values), 'grid point', grouped=False)}; {int(s.fits.sum())} fit; first failure at {fail_txt} "
                      f"(the peak is not monotone in S: fits and failures can interleave); usable HBM "
                      f"{fmt_gib(s.capacity_bytes)}; `planner check` at a length shows what binds")
    else:
        fail_txt = "none" if fail is None else f"{plural(fail, 'sequence', grouped=False)} per group"
        console.print(f"scanned {plural(len(s.values), 'batch size', grouped=False)}; {int(s.fits.sum())} fit; first failure at {fail_txt}; "
                      f"usable HBM {fmt_gib(s.capacity_bytes)}; `planner check --seqs-per-microbatch n` shows "
                      f"what binds")
    if rp.stack == "fsdp2" and rp.baseline.cp == 1 and rp.world_size > 1 and rep.axis == "seq_len":
        console.print(f"cp = 1 (resolved at the first length): context parallelism shards no sequence; --cp N shards each "
                      f"one N ways, as the baseline's long contexts need", markup=False, highlight=False)
    if s.exact is not None:
        console.print(f"the expert dispatch was planned at {plural(int(s.exact.sum()), 'point', grouped=False)}: "
                      f"the other {int((~s.exact).sum())} fail on their peak without it (a lower bound; their "
                      "grid peak_bytes are that bound)", markup=False, highlight=False)
    rb = j.get("routing")
    if rb and rep.planfile.model.is_moe:
        console.print(f"routing of the verdicts: {rb['routing']} · {rb['why']}", markup=False, highlight=False)


def sensitivity_text(rs: dict) -> str:
    """``balanced 13.27 GiB fits · 80/16 … · worst …`` (``budget.sensitivity``)."""
    return " · ".join(f"{r} {fmt_gib(v['peak_bytes'])} {'fits' if v['fits_hbm'] else 'does not fit'}"
                      for r, v in rs.items())
