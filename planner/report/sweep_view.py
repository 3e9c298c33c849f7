"""``planner sweep`` output: a rich table, a CSV (pandas) and a PNG (matplotlib, optional extra)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from planner.budget.terms import LIVE_SETS
from planner.units import GiB, fmt_count, gib


def plan_summary(plan) -> str:
    """The plan's knobs in one short string (``search``'s configuration column)."""
    from planner.report.search_view import _knobs

    return _knobs(plan)


def frame(rows):
    """The sweep as a pandas DataFrame, one row per (seq_len, stack): the plan, the verdict, the peak
    and each live set's maximum over phases in GiB (the maxima of different phases, so they do not
    add up to the peak)."""
    import pandas as pd

    recs = []
    for r in rows:
        rec = {"seq_len": r.seq_len, "stack": r.stack, "plan": plan_summary(r.plan),
               "routing": r.plan.routing, "routing_why": r.routing_basis.get("why"), "fits": r.fits,
               "peak_gib": r.peak_bytes / GiB,
               "capacity_gib": r.capacity_bytes / GiB, "binding_live_set": r.binding_live_set,
               "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu}
        rec.update({f"{ls}_gib": r.live_set_max_bytes[ls] / GiB for ls in LIVE_SETS})
        for routing, v in r.routing_sensitivity.items():   # routing sensitivity: peak and HBM verdict
            key = routing.replace("/", "_")
            rec[f"peak_gib_{key}"] = v["peak_bytes"] / GiB
            rec[f"fits_hbm_{key}"] = v["fits_hbm"]
        recs.append(rec)
    return pd.DataFrame.from_records(recs)


def render_sweep(rows, console: Console) -> None:
    t = Table(title="sweep: best composed plan vs best FSDP2 baseline")
    sens = any(r.routing_sensitivity for r in rows)
    cols = ("S", "stack", "plan", "routing", "verdict", "peak GiB", "binding live set", "tok/s/GPU") + (
        ("peak GiB by routing",) if sens else ())
    for col in cols:
        t.add_column(col, justify="right" if col in ("S", "peak GiB", "tok/s/GPU") else "left")
    for r in rows:
        t.add_row(fmt_count(r.seq_len), "composed" if r.stack == "composed" else "FSDP2", plan_summary(r.plan),
                  r.plan.routing + ("" if r.routing_basis.get("default", True) else " (given)"),
                  "[green]fits[/]" if r.fits else "[red]no fit[/]", f"{gib(r.peak_bytes):.1f}", r.binding_live_set,
                  f"{r.tokens_per_s_per_gpu:,.0f}" if r.tokens_per_s_per_gpu else "·",
                  *((_sensitivity_cell(r.routing_sensitivity),) if sens else ()))
    console.print(t)
    if any(r.routing_basis.get("default") for r in rows):
        console.print("routing: each plan's default (README: routing): the named skew without a launch-time bound, "
                      "balanced under PipelinedLLEP's guarantee", markup=False, highlight=False)


def _sensitivity_cell(rs: dict) -> str:
    """``balanced 13.3 · 80/16 13.3 · worst 28.9✗``: the peak under each routing, ✗ where it does not fit."""
    return " · ".join(f"{k} {gib(v['peak_bytes']):.1f}{'' if v['fits_hbm'] else '✗'}" for k, v in rs.items())


def write_csv(rows, path: str) -> None:
    """Write the sweep as CSV, atomically. Raises ``InvalidPlan`` when ``path`` cannot be written."""
    from planner.schema.io import write_text_atomic

    write_text_atomic(path, frame(rows).to_csv(index=False), "--csv")


PLOT_FORMATS = ("png", "pdf", "svg")
"""``--plot`` formats, picked by the file's suffix."""


def plot_format(path: str) -> str:
    """The format ``--plot PATH`` writes, from its suffix.

    Raises:
        InvalidPlan: a suffix matplotlib is not asked to write here, or matplotlib is not installed.
    """
    from pathlib import Path

    from planner.errors import InvalidPlan

    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in PLOT_FORMATS:
        raise InvalidPlan("--plot", path, f"must end in {', '.join('.' + f for f in PLOT_FORMATS)}",
                          "name the file e.g. sweep.png, sweep.pdf or sweep.svg")
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:   # before any work, and before the CSV is written
        raise InvalidPlan("--plot", path, "needs matplotlib", "pip install 'moe-planner[plot]'")
    return fmt


def short_plan(plan) -> str:
    """A few characters naming a plan beside a throughput point."""
    if plan.stack == "composed":
        k = plan.composed
        disp = {"ep": "EP", "llep": "LLEP", "pipelined_llep": "PLLEP"}[k.dispatch]
        return f"D{k.seq_parallel} E{k.expert_parallel} {disp}"
    b = plan.baseline
    return f"tp{b.tp} cp{b.cp}" + (" off" if b.cpu_offload else "")


Y_HEADROOM = 1.3
"""The memory panels' linear y axis runs to this multiple of the usable HBM; taller values are
clipped and their value written at the top edge."""


def write_plot(rows, path: str, title: str) -> None:
    """Per stack, peak memory per live set against context on a linear axis near the HBM line, and a
    throughput panel naming the plan of each point; the format follows the suffix (``plot_format``).

    Raises:
        InvalidPlan: matplotlib is not installed (``pip install 'moe-planner[plot]'``), or a suffix
            that is not ``.png``, ``.pdf`` or ``.svg``.
    """
    fmt = plot_format(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from planner.errors import InvalidPlan

        raise InvalidPlan("--plot", path, "needs matplotlib", "pip install 'moe-planner[plot]'") from None
    import numpy as np

    df = frame(rows)
    plans = {(r.seq_len, r.stack): r.plan for r in rows}
    colors = dict(zip(LIVE_SETS, plt.get_cmap("tab10").colors))
    xs = sorted(df["seq_len"].unique())
    cap = float(df["capacity_gib"].iloc[0])
    top = Y_HEADROOM * cap
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.6), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    handles: dict[str, object] = {}

    def xaxis(ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([fmt_count(int(v)) for v in xs])
        ax.minorticks_off()
        ax.set_xlabel("context length S (tokens)")

    for ax, stack, name in ((axes[0], "composed", "composed stack (best plan per S)"),
                            (axes[1], "fsdp2", "FSDP2-best (lowest peak where none fits)")):
        d = df[df["stack"] == stack].sort_values("seq_len")
        x = d["seq_len"].to_numpy()
        for ls in LIVE_SETS:
            y = d[f"{ls}_gib"].to_numpy(dtype=float)
            if not (y > 0).any():
                continue
            (h,) = ax.plot(x, np.where(y > 0, np.minimum(y, top), np.nan), marker=".", color=colors[ls], label=ls)
            handles.setdefault(ls, h)
        peak = d["peak_gib"].to_numpy(dtype=float)
        (h,) = ax.plot(x, np.minimum(peak, top), color="black", linewidth=2.5, marker="o", markersize=4,
                       label="peak (max over phases)")
        handles.setdefault("peak (max over phases)", h)
        for xi, pi in zip(x, peak):
            if pi > top:
                ax.annotate(f"{pi:.0f}", (xi, top), xytext=(0, -10), textcoords="offset points", ha="center",
                            fontsize=7, color="black")
        h = ax.axhline(cap, color="red", linestyle="--", label=f"usable HBM ({cap:.1f} GiB)")
        handles.setdefault("usable HBM", h)
        fit = d[d["fits"]]
        if len(fit):
            reach = int(fit["seq_len"].max())
            h = ax.axvline(reach, color="green", linestyle=":", label="reach (longest S that fits)")
            handles.setdefault("reach", h)
            ax.text(reach, top * 0.86, f" reach {fmt_count(reach)}", color="green", fontsize=8, va="top")
        else:
            ax.text(0.5, 0.5, "nothing fits", transform=ax.transAxes, ha="center", color="red")
        xaxis(ax)
        ax.set_ylim(0, top)
        ax.set_ylabel("per-rank GiB (values above the frame written at its top)")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)

    ax = axes[2]
    for stack, name, style in (("composed", "composed", "-o"), ("fsdp2", "FSDP2-best", "--s")):
        d = df[(df["stack"] == stack) & df["fits"]].sort_values("seq_len")
        d = d[d["tokens_per_s_per_gpu"].notna()]
        if not len(d):
            continue
        x, y = d["seq_len"].to_numpy(), d["tokens_per_s_per_gpu"].to_numpy(dtype=float)
        (h,) = ax.plot(x, y, style, color="tab:blue" if stack == "composed" else "tab:orange",
                       label=f"{name} tokens/s/GPU")
        handles.setdefault(f"{name} tokens/s/GPU", h)
        for xi, yi in zip(x, y):
            ax.annotate(short_plan(plans[(int(xi), stack)]), (xi, yi), xytext=(4, 6 if stack == "composed" else -12),
                        textcoords="offset points", fontsize=6.5, rotation=20,
                        color="tab:blue" if stack == "composed" else "tab:orange")
    xaxis(ax)
    ax.set_yscale("log")
    ax.margins(y=0.18)
    ax.set_xlim(axes[0].get_xlim())
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:,.0f}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_ylabel("tokens/s per GPU (fitting plans; label = plan)")
    ax.set_title("throughput and the plan of each point")
    ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    fig.legend(list(handles.values()), [h.get_label() for h in handles.values()], loc="lower center",
               ncol=min(len(handles), 7), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    import io

    from planner.schema.io import write_bytes_atomic

    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=fmt)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue(), "--plot")
