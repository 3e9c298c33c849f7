"""Sub-step inventories of a head (``vocab`` live set), shared by the composed heads
(``planner.budget.vocab``) and the FSDP2 heads (``planner.budget.fsdp2_vocab``).

A head runs through sub-steps whose live tensors differ; ``binding_terms`` turns the sub-steps'
``Item`` lists into terms counted at the binding sub-step (the largest total, per candidate), so the
terms sum to ``max over sub-steps``. Legend: ``planner.budget.vocab``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.budget.terms import Term

HEAD = ("head",)
"""The phase every head term lives in."""


@dataclass(frozen=True)
class Item:
    """One tensor group alive in a sub-step: ``count`` elements of ``elem_bytes`` each."""

    name: str
    count: Any
    elem_bytes: int
    formula: str


def binding_terms(substeps: dict[str, list[Item]], source: str, provisional: bool = False) -> list[Term]:
    """Terms counted at the binding sub-step (largest total; per candidate for numpy counts)."""
    keys = list(substeps)
    totals = [sum((np.asarray(i.count, dtype=np.int64) * i.elem_bytes for i in substeps[k]),
                  np.int64(0)) for k in keys]
    totals = np.broadcast_arrays(*totals)
    pick = np.argmax(np.stack(totals), axis=0)
    names: dict[str, Item] = {}
    for k in keys:
        for i in substeps[k]:
            names.setdefault(i.name, i)
    out = []
    for name, first in names.items():
        per = [next((np.asarray(i.count, dtype=np.int64) for i in substeps[k] if i.name == name),
                    np.int64(0)) for k in keys]
        count = np.choose(pick, np.broadcast_arrays(*per, totals[0])[:-1])
        if np.ndim(count) == 0:
            count = int(count)
        where = [k for k in keys if any(i.name == name for i in substeps[k])]
        formula = f"{first.formula}  [in: {', '.join(where)}; counted at the binding sub-step of " \
                  f"max({', '.join(keys)})]"
        out.append(Term(name, "vocab", count, first.elem_bytes, formula, HEAD, provisional=provisional,
                        source=source))
    return out


def dense_substeps(N, H, cols, rows, b: int) -> dict[str, list[Item]]:
    """``cross_entropy(x @ w.T, t)`` over ``cols`` (``V_c``) logit columns with a ``rows × H`` weight."""
    low = int(b < 4)
    own = [Item("head input x_NH", N * H, b, "N·H"), Item("targets t_N", N, 8, "N")]
    return {
        "log-softmax bwd": own + [Item("log-softmax, its grad, logits grad (fp32)", 3 * N * cols, 4, "3·N·V_c")],
        "logits-grad downcast": own + [Item("logits grad (fp32)", low * N * cols, 4, "[b<4]·N·V_c"),
                                       Item("logits grad in input dtype", low * N * cols, b, "[b<4]·N·V_c")],
        "weight-grad GEMM": own + [
            Item("logits grad in input dtype", N * cols, b, "N·V_c"),
            Item("input grad dx", N * H, b, "N·H"),
            Item("weight grad dw (before reduce-scatter)", rows * H, b, "rows·H")],
    }
