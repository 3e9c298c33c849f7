"""``Workload``: what one training step processes."""

from __future__ import annotations

from pydantic import Field

from planner.schema.base import Frozen


class Workload(Frozen):
    """Sequence length and batch of the run.

    ``N`` (tokens resident per rank per micro-batch) is ``seqs_per_microbatch · S / D``.
    """

    seq_len: int = Field(gt=0)
    """``S``: context length in tokens."""
    seqs_per_microbatch: int = Field(default=1, gt=0)
    """Sequences of length ``S`` each sequence group processes per micro-step."""
    global_batch_tokens: int | None = Field(default=None, gt=0)
    """Tokens per optimizer step; ``None`` means one micro-step (``W/D`` sequences). Must be a
    multiple of the tokens per micro-step; the rest is gradient accumulation."""
