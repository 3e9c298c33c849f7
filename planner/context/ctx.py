"""``Ctx``: the resolved symbols of DESIGN §1 that every live-set module reads.

Numeric knobs may be Python ints or numpy arrays (one entry per search candidate); categorical
choices (dispatch, vocab, optimizer, checkpoint, stack) are scalars, so the search groups candidates
by them and vectorises over the rest.

Legend (symbol → field): W world_size, L num_layers, L_b num_boundaries, H hidden_size,
I expert_ffn, I_d dense_ffn, E num_experts, k top_k, V vocab_size, S seq_len, N tokens_per_rank,
D seq_parallel, E_p expert_parallel, P vocab_parallel, B_v vocab_blocks, c token_budget,
K_max max_chunks, K num_chunks, c_eff chunk_tokens, α llep_alpha, m llep_min_tokens,
λ llep_lambda, n_import_max max_imports, β bucket_params, s staging_slots, Θ num_params,
b act_bytes, n_off num_offloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from planner.schema import ClusterSpec, ModelSpec
from planner.schema.knobs import default as knob_default

Int = Any
"""A Python int or a numpy integer array."""


@dataclass(frozen=True)
class Ctx:
    """Everything a live-set module needs; see the module legend for the symbols."""

    model: ModelSpec
    cluster: ClusterSpec
    stack: str                     # "composed" | "fsdp2"
    # -- model ---------------------------------------------------------------------------------
    num_layers: int                # L
    num_boundaries: int            # L_b (2L composed; L for the FSDP2 per-layer baseline)
    hidden_size: int               # H
    expert_ffn: int                # I
    dense_ffn: int                 # I_d
    num_experts: int               # E
    top_k: int                     # k
    vocab_size: int                # V
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    params: dict                   # ModelSpec.param_counts(): by owner
    num_params: int                # Θ
    # -- workload ------------------------------------------------------------------------------
    seq_len: int                   # S
    seqs_per_microbatch: int
    tokens_per_rank: Int           # N
    # -- plan: shared --------------------------------------------------------------------------
    world_size: int                # W
    act_bytes: int                 # b
    routing: str                   # "balanced" | "worst" | "skew"
    routing_hot_share: float       # r of R/H
    routing_hot_experts: int       # h of R/H
    routing_text: str
    dispatch_bound: str            # "guarantee" | "expected"
    dispatch_rank: int | None = None  # expected size on this expert-group rank's plan (planner validate); None: the largest over ranks
    dispatch_left_out: bool = False  # dispatch working sets at zero: a lower bound of the peak (budget.frontier's pre-scan)
    grad_lifetime: str = knob_default("grad_lifetime")  # "accumulate" (kept across micro-steps) | "freed" (set_to_none)
    # -- plan: composed ------------------------------------------------------------------------
    dispatch: str = knob_default("dispatch")
    dispatch_residue: str = knob_default("dispatch_residue")   # PipelinedLLEP: "source" | "destination"
    vocab: str = knob_default("vocab")
    optimizer: str = knob_default("optimizer")
    checkpoint: str = knob_default("checkpoint")
    seq_parallel: Int = 1          # D
    expert_parallel: Int = 1       # E_p
    vocab_parallel: Int = 1        # P
    vocab_blocks: Int = knob_default("vocab_blocks")          # B_v
    token_budget: Int = knob_default("token_budget")       # c
    max_chunks: Int = knob_default("max_chunks")           # K_max
    num_chunks: Int = 1            # K
    chunk_tokens: Int = knob_default("token_budget")  # c_eff (= c while K = 1)
    llep_alpha: float = knob_default("llep_alpha")        # α
    llep_min_tokens: int = knob_default("llep_min_tokens")    # m
    llep_lambda: float = knob_default("llep_lambda")       # λ
    max_imports: Int = knob_default("max_imports")           # n_import_max
    bucket_params: Int = knob_default("bucket_params")  # β
    staging_slots: Int = knob_default("staging_slots")         # s
    sco_host_bytes: Int = 0        # SCO budget, physical pinned bytes per rank
    num_offloaded: Int = 0         # n_off: boundaries SCO offloads
    # -- plan: FSDP2 baseline ------------------------------------------------------------------
    tp: Int = knob_default("tp")
    cp: Int = knob_default("cp")
    dp_shard: Int = 1
    ep: Int = 1
    ac: str = knob_default("ac")
    cpu_offload: bool = knob_default("cpu_offload")
    dp_replicate: Int = knob_default("dp_replicate")          # HSDP replicas (W = dp_replicate·dp_shard·cp·tp)
    cp_rotate: str = knob_default("cp_rotate")   # context_parallel rotate method
    head: str = knob_default("head")            # "dense" (loss parallel under tp) | "chunked"
    head_chunk_tokens: Int = knob_default("head_chunk_tokens")
    # -- bookkeeping ---------------------------------------------------------------------------
    notes: dict = field(default_factory=dict)
    plan: Any = None
    """The resolved ``Plan`` (``resolve_plan`` runs once per configuration, in ``derive_context``)."""

    def __getattr__(self, name: str):
        """A knob with no field here reads the resolved plan (a scalar: the search vectorises only
        the fields above). So a new knob is declared once, in ``planner.schema.plan``, and read as
        ``ctx.<knob>`` where it is used."""
        from planner.schema.knobs import KNOBS

        knob, plan = KNOBS.get(name), self.__dict__.get("plan")
        if knob is None or plan is None:
            raise AttributeError(name)
        return getattr(plan if knob.part == "plan" else getattr(plan, knob.part), name)

    @property
    def b(self) -> int:
        """Bytes per activation scalar."""
        return self.act_bytes

    @property
    def regions(self) -> tuple[str, ...]:
        """Kinds of the checkpointed regions in forward order (``len == L_b``).

        Composed stack: per layer an ``attention`` region then a ``moe`` or ``dense_mlp`` region.
        FSDP2 baseline (one region per layer): the layer's FFN kind, with attention folded in.
        """
        dense = set(self.model.dense_layers) if self.model.is_moe else set(range(self.num_layers))
        out: list[str] = []
        for layer in range(self.num_layers):
            ffn = "dense_mlp" if layer in dense else "moe"
            out.extend(["attention", ffn] if self.stack == "composed" else [ffn])
        return tuple(out)


CTX_FIELDS = frozenset(f.name for f in fields(Ctx))
"""The knobs (and symbols) ``Ctx`` holds as fields (numpy arrays in the search); any other knob is
read from the resolved plan (``Ctx.__getattr__``)."""
