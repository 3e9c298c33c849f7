"""Markdown summary of a measured profile or fragment (written next to the YAML)."""

from __future__ import annotations

from planner.schema.curves import (BandwidthCurve, BaselineHostCurve, ChunkCurve, CpuAdamWTable, Curves,
                                   DispatchKernelsCurve, LongAttentionTable, ParamRateCurve, RateTable, SCOCurve)


def _curve_row(name: str, c) -> str:
    if isinstance(c, BandwidthCurve):
        what = (f"{c.size_bytes[0]}..{c.size_bytes[-1]} B; α = {c.latency_s * 1e6:.1f} µs, "
                f"β = {c.bytes_per_s / 1e9:.2f} GB/s, max residual {c.max_rel_residual:.1%}")
    elif isinstance(c, ParamRateCurve):
        what = (f"{c.num_params[0]}..{c.num_params[-1]} params; α = {c.latency_s * 1e6:.1f} µs, "
                f"{1e9 / c.params_per_s:.4f} s per 1e9 params, "
                f"max residual {c.max_rel_residual:.1%}")
    elif isinstance(c, RateTable):
        flat = _flat(c.flops_per_s)
        what = (f"{' × '.join(f'{n}[{a[0]}..{a[-1]}]({len(a)})' for n, a in zip(c.axis_names, c.axes))}; "
                f"{min(flat) / 1e12:.3g}..{max(flat) / 1e12:.4g} TFLOP/s; {c.backend}")
    elif isinstance(c, CpuAdamWTable):
        what = ", ".join(f"{t} thr: {s * 1e9:.3f} s/1e9" for t, s in zip(c.threads, c.s_per_param))
    elif isinstance(c, ChunkCurve):
        what = ", ".join(f"K={k}: {t * 1e3:.2f} ms" for k, t in zip(c.num_chunks, c.time_s))
    elif isinstance(c, LongAttentionTable):
        what = (f"S {c.seq_len[0]:,}..{c.seq_len[-1]:,} × heads {c.heads}; at the longest S, {c.heads[0]} head(s): "
                f"fwd {c.fwd_s[-1][0]:.4g} s, bwd {c.bwd_s[-1][0]:.4g} s; {c.backend}")
    elif isinstance(c, SCOCurve):
        what = ", ".join(f"{r.config}: SCO/plain {r.sco_step_s / r.plain_step_s:.3f}" for r in c.rows)
    elif isinstance(c, DispatchKernelsCurve):
        what = ", ".join(f"{k}={v}" for k, v in c.widths.items()) + f"; {len(c.memory)} memory classes"
    elif isinstance(c, BaselineHostCurve):
        what = f"{len(c.rows)} rows: " + ", ".join(sorted({f'{r.model} ac={r.ac}' for r in c.rows}))
    else:
        what = ""
    dev = c.provenance.device if c.provenance else "-"
    return f"| {name} | {c.status} | {dev} | {what} |"


def _flat(v):
    return [x for s in v for x in _flat(s)] if isinstance(v, list) else [v]


def summary_markdown(title: str, prov: dict, curves: Curves, memory: dict | None = None,
                     timings: dict | None = None, skipped: list[str] | None = None) -> str:
    """A markdown page: provenance, one row per curve, the memory constants and section timings."""
    lines = [f"# {title}", "", f"- command: `{prov.get('command', '')}`",
             f"- device: {prov.get('device')} ({prov.get('gpus_on_machine')} GPU(s) on the machine)",
             f"- torch {prov.get('torch')}, CUDA {prov.get('cuda') or '-'}, NCCL {prov.get('nccl') or '-'}",
             f"- date: {prov.get('date')}", "", "| curve | status | device | measured |", "|---|---|---|---|"]
    lines += [_curve_row(n, c) for n, c in curves.named()]
    if memory:
        lines += ["", "| constant | value | status | note |", "|---|---|---|---|"]
        for name, c in memory.items():
            if isinstance(c, dict):
                lines.append(f"| {name} | {c.get('value'):.6g} | {c.get('status')} | {c.get('note', '')} |")
            else:
                lines.append(f"| {name} | {c} | | |")
    if timings:
        lines += ["", "| section | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in timings.items()]
    if skipped:
        lines += ["", "Skipped or failed:", ""] + [f"- {s}" for s in skipped]
    return "\n".join(lines) + "\n"
