"""``Term``: one named, counted contribution to a rank's memory (DESIGN §3.1, STYLE §1).

A term is an element count (a formula in the DESIGN §1 symbols, evaluated on ints or numpy arrays
so that the search can vectorise over candidates), bytes per element, the live set it belongs to
and the phases in which it is resident. Counts come first; the dtype size multiplies them last.
The formula text travels with the term, so ``check --explain`` prints the very objects summed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

LIVE_SETS = ("persistent", "gathered", "boundaries", "attention", "ffn", "dispatch", "vocab",
             "optimizer_step", "workspace")
"""The live sets of DESIGN §3.1, in display order."""

PHASE_KINDS = ("forward", "head", "backward", "optimizer")
"""Phase kinds of one training step; forward and backward are indexed by checkpointed region."""

REGION_KINDS = ("attention", "moe", "dense_mlp")
"""Kinds of checkpointed region (DESIGN §1: the attention and the MLP/MoE block of a layer are
separate regions, so ``L_b = 2L``)."""


@dataclass(frozen=True)
class Phase:
    """One phase of a training step.

    ``region`` is the 1-based checkpointed-region index ``r`` for forward/backward, else ``None``.
    ``region_kind`` is the kind of that region (``attention``, ``moe``, ``dense_mlp``).
    """

    kind: str
    region: int | None = None
    region_kind: str | None = None

    @property
    def label(self) -> str:
        """``forward[3]``, ``head``, ``backward[12]``, ``optimizer``."""
        return f"{self.kind}[{self.region}]" if self.region is not None else self.kind


Count = Any
"""An element count: a Python ``int`` or a numpy integer array (one entry per candidate)."""


@dataclass(frozen=True)
class Term:
    """One contribution to a live set.

    Attributes:
        name: short name (``logit strip``, ``router logits``).
        live_set: one of ``LIVE_SETS``.
        count: elements when resident (int or numpy array). For region-dependent terms this is the
            count at the largest region; ``at`` gives the count in a given phase.
        elem_bytes: bytes per element (2 bf16, 4 fp32, 8 int64).
        formula: the count as text in DESIGN §1 symbols, e.g. ``"N·V/(P·B_v)"``.
        phases: phase kinds in which it is resident.
        regions: region kinds (``REGION_KINDS``) restricting forward/backward residency; ``None``
            means every region.
        first_region_only: resident in forward/backward only at ``r = 1`` (embedding gather).
        at: optional ``phase -> count`` for counts that vary with ``r`` (retained boundaries).
        provisional: not yet confirmed by a traced or measured step
            (``planner.runtime.validate_compare.confirmed_terms``).
        source: the paper section, equation or tensor inventory the count implements.
    """

    name: str
    live_set: str
    count: Count
    elem_bytes: int
    formula: str
    phases: tuple[str, ...]
    regions: tuple[str, ...] | None = None
    first_region_only: bool = False
    at: Callable[[Phase], Count] | None = None
    provisional: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        assert self.live_set in LIVE_SETS, self.live_set
        assert all(p in PHASE_KINDS for p in self.phases), self.phases
        assert self.regions is None or all(r in REGION_KINDS for r in self.regions), self.regions

    def resident(self, phase: Phase) -> bool:
        """Whether the term is resident in ``phase`` (ignoring a zero count)."""
        if phase.kind not in self.phases:
            return False
        if phase.kind in ("forward", "backward"):
            if self.regions is not None and phase.region_kind not in self.regions:
                return False
            if self.first_region_only and phase.region != 1:
                return False
        return True

    def count_in(self, phase: Phase) -> Count:
        """Elements resident in ``phase`` (0 when not resident)."""
        if not self.resident(phase):
            return 0
        return self.at(phase) if self.at is not None else self.count

    def bytes_in(self, phase: Phase) -> Count:
        """Bytes resident in ``phase``."""
        return np.asarray(self.count_in(phase), dtype=np.int64) * self.elem_bytes

    @property
    def bytes(self) -> Count:
        """Bytes when resident (at the largest region for region-dependent terms)."""
        return np.asarray(self.count, dtype=np.int64) * self.elem_bytes

    @property
    def phases_text(self) -> str:
        """Residency in words, e.g. ``forward[r], backward[r] of moe regions``."""
        parts = [f"{k}[r]" if k in ("forward", "backward") else k for k in self.phases]
        txt = ", ".join(parts)
        if self.regions is not None:
            txt += " of " + "/".join(self.regions) + " regions"
        if self.first_region_only:
            txt += " (r = 1 only)"
        return txt


FWD_BWD = ("forward", "backward")
ALL_STEP = ("forward", "head", "backward")
ALWAYS = ("forward", "head", "backward", "optimizer")
