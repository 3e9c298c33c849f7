"""Ring-DTP schedule: which (batch, shard) meeting each rank computes at each step (DESIGN §7).

Legend (DESIGN §1): ``P`` ranks in the vocabulary group, ``V`` vocabulary rows, ``N_max`` the
all-reduced largest token count of the group, ``B_v`` blocks (strips) per shard, ``V_max =
ceil(V/P)`` rows of the largest shard, ``V_b = ceil(V_max/B_v)`` columns of the widest strip.

Shards. Shard ``j`` is the vocabulary interval ``[start_j, stop_j)`` of ``floor(V/P)`` rows, the
first ``V mod P`` shards one row larger (torch.tensor_split's rule), so ``V % P != 0`` works and no
shard differs from another by more than one row. Block ``k`` of a shard splits it by the same rule;
a shard with fewer rows than ``B_v`` has empty blocks, which the runtime skips.

Ring. Every moving tensor travels to the right neighbour ``(r+1) mod P`` and arrives from the left
``(r-1) mod P``. At step ``s`` in ``0..P-1`` rank ``r`` holds the moving operand of owner
``(r-s) mod P``:

- ``move = "activations"`` (``N_max <= ceil(V/P)``): the batch travels; rank ``r`` meets
  batch ``(r-s) mod P`` with its own shard ``r``;
- ``move = "weights"`` (otherwise): the shard travels; rank ``r`` meets its own batch ``r`` with
  shard ``(r-s) mod P``.

Each pass has ``P-1`` operand hops (after steps ``0..P-2``). What accumulates on the moving
operand (the online log-sum-exp state in forward, its gradient in backward) makes ``P`` hops: after
step ``P-1`` it sits one rank left of its owner, and a last hop hands it home.

Pure Python and numpy: the runtime (``planner.runtime.ring_dtp``) and the budget
(``planner.budget.vocab``) both read these integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from planner.errors import InvalidPlan
from planner.units import ceil_div
from planner.schema.knobs import default as knob_default

Move = Literal["activations", "weights"]
MOVES = ("activations", "weights")


def split_bounds(start: int, rows: int, parts: int) -> tuple[tuple[int, int], ...]:
    """``parts`` contiguous intervals covering ``[start, start+rows)``: the first ``rows % parts``
    one row longer (torch.tensor_split's rule); intervals may be empty when ``rows < parts``."""
    base, extra = divmod(rows, parts)
    out, lo = [], start
    for j in range(parts):
        hi = lo + base + (1 if j < extra else 0)
        out.append((lo, hi))
        lo = hi
    return tuple(out)


def shard_bounds(V: int, P: int) -> tuple[tuple[int, int], ...]:
    """Vocabulary interval ``[start, stop)`` of each of the ``P`` shards (see module docstring).

    Raises:
        InvalidPlan: ``P < 1`` or ``P > V``.
    """
    if P < 1 or P > V:
        raise InvalidPlan("vocab_parallel", P, f"must be in [1, V ({V})]", "choose P <= vocab_size")
    return split_bounds(0, V, P)


def max_shard_rows(V, P):
    """``V_max = ceil(V/P)``: rows of the largest shard (numpy-friendly)."""
    return ceil_div(V, P)


def strip_cols(V, P, B_v):
    """``V_b = ceil(ceil(V/P)/B_v)``: columns of the widest logits strip (numpy-friendly)."""
    return ceil_div(ceil_div(V, P), B_v)


def moves_activations(n_max, V, P):
    """Auto branch: the batch moves when ``N_max <= ceil(V/P)`` (numpy-friendly boolean)."""
    return np.asarray(n_max) <= ceil_div(V, P)


@dataclass(frozen=True)
class Meeting:
    """One unit of work: the logits of ``batch``'s tokens against ``shard``'s rows."""

    batch: int
    shard: int


@dataclass(frozen=True)
class RingPlan:
    """The integer plan of one Ring-DTP call (identical on every rank of the group)."""

    P: int
    """Ranks in the vocabulary group."""
    V: int
    """Vocabulary rows in all."""
    n_max: int
    """Largest token count in the group (the moving batch buffers have this many rows)."""
    vocab_blocks: int
    """``B_v``: strips per shard."""
    move: Move
    """Which operand travels."""
    shards: tuple[tuple[int, int], ...]
    """``[start, stop)`` of every shard."""
    blocks: tuple[tuple[tuple[int, int], ...], ...]
    """Per shard, the absolute ``[lo, hi)`` of each of its ``B_v`` strips (possibly empty)."""

    # ---- sizes ---------------------------------------------------------------------------------
    @property
    def v_max(self) -> int:
        """Rows of the largest shard: the moving weight buffers have this many rows."""
        return max(b - a for a, b in self.shards)

    @property
    def strip_cols(self) -> int:
        """Columns of the widest strip, ``ceil(V_max/B_v)``."""
        return max(hi - lo for blks in self.blocks for lo, hi in blks)

    def shard_rows(self, j: int) -> int:
        """Rows of shard ``j``."""
        a, b = self.shards[j]
        return b - a

    # ---- ring ----------------------------------------------------------------------------------
    def send_to(self, rank: int) -> int:
        """Group rank every moving tensor of ``rank`` goes to."""
        return (rank + 1) % self.P

    def recv_from(self, rank: int) -> int:
        """Group rank every moving tensor of ``rank`` comes from."""
        return (rank - 1) % self.P

    def owner(self, rank: int, step: int) -> int:
        """Owner of the moving operand ``rank`` holds at ``step``."""
        return (rank - step) % self.P

    def meeting(self, rank: int, step: int) -> Meeting:
        """The meeting ``rank`` computes at ``step``."""
        o = self.owner(rank, step)
        return Meeting(o, rank) if self.move == "activations" else Meeting(rank, o)

    def operand_hop(self, step: int) -> bool:
        """Whether the operand moves after ``step`` (steps ``0..P-2``)."""
        return step < self.P - 1

    @property
    def operand_hops(self) -> int:
        """Operand hops per pass: ``P-1``."""
        return self.P - 1

    @property
    def accumulator_hops(self) -> int:
        """Hops of the state (forward) or gradient (backward) riding on the operand: ``P`` when
        ``P > 1`` (the last one returns it to its owner), else 0."""
        return self.P if self.P > 1 else 0

    def moving_rows(self, owner: int) -> int:
        """Rows sent in a hop of ``owner``'s operand: ``N_max`` for a batch, the shard's rows for
        a weight shard (received into the first rows of a ``V_max``-row buffer)."""
        return self.n_max if self.move == "activations" else self.shard_rows(owner)

    def hop_bytes(self, H: int, b: int) -> dict[str, int]:
        """Bytes one rank sends per hop (``ring_hop_bytes`` of this plan's branch)."""
        return {k: int(v) for k, v in ring_hop_bytes(self.move == "activations", self.n_max, self.v_max, H, b).items()}


TARGET_BYTES = 8
"""Bytes per token of a moving target (int64)."""
STATE_BYTES = 3 * 4
"""Bytes per token of the fp32 triple that rides with a moving batch: ``(m, z, y_t)`` in forward
(``planner/runtime/ring_dtp_state.py``), ``(m, scale/z, scale)`` in backward."""


def ring_hop_bytes(act, n_max, v_max, H: int, b: int) -> dict:
    """Bytes one rank sends per hop (``b`` bytes per operand scalar; fp32 accumulators and
    gradients), for scalars or arrays (the time model's candidates); ``act``: the activations branch.

    Keys: ``fwd_operand``, ``fwd_state``, ``bwd_operand``, ``bwd_grad`` (largest shard for the
    weights branch).
    """
    n, v = np.asarray(n_max, dtype=float), np.asarray(v_max, dtype=float)
    return {"fwd_operand": np.where(act, n * (H * b + TARGET_BYTES), v * H * b),
            "fwd_state": np.where(act, STATE_BYTES * n, 0.0),
            "bwd_operand": np.where(act, n * (H * b + TARGET_BYTES + STATE_BYTES), v * H * b),
            "bwd_grad": np.where(act, 4.0 * n * H, 4.0 * v * H)}


def ring_plan(P: int, V: int, n_max: int, vocab_blocks: int = knob_default("vocab_blocks"), mode: Move | None = None) -> RingPlan:
    """The Ring-DTP plan for a group of ``P`` ranks (DESIGN §7).

    Args:
        P: ranks in the vocabulary group.
        V: vocabulary size.
        n_max: all-reduced largest per-rank token count (``N_max``).
        vocab_blocks: ``B_v`` strips per shard.
        mode: force ``"activations"`` or ``"weights"``; ``None`` picks activations when
            ``N_max <= ceil(V/P)``.

    Raises:
        InvalidPlan: a size is out of range or ``mode`` is unknown.
    """
    if n_max < 0:
        raise InvalidPlan("tokens_per_rank", n_max, "must be >= 0", "pass a non-negative N")
    if vocab_blocks < 1:
        raise InvalidPlan("vocab_blocks", vocab_blocks, "must be >= 1", "use --vocab-blocks 1 or more")
    if mode is not None and mode not in MOVES:
        raise InvalidPlan("mode", mode, f"must be one of {MOVES} or None", "drop mode for the auto branch")
    shards = shard_bounds(V, P)
    if mode is None:
        mode = "activations" if bool(moves_activations(n_max, V, P)) else "weights"
    blocks = tuple(split_bounds(a, b - a, vocab_blocks) for a, b in shards)
    return RingPlan(P=P, V=V, n_max=n_max, vocab_blocks=vocab_blocks, move=mode, shards=shards,
                    blocks=blocks)
