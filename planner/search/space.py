"""Legal candidates of the composed stack and of the FSDP2 baseline (DESIGN §5).

Only legal candidates are enumerated: ``D | W`` with ``D`` dividing the (KV) heads and the tokens,
``E_p | W`` with ``E_p | E``, ``P | W``. Categorical choices (dispatch, vocab, optimizer,
checkpoint; for the baseline ``tp``, AC and CPU offload) form groups; numeric knobs inside a group
are numpy arrays evaluated at once. Knobs a group's operators ignore are not varied (``c`` only for
PipelinedLLEP, ``B_v`` and ``P`` only for a vocab-sharded head, ``β``/``s`` only for
OffloadStreamAdamW, the SCO budget only under SCO).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from planner.context.resolve import divisors
from planner.schema import ModelSpec, Workload

TOKEN_BUDGETS = (2048, 4096, 8192, 16384, 32768)
"""``c`` grid (the paper sweeps 4096–32768)."""
BUCKETS = (50_000_000, 100_000_000, 200_000_000)
"""``β`` grid, parameters."""
SLOTS = (2, 3)
"""``s`` grid."""
VOCAB_BLOCKS = (1, 2, 4, 8)
"""``B_v`` grid."""
SCO_FRACTIONS = (0.25, 0.5, 1.0)
"""SCO budgets tried, as fractions of what host RAM leaves (DESIGN §3.3 default = 1.0)."""
TP_DEGREES = (1, 2, 4, 8)
"""Baseline tensor-parallel degrees (DESIGN §2 FSDP2-best)."""


@dataclass
class Group:
    """One categorical combination and its numeric candidates (parallel arrays)."""

    stack: str
    choices: dict
    """Categorical knobs (dispatch, vocab, optimizer, checkpoint / tp, ac, cpu_offload)."""
    numeric: dict = field(default_factory=dict)
    """Knob name → int array, all of one length."""

    @property
    def size(self) -> int:
        return len(next(iter(self.numeric.values()))) if self.numeric else 1


def _product(**axes) -> dict:
    """Every combination of the axes' values, as parallel int64 arrays (first axis slowest)."""
    grids = np.meshgrid(*[np.asarray(v, dtype=np.int64) for v in axes.values()], indexing="ij")
    return {n: g.reshape(-1) for n, g in zip(axes, grids)}


def composed_groups(model: ModelSpec, workload: Workload, W: int) -> list[Group]:
    """Every legal composed-stack candidate, grouped by categorical choice."""
    tokens = workload.seq_len * workload.seqs_per_microbatch
    heads = model.seq_parallel_heads
    Ds = [d for d in divisors(W) if heads % d == 0 and tokens % d == 0]
    Eps = [e for e in divisors(W) if model.num_experts and model.num_experts % e == 0] or [1]
    Ps = divisors(W)
    dispatches = ("ep", "llep", "pipelined_llep") if model.is_moe else ("ep",)
    out = []
    for disp, voc, opt, ckpt in itertools.product(dispatches, ("dense", "vocab_parallel", "ring_dtp"),
                                                  ("gpu", "cpu_offload", "stream_offload"),
                                                  ("none", "per_layer", "sco")):
        axes = {"seq_parallel": Ds, "expert_parallel": Eps}
        axes["vocab_parallel"] = [1] if voc == "dense" else [p for p in Ps if p > 1] or [1]
        if voc == "ring_dtp":
            axes["vocab_blocks"] = list(VOCAB_BLOCKS)
        if disp == "pipelined_llep":
            axes["token_budget"] = list(TOKEN_BUDGETS)
        if opt == "stream_offload":
            axes["bucket_params"] = list(BUCKETS)
            axes["staging_slots"] = list(SLOTS)
        if ckpt == "sco":
            axes["sco_fraction_pct"] = [int(100 * f) for f in SCO_FRACTIONS]
        out.append(Group("composed", {"dispatch": disp, "vocab": voc, "optimizer": opt, "checkpoint": ckpt},
                         _product(**axes)))
    return out


def baseline_groups(model: ModelSpec, workload: Workload, W: int) -> list[Group]:
    """Every legal FSDP2 candidate: ``W = dp_replicate·dp_shard·cp·tp``, ``ep | dp_shard·cp``,
    ``ep | E``; ``tp`` dividing the heads and KV heads, ``2·cp`` dividing the sequence. Categorical:
    ``tp``, AC, CPU offload, the head (the chunked head only with ``tp = 1``) and the CP rotate
    method (``alltoall`` groups hold only ``cp > 1`` rows)."""
    S = workload.seq_len
    kv = model.num_heads if model.attention == "mla" else model.num_kv_heads
    out = []
    for tp, ac, off, head, rot in itertools.product(TP_DEGREES, ("full", "selective", "none"), (False, True),
                                                    ("dense", "chunked"), ("allgather", "alltoall")):
        if W % tp or model.num_heads % tp or kv % tp or (head == "chunked" and tp > 1):
            continue
        rows = []
        for rep in divisors(W // tp):
            for cp in divisors(W // (tp * rep)):
                if (cp > 1 and S % (2 * cp)) or (rot == "alltoall" and cp == 1):
                    continue
                dp = W // (tp * cp * rep)
                for ep in divisors(dp * cp):
                    if model.num_experts and model.num_experts % ep:
                        continue
                    if not model.num_experts and ep > 1:
                        continue
                    rows.append((cp, dp, ep, rep))
        if rows:
            arr = np.array(rows, dtype=np.int64)
            out.append(Group("fsdp2", {"tp": tp, "ac": ac, "cpu_offload": off, "head": head, "cp_rotate": rot},
                             {"cp": arr[:, 0], "dp_shard": arr[:, 1], "ep": arr[:, 2], "dp_replicate": arr[:, 3]}))
    return out
