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
        rec = {"seq_len": r.seq_len, "stack": r.stack, "plan": plan_summary(r.plan), "fits": r.fits,
               "peak_gib": r.peak_bytes / GiB,
               "capacity_gib": r.capacity_bytes / GiB, "binding_live_set": r.binding_live_set,
               "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu}
        rec.update({f"{ls}_gib": r.live_set_max_bytes[ls] / GiB for ls in LIVE_SETS})
        recs.append(rec)
    return pd.DataFrame.from_records(recs)


def render_sweep(rows, console: Console) -> None:
    t = Table(title="sweep: best composed plan vs best FSDP2 baseline")
    for col in ("S", "stack", "plan", "verdict", "peak GiB", "binding live set", "tok/s/GPU"):
        t.add_column(col, justify="right" if col in ("S", "peak GiB", "tok/s/GPU") else "left")
    for r in rows:
        t.add_row(fmt_count(r.seq_len), "composed" if r.stack == "composed" else "FSDP2", plan_summary(r.plan),
                  "[green]fits[/]" if r.fits else "[red]no fit[/]", f"{gib(r.peak_bytes):.1f}", r.binding_live_set,
                  f"{r.tokens_per_s_per_gpu:,.0f}" if r.tokens_per_s_per_gpu else "·")
    console.print(t)


def write_csv(rows, path: str) -> None:
    """Write the sweep as CSV, atomically. Raises ``InvalidPlan`` when ``path`` cannot be written."""
    from planner.schema.io import write_text_atomic

    write_text_atomic(path, frame(rows).to_csv(index=False), "--csv")


def write_plot(rows, path: str, title: str) -> None:
    """Peak memory per live set against context for both stacks, the HBM line and each stack's reach.

    Raises:
        InvalidPlan: matplotlib is not installed (``pip install 'moe-planner[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from planner.errors import InvalidPlan

        raise InvalidPlan("--plot", path, "needs matplotlib", "pip install 'moe-planner[plot]'") from None
    import numpy as np

    df = frame(rows)
    colors = dict(zip(LIVE_SETS, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, stack, name in ((axes[0], "composed", "composed stack (best plan per S)"),
                            (axes[1], "fsdp2", "FSDP2-best (lowest peak where none fits)")):
        d = df[df["stack"] == stack].sort_values("seq_len")
        x = d["seq_len"].to_numpy()
        for ls in LIVE_SETS:
            y = d[f"{ls}_gib"].to_numpy(dtype=float)
            ax.plot(x, np.where(y > 0, y, np.nan), marker=".", color=colors[ls], label=ls)
        ax.plot(x, d["peak_gib"], color="black", linewidth=2.5, label="peak (max over phases)")
        ax.axhline(d["capacity_gib"].iloc[0], color="red", linestyle="--", label="usable HBM")
        fit = d[d["fits"]]
        if len(fit):
            reach = int(fit["seq_len"].max())
            ax.axvline(reach, color="green", linestyle=":", label=f"reach {fmt_count(reach)}")
        else:
            ax.text(0.5, 0.95, "nothing fits", transform=ax.transAxes, ha="center", color="red")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length S (tokens)")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("per-rank GiB")
    fig.suptitle(title)
    fig.tight_layout()
    import io

    from planner.schema.io import write_bytes_atomic

    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format="png")
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue(), "--plot")
