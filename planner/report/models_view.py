"""``planner models``: the shipped model profiles with their key shapes."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from planner.schema.io import load_model, shipped


def models_table(console: Console, as_json: bool = False) -> None:
    """Print every shipped model profile (name, layers, H, experts, top-k, V, parameters)."""
    rows = []
    for name in shipped("models"):
        m = load_model(name)
        c = m.param_counts()
        rows.append({"name": name, "model_type": m.model_type, "layers": m.num_layers, "hidden": m.hidden_size,
                     "attention": m.attention, "experts": m.num_experts, "top_k": m.top_k,
                     "expert_ffn": m.expert_ffn, "vocab": m.vocab_size, "params": c["total"],
                     "params_with_mtp": m.param_counts(mtp=True)["total"],
                     "params_without_mtp": m.param_counts(mtp=False)["total"], "mtp_layers": m.mtp_layers,
                     "mtp_trained": m.mtp_trained,
                     "active_params": m.active_params()})
    if as_json:
        import sys

        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    t = Table(title="shipped model profiles")
    for col in ("name", "type", "L", "H", "attn", "E", "k", "I", "V", "params", "without MTP", "active"):
        t.add_column(col, justify="left" if col in ("name", "type", "attn") else "right")
    for r in rows:
        t.add_row(r["name"], r["model_type"], str(r["layers"]), str(r["hidden"]), r["attention"], str(r["experts"]),
                  str(r["top_k"]), str(r["expert_ffn"]), str(r["vocab"]), f"{r['params'] / 1e9:.1f}B",
                  f"{r['params_without_mtp'] / 1e9:.1f}B" if r["mtp_layers"] else "·",
                  f"{r['active_params'] / 1e9:.1f}B")
    t.caption = ("params: Θ as the planner counts it (MTP layers included when trained, the default: "
                 "mtp_trained in the model file, --no-mtp-trained on check); without MTP: the main model, "
                 "as model cards count it")
    console.print(t)
