"""Derive the ``Ctx`` of one resolved configuration (or of many candidates, for the search): every
DESIGN §1 symbol (``N``, ``K``, ``c_eff``, the resolved degrees) computed once, here, below both
the memory and the time model. The SCO fill (``n_off``), which needs the memory model, is added by
``planner.budget.build.make_context``."""

from __future__ import annotations

import numpy as np

from planner.context.ctx import CTX_FIELDS, Ctx
from planner.context.resolve import resolve_plan
from planner.plans import chunking
from planner.plans.routing import with_routing
from planner.errors import InvalidPlan
from planner.schema import ClusterSpec, ModelSpec, Plan, Workload, parse_routing
from planner.schema.knobs import BASELINE_KEYS, COMPOSED_KEYS
from planner.units import DTYPE_BYTES, ceil_div

MAX_ESTIMATE_BYTES = 1 << 58
"""Largest per-rank byte estimate (``magnitude_estimate``) the budget evaluates: 256 PiB. The
estimate over-counts every live set, and numpy's int64 holds 2^63, so every term, phase sum and peak
of an accepted configuration is exact. Anything near this is thousands of times any GPU's HBM."""


def chunk_symbols(N, token_budget, max_chunks):
    """``(K, c_eff)`` of PipelinedLLEP's chunking: ``K = min(ceil(N/c), K_max)`` and
    ``c_eff = ceil(N/K)`` (``planner.plans.chunking``, the operators' own rule), for ints or numpy
    arrays. ``derive_context`` puts them in ``Ctx.num_chunks`` / ``Ctx.chunk_tokens``, where the
    memory and the time model read them."""
    K = chunking.num_chunks(N, token_budget, max_chunks)
    return K, chunking.chunk_tokens(N, K)


def rank_params(ctx: Ctx):
    """``Θ_r``: parameters whose fp32 master, m, v one rank holds (the memory model's optimizer
    state and the time model's optimizer step both read it)."""
    p = ctx.params
    if ctx.stack == "fsdp2":
        return ceil_div(p["total"], ctx.world_size)
    return ceil_div(p["dense"] + p["head"], ctx.world_size) + ceil_div(p["experts"], ctx.world_size)


def derive_context(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, *,
                   resolved: bool = False, overrides: dict | None = None) -> tuple[Ctx, object]:
    """Resolve ``plan`` and derive every DESIGN §1 symbol; returns the ``Ctx`` (SCO not yet
    filled) and the search's SCO fraction (``sco_fraction_pct`` of ``overrides``, or ``None``).

    ``overrides`` replaces numeric fields with numpy arrays (one entry per search candidate), e.g.
    ``{"token_budget": np.array([4096, 8192])}``, or ``seq_len`` / ``seqs_per_microbatch`` arrays
    for the frontier scans; derived fields (``K``, ``c_eff``, ``n_off``) are
    recomputed from them.

    Raises:
        InvalidPlan: a degree does not divide what it must, or the global batch is not a whole
            number of micro-steps.
    """
    if not resolved:
        plan = resolve_plan(model, workload, plan)
    plan = with_routing(model, plan)
    kind, hot_share, hot = check_routing(model, plan.routing)
    params = model.param_counts()
    overrides = dict(overrides or {})
    seq_len = overrides.pop("seq_len", workload.seq_len)
    seqs = overrides.pop("seqs_per_microbatch", workload.seqs_per_microbatch)
    sco_pct = overrides.pop("sco_fraction_pct", None)
    tokens_seq = seq_len * seqs  # ints, or numpy arrays for the frontier scans
    common = dict(
        model=model, cluster=cluster, stack=plan.stack,
        num_layers=model.num_layers, hidden_size=model.hidden_size, expert_ffn=model.expert_ffn,
        dense_ffn=model.dense_ffn, num_experts=model.num_experts, top_k=model.top_k,
        vocab_size=model.vocab_size, num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim, v_head_dim=model.v_dim, params=params, num_params=params["total"],
        seq_len=seq_len, seqs_per_microbatch=seqs,
        world_size=plan.world_size, act_bytes=DTYPE_BYTES[plan.dtype],
        routing=kind, routing_hot_share=hot_share, routing_hot_experts=hot, routing_text=plan.routing,
        dispatch_bound=plan.dispatch_bound,
        notes={"global_batch_tokens": workload.global_batch_tokens}, plan=plan,
    )
    if plan.stack == "composed":
        fields = {n: getattr(plan.composed, n) for n in COMPOSED_KEYS if n in CTX_FIELDS}
        fields.update(overrides)
        N = ceil_div(tokens_seq, fields["seq_parallel"])
        K, c_eff = chunk_symbols(N, fields["token_budget"], fields["max_chunks"])
        ctx = Ctx(**common, **fields, num_boundaries=2 * model.num_layers, tokens_per_rank=N,
                  num_chunks=K, chunk_tokens=c_eff)
    else:
        k = plan.baseline
        fields = {n: getattr(k, n) for n in BASELINE_KEYS if n in CTX_FIELDS}
        fields.update(overrides)
        ep = fields["ep"]
        ctx = Ctx(**common, **fields, num_boundaries=model.num_layers,
                  tokens_per_rank=ceil_div(tokens_seq, fields["cp"]), dispatch="ep",
                  vocab="vocab_parallel" if fields["tp"] > 1 else "dense",
                  optimizer="cpu_offload" if k.cpu_offload else "gpu",
                  checkpoint="none" if k.ac == "none" else "per_layer", expert_parallel=ep,
                  vocab_parallel=fields["tp"], sco_host_bytes=0)
    _check_global_batch(workload, plan, ctx)
    _check_magnitude(ctx)
    return ctx, sco_pct


def magnitude_estimate(ctx: Ctx) -> int:
    """A generous upper estimate of any per-rank byte count of ``ctx`` (Python int, exact).

    Per token and checkpointed region ``b·(256·H + 32·E + 16·n_h·(d_h + d_v))`` (activations,
    router, attention), per token and MoE region holding routed rows ``16·b·E_p·k·(H + I)`` (two such
    regions when the regions are checkpointed, all ``L_b`` without checkpointing), plus ``16·V`` per
    token (logits and their gradients), ``16·Θ`` (weights, gradients, optimizer state) and ``16·s·β``
    (staging), all with the largest ``N`` and ``E_p`` of the candidates.
    """
    N = int(np.max(np.asarray(ctx.tokens_per_rank)))
    E_p = int(np.max(np.asarray(ctx.ep if ctx.stack == "fsdp2" else ctx.expert_parallel)))
    H, I, E, k = ctx.hidden_size, ctx.expert_ffn, ctx.num_experts, ctx.top_k
    attn = ctx.num_heads * (ctx.head_dim + ctx.v_head_dim)
    saved = ctx.checkpoint == "none" if ctx.stack == "composed" else ctx.ac != "full"
    routed_regions = ctx.num_boundaries if saved else 2
    per_token = ctx.num_boundaries * ctx.act_bytes * (256 * H + 32 * E + 16 * attn)
    per_token += routed_regions * ctx.act_bytes * 16 * E_p * k * (H + I) + 16 * ctx.vocab_size
    staging = 16 * int(np.max(np.asarray(ctx.staging_slots))) * int(np.max(np.asarray(ctx.bucket_params)))
    return N * per_token + 16 * int(ctx.num_params) + staging


def _magnitude_parts(ctx: Ctx) -> dict[str, int]:
    """The parts of ``magnitude_estimate`` that no sequence length changes, at ``N = 1``, keyed by
    the field to blame."""
    E_p = int(np.max(np.asarray(ctx.ep if ctx.stack == "fsdp2" else ctx.expert_parallel)))
    H, I, E, k = ctx.hidden_size, ctx.expert_ffn, ctx.num_experts, ctx.top_k
    attn = ctx.num_heads * (ctx.head_dim + ctx.v_head_dim)
    saved = ctx.checkpoint == "none" if ctx.stack == "composed" else ctx.ac != "full"
    routed_regions = ctx.num_boundaries if saved else 2
    b = ctx.act_bytes
    return {
        "model.num_layers": ctx.num_boundaries * b * (256 * H + 32 * E + 16 * attn),
        "model.top_k": routed_regions * b * 16 * E_p * k * (H + I),
        "model.vocab_size": 16 * ctx.vocab_size,
        "model.hidden_size": 16 * int(ctx.num_params),
        "plan.composed.bucket_params": 16 * int(np.max(np.asarray(ctx.staging_slots)))
        * int(np.max(np.asarray(ctx.bucket_params))),
    }


def _check_magnitude(ctx: Ctx) -> None:
    est = magnitude_estimate(ctx)
    parts = _magnitude_parts(ctx)
    if sum(parts.values()) > MAX_ESTIMATE_BYTES:   # too large at one token per rank: not S's fault
        field = max(parts, key=parts.get)
        value = getattr(ctx, field.rsplit(".", 1)[1], None)
        raise InvalidPlan(field, int(np.max(np.asarray(value))) if value is not None else None,
                          f"gives per-rank byte counts (estimate {sum(parts.values()):.3g} B at one token per "
                          f"rank) beyond what the planner evaluates exactly (2^58 B = 256 PiB)",
                          f"lower {field}" + (" or --expert-parallel" if field == "model.top_k" else ""))
    if est > MAX_ESTIMATE_BYTES:
        N = int(np.max(np.asarray(ctx.tokens_per_rank)))
        raise InvalidPlan("workload.seq_len", int(np.max(np.asarray(ctx.seq_len))),
                          f"gives N = {N} tokens per rank, whose per-rank byte counts (estimate "
                          f"{est:.3g} B) exceed what the planner evaluates exactly "
                          f"(2^58 B = 256 PiB, far past any GPU)",
                          "lower the sequence length or the batch, or raise the sequence-parallel degree "
                          "(check: --seq-parallel)")


def check_routing(model: ModelSpec, routing: str) -> tuple[str, float, int]:
    """Reject skew profiles ``R/H`` no top-k router can produce (DESIGN §3.2 profiles); returns the
    parsed routing ``(kind, hot share r, hot experts H)`` (``planner.schema.parse_routing``).

    A top-k router never picks one expert twice for a token, so the hot tokens need ``H >= k``
    distinct hot experts and the cold tokens ``E - H >= k`` cold ones (or none, ``H = E``: the cold
    tokens then use the hot experts). Under these, standard EP's ``worst`` is the maximum.

    Raises:
        InvalidPlan: ``H > E``, ``H < k`` with hot tokens, or ``0 < E - H < k`` with cold tokens.
    """
    parsed = kind, hot_share, hot = parse_routing(routing)
    if kind != "skew" or not model.is_moe:
        return parsed
    E, k = model.num_experts, model.top_k
    if hot > E:
        raise InvalidPlan("plan.routing", routing, f"hot experts must be <= model.num_experts ({E})",
                          "lower H in R/H")
    if hot_share > 0 and hot < k:
        raise InvalidPlan("plan.routing", routing,
                          f"hot experts H ({hot}) must be >= model.top_k ({k}): a top-k router never "
                          "picks one expert twice for a token", f"use H >= {k}, or --routing worst")
    if hot_share < 1 and 0 < E - hot < k:
        raise InvalidPlan("plan.routing", routing,
                          f"cold experts E - H ({E - hot}) must be 0 or >= model.top_k ({k}): a top-k "
                          "router never picks one expert twice for a token", f"use H <= {E - k} or H = {E}")
    return parsed


def global_batch_divides(workload: Workload, world_size: int, tokens_per_rank) -> np.ndarray:
    """Per candidate: the global batch is a whole number of micro-steps of ``W·N`` tokens (all true
    without ``global_batch_tokens``). A search drops the candidates where it is not."""
    N = np.asarray(tokens_per_rank, dtype=np.int64)
    if workload.global_batch_tokens is None:
        return np.ones(N.shape, dtype=bool)
    return workload.global_batch_tokens % (N * world_size) == 0


def _check_global_batch(workload: Workload, plan: Plan, ctx: Ctx) -> None:
    """Refuse a global batch that no candidate of ``ctx`` divides into micro-steps (a search
    over many ``N`` keeps the candidates that divide it: ``global_batch_divides``)."""
    if workload.global_batch_tokens is None:
        return
    divides = global_batch_divides(workload, plan.world_size, ctx.tokens_per_rank)
    if divides.any():
        return
    per_step = int(np.min(np.asarray(ctx.tokens_per_rank))) * plan.world_size
    if workload.global_batch_tokens % per_step:
        raise InvalidPlan("workload.global_batch_tokens", workload.global_batch_tokens,
                          f"must be a multiple of the tokens per micro-step W·N ({per_step})",
                          f"use e.g. {per_step * max(1, workload.global_batch_tokens // per_step)}")
