"""``Workload``: what one training step processes."""

from __future__ import annotations

from pydantic import Field, model_validator

from planner.schema.base import MAX_BATCH_TOKENS, MAX_TOKENS, Frozen


class Workload(Frozen):
    """Sequence length and batch of the run.

    ``N`` (tokens resident per rank per micro-batch) is ``seqs_per_microbatch · S / D``.
    """

    seq_len: int = Field(gt=0, le=MAX_TOKENS)
    """``S`` (≤ 2^32): context length in tokens."""
    seqs_per_microbatch: int = Field(default=1, gt=0, le=MAX_TOKENS)
    """Sequences of length ``S`` each sequence group processes per micro-step; the tokens per
    sequence group, ``seqs_per_microbatch · S``, are at most 2^32."""
    global_batch_tokens: int | None = Field(default=None, gt=0, le=MAX_BATCH_TOKENS)
    """Tokens per optimizer step (≤ 2^62); ``None`` means one micro-step (``W/D`` sequences). Must be
    a multiple of the tokens per micro-step; the rest is gradient accumulation."""

    @model_validator(mode="after")
    def _tokens(self) -> "Workload":
        from planner.errors import InvalidPlan

        if self.seq_len * self.seqs_per_microbatch > MAX_TOKENS:
            raise InvalidPlan("workload.seqs_per_microbatch", self.seqs_per_microbatch,
                              f"times seq_len ({self.seq_len}) must be <= {MAX_TOKENS} tokens",
                              "lower seqs_per_microbatch or seq_len")
        return self
