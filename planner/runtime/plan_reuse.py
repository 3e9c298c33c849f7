"""Reuse of a dispatch plan by a checkpoint's recompute, keyed by the checkpoint call (DESIGN §4).

``torch.utils.checkpoint(fn, ..., use_reentrant=False, context_fn=op.plan_reuse)`` calls
``context_fn`` once per checkpointed call and enters the pair it returns around that call's forward
and around each of its recomputes. The pair shares one ``Slot``: the forward appends the plans it
computes, a recompute replays them in call order (from the start at every recompute: a second
backward with ``retain_graph=True`` recomputes again). A forward whose backward never runs leaves
its plans in its own slot, which dies with its graph, so no later recompute can read them.
"""

from __future__ import annotations

import torch

FORWARD, RECOMPUTE = "forward", "recompute"


class Slot:
    """The plans of one checkpointed call, in the order its forward computed them."""

    def __init__(self) -> None:
        self.plans: list = []
        self.cursor = 0


class Phase:
    """A re-enterable context: while entered, ``owner``'s calls are in ``phase`` of ``slot``."""

    def __init__(self, owner, slot: Slot, phase: str) -> None:
        self.owner, self.slot, self.phase = owner, slot, phase

    def __enter__(self) -> "Phase":
        if self.phase == RECOMPUTE:
            self.slot.cursor = 0
        self.owner._reuse.append(self)
        return self

    def __exit__(self, *exc) -> None:
        stack = self.owner._reuse
        del stack[len(stack) - 1 - stack[::-1].index(self)]


def contexts(owner) -> tuple[Phase, Phase]:
    """``(forward, recompute)`` contexts of one checkpointed call, sharing a fresh ``Slot``."""
    slot = Slot()
    return Phase(owner, slot, FORWARD), Phase(owner, slot, RECOMPUTE)


def reused(owner):
    """The plan the innermost recompute replays next, or ``None`` (outside a recompute, or when
    its forward computed fewer plans)."""
    top = owner._reuse[-1] if owner._reuse else None
    if top is None or top.phase != RECOMPUTE or top.slot.cursor >= len(top.slot.plans):
        return None
    top.slot.cursor += 1
    return top.slot.plans[top.slot.cursor - 1]


def remember(owner, plan) -> None:
    """Keep ``plan`` for the recompute when the innermost context is a forward under grad mode."""
    top = owner._reuse[-1] if owner._reuse else None
    if top is not None and top.phase == FORWARD and torch.is_grad_enabled():
        top.slot.plans.append(plan)
