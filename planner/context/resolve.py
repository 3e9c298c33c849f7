"""Resolve a plan's defaults and check its degrees against the model and the world (DESIGN §10).

Every rejection is one line: ``knob (value) must relation other (value); fix: …`` (STYLE §3).
"""

from __future__ import annotations

from planner.errors import InvalidPlan
from planner.plans.llep import resolve_max_imports
from planner.plans.routing import with_routing
from planner.schema import BaselineKnobs, ComposedKnobs, ModelSpec, Plan, Workload
from planner.schema.knobs import default as knob_default


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order, by trial division up to ``sqrt(n)``
    (``O(sqrt(n))``: ``W`` is at most 2^20, so at most 1024 trials)."""
    import math

    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
    return small + large[::-1]


def largest_divisor(n: int, ok) -> int:
    """Largest divisor ``d`` of ``n`` with ``ok(d)`` (1 always qualifies)."""
    return max(d for d in divisors(n) if d == 1 or ok(d))


def default_seq_parallel(model: ModelSpec, W: int, tokens: int) -> int:
    """``D``: largest divisor of ``W`` dividing the KV heads (GQA) or heads, and the tokens."""
    heads = model.seq_parallel_heads
    return largest_divisor(W, lambda d: heads % d == 0 and tokens % d == 0)


def released_context_note(model: ModelSpec, workload: Workload) -> str | None:
    """One line when ``S`` exceeds the model's released context (``max_position_embeddings``): the
    memory verdict holds, the model may need context extension."""
    released, S = model.max_position_embeddings, workload.seq_len
    if not released or S <= released:
        return None
    return (f"S = {S:,} exceeds the model's released context ({released:,} tokens): the memory verdict holds, "
            "the model may need context extension")


def seq_parallel_note(model: ModelSpec, workload: Workload, plan: Plan) -> str | None:
    """One line when the default ``D`` fell below what the heads allow because the tokens are not
    divisible (``--seq-len 100001`` on 8 GPUs gives ``D = 1``): the plan is valid, so it is a
    warning, not an error."""
    if plan.stack != "composed" or plan.composed.seq_parallel is not None:
        return None
    W, heads = plan.world_size, model.seq_parallel_heads
    tokens = workload.seq_len * workload.seqs_per_microbatch
    D = default_seq_parallel(model, W, tokens)
    top = largest_divisor(W, lambda d: heads % d == 0)
    if D >= top:
        return None
    return (f"D = {D}, not {top}: the tokens per sequence group ({tokens}) are not a multiple of {top}; "
            f"use a seq-len that {top} divides (e.g. {tokens // top * top or top}) or set --seq-parallel")


def default_expert_parallel(model: ModelSpec, W: int) -> int:
    """``E_p``: largest divisor of ``W`` that divides ``E`` (1 for a dense model)."""
    E = model.num_experts
    return largest_divisor(W, lambda d: E > 0 and E % d == 0)


def default_vocab_parallel(W: int) -> int:
    """``P``: largest divisor of ``W`` that is ≤ 8."""
    return largest_divisor(W, lambda d: d <= 8)


def _need(cond: bool, field: str, value, problem: str, fix: str) -> None:
    if not cond:
        raise InvalidPlan(field, value, problem, fix)


def _choices(n: int, ok) -> str:
    return ", ".join(str(d) for d in divisors(n) if ok(d)) or "none"


def resolve_composed(model: ModelSpec, workload: Workload, plan: Plan) -> ComposedKnobs:
    """Fill the composed stack's defaults and validate its degrees."""
    W, k = plan.world_size, plan.composed
    tokens = workload.seq_len * workload.seqs_per_microbatch
    heads = model.seq_parallel_heads
    what = "KV heads" if model.attention == "gqa" else "heads"
    D = k.seq_parallel or default_seq_parallel(model, W, tokens)
    f = "plan.composed.seq_parallel"
    ok_D = lambda d: heads % d == 0 and tokens % d == 0  # noqa: E731
    _need(W % D == 0, f, D, f"must divide world_size ({W})", f"use one of {_choices(W, ok_D)}")
    _need(heads % D == 0, f, D, f"must divide the model's {what} ({heads})",
          f"use one of {_choices(W, ok_D)}")
    _need(tokens % D == 0, f, D, f"must divide the tokens per sequence group ({tokens})",
          "choose a seq_len that D divides")
    E = model.num_experts
    Ep = k.expert_parallel or default_expert_parallel(model, W)
    f = "plan.composed.expert_parallel"
    _need(W % Ep == 0, f, Ep, f"must divide world_size ({W})",
          f"use one of {_choices(W, lambda d: E == 0 or E % d == 0)}")
    if E:
        _need(E % Ep == 0, f, Ep, f"must divide model.num_experts ({E})",
              f"use one of {_choices(W, lambda d: E % d == 0)}")
    else:
        _need(Ep == 1, f, Ep, "must be 1 for a dense model (no experts)", "drop --expert-parallel")
    f = "plan.composed.vocab_parallel"
    if k.vocab == "dense":
        _need(k.vocab_parallel in (None, 1), f, k.vocab_parallel, "must be 1 with vocab 'dense'",
              "drop --vocab-parallel or use --vocab ring_dtp")
        P = 1
    else:
        P = k.vocab_parallel or default_vocab_parallel(W)
        _need(W % P == 0, f, P, f"must divide world_size ({W})", f"use one of {_choices(W, lambda d: True)}")
        _need(P <= model.vocab_size, f, P, f"must be <= model.vocab_size ({model.vocab_size})", "lower P")
    from planner.plans.buckets import BUCKET_ALIGN

    _need(k.bucket_params >= BUCKET_ALIGN, "plan.composed.bucket_params", k.bucket_params,
          f"must be >= the OffloadStreamAdamW cut alignment ({BUCKET_ALIGN} parameters, "
          "planner.plans.buckets)", "use e.g. --bucket-params 100M")
    rows = -(-model.vocab_size // P)
    _need(k.vocab_blocks <= rows, "plan.composed.vocab_blocks", k.vocab_blocks,
          f"must be <= the rows of one vocabulary shard ({rows})", "lower --vocab-blocks")
    n_imp = k.max_imports
    if k.dispatch in ("llep", "pipelined_llep"):
        n_imp = resolve_max_imports(k.max_imports, E, Ep, knob_default("max_imports"))
    return k.model_copy(update={"seq_parallel": D, "expert_parallel": Ep, "vocab_parallel": P,
                                "max_imports": n_imp})


def resolve_baseline(model: ModelSpec, workload: Workload, plan: Plan) -> BaselineKnobs:
    """Fill the FSDP2 baseline's defaults (DESIGN §2) and validate
    ``W = dp_replicate·dp_shard·cp·tp`` against what torch's APIs accept."""
    W, k = plan.world_size, plan.baseline
    f = "plan.baseline.tp"
    _need(W % k.tp == 0, f, k.tp, f"must divide world_size ({W})", f"use one of {_choices(W, lambda d: True)}")
    _need(model.num_heads % k.tp == 0, f, k.tp, f"must divide model.num_heads ({model.num_heads})",
          f"use one of {_choices(W, lambda d: model.num_heads % d == 0)}")
    kv = model.num_kv_heads if model.attention != "mla" else model.num_heads
    _need(kv % k.tp == 0, f, k.tp, f"must divide model.num_kv_heads ({kv}): ColwiseParallel shards "
          "the K/V projections by head", f"use one of {_choices(W, lambda d: kv % d == 0)}")
    f = "plan.baseline.cp"
    _need(W % (k.tp * k.cp) == 0, f, k.cp, f"times tp ({k.tp}) must divide world_size ({W})",
          "lower --cp or --tp")
    S = workload.seq_len
    _need(S % (2 * k.cp) == 0 or k.cp == 1, f, k.cp,
          f"times 2 must divide the sequence length ({S}): context_parallel shards each sequence "
          "into 2·cp load-balanced chunks", "choose a seq_len divisible by 2·cp")
    f = "plan.baseline.dp_replicate"
    _need(W % (k.dp_replicate * k.tp * k.cp) == 0, f, k.dp_replicate,
          f"times tp ({k.tp}) times cp ({k.cp}) must divide world_size ({W})", "lower --dp-replicate")
    dp = k.dp_shard or W // (k.dp_replicate * k.tp * k.cp)
    _need(k.dp_replicate * dp * k.tp * k.cp == W, "plan.baseline.dp_shard", dp,
          f"times dp_replicate ({k.dp_replicate}) times tp ({k.tp}) times cp ({k.cp}) must equal "
          f"world_size ({W})", "drop --dp-shard to derive it")
    _need(k.head != "chunked" or k.tp == 1, "plan.baseline.head", k.head,
          f"must be dense when tp > 1 ({k.tp}): the chunked head needs the whole vocabulary on the rank",
          "set baseline.head: dense in the plan file (loss parallel), or --tp 1")
    E = model.num_experts
    pool = dp * k.cp
    ep = k.ep or largest_divisor(pool, lambda d: E > 0 and E % d == 0)
    f = "plan.baseline.ep"
    _need(pool % ep == 0, f, ep, f"must divide dp_shard·cp ({pool})",
          f"use one of {_choices(pool, lambda d: E == 0 or E % d == 0)}")
    _need(E == 0 or E % ep == 0, f, ep, f"must divide model.num_experts ({E})",
          f"use one of {_choices(pool, lambda d: E % d == 0)}")
    return k.model_copy(update={"dp_shard": dp, "ep": ep})


def resolve_plan(model: ModelSpec, workload: Workload, plan: Plan) -> Plan:
    """Return ``plan`` with both stacks' defaults filled in (the routing included,
    ``plans.routing.default_routing``) and every degree validated."""
    if plan.stack == "composed":
        plan = plan.model_copy(update={"composed": resolve_composed(model, workload, plan)})
    else:
        plan = plan.model_copy(update={"baseline": resolve_baseline(model, workload, plan)})
    return with_routing(model, plan)
