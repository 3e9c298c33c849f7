"""Build the ``Ctx`` of one resolved configuration (or of many candidates, for the search)."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.budget.context import Ctx
from planner.budget.resolve import resolve_plan
from planner.errors import InvalidPlan
from planner.schema import ClusterSpec, ModelSpec, Plan, Workload, parse_routing
from planner.units import DTYPE_BYTES, ceil_div


def make_context(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, *,
                 resolved: bool = False, overrides: dict | None = None) -> Ctx:
    """Resolve ``plan`` and derive every DESIGN §1 symbol.

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
    kind, hot_share, hot = parse_routing(plan.routing)
    if kind == "skew" and model.is_moe and hot > model.num_experts:
        raise InvalidPlan("plan.routing", plan.routing, f"hot experts must be <= model.num_experts "
                          f"({model.num_experts})", "lower H in R/H")
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
        notes={"global_batch_tokens": workload.global_batch_tokens},
    )
    if plan.stack == "composed":
        k = plan.composed
        fields = dict(
            dispatch=k.dispatch, vocab=k.vocab, optimizer=k.optimizer, checkpoint=k.checkpoint,
            seq_parallel=k.seq_parallel, expert_parallel=k.expert_parallel,
            vocab_parallel=k.vocab_parallel, vocab_blocks=k.vocab_blocks, token_budget=k.token_budget,
            max_chunks=k.max_chunks, llep_alpha=k.llep_alpha, llep_min_tokens=k.llep_min_tokens,
            llep_lambda=k.llep_lambda, max_imports=k.max_imports, bucket_params=k.bucket_params,
            staging_slots=k.staging_slots, sco_host_bytes=k.sco_host_bytes,
        )
        fields.update(overrides)
        N = ceil_div(tokens_seq, fields["seq_parallel"])
        K = np.minimum(ceil_div(N, fields["token_budget"]), fields["max_chunks"])
        ctx = Ctx(**common, **fields, num_boundaries=2 * model.num_layers, tokens_per_rank=N,
                  num_chunks=K, chunk_tokens=ceil_div(N, K))
    else:
        k = plan.baseline
        fields = dict(tp=k.tp, cp=k.cp, dp_shard=k.dp_shard, ep=k.ep, ac=k.ac, cpu_offload=k.cpu_offload)
        fields.update(overrides)
        ep = fields["ep"]
        ctx = Ctx(**common, **fields, num_boundaries=model.num_layers,
                  tokens_per_rank=ceil_div(tokens_seq, fields["cp"]), dispatch="ep",
                  vocab="vocab_parallel" if fields["tp"] > 1 else "dense",
                  optimizer="cpu_offload" if k.cpu_offload else "gpu",
                  checkpoint="none" if k.ac == "none" else "per_layer", expert_parallel=ep,
                  vocab_parallel=fields["tp"], sco_host_bytes=0)
    _check_global_batch(workload, plan, ctx)
    return _with_sco(ctx, sco_pct)


def _check_global_batch(workload: Workload, plan: Plan, ctx: Ctx) -> None:
    if workload.global_batch_tokens is None:
        return
    per_step = int(np.max(np.asarray(ctx.tokens_per_rank))) * plan.world_size
    if workload.global_batch_tokens % per_step:
        raise InvalidPlan("workload.global_batch_tokens", workload.global_batch_tokens,
                          f"must be a multiple of the tokens per micro-step W·N ({per_step})",
                          f"use e.g. {per_step * max(1, workload.global_batch_tokens // per_step)}")


def _with_sco(ctx: Ctx, pct=None) -> Ctx:
    """Fill the SCO host budget (default: what host RAM leaves, DESIGN §3.3, or ``pct`` percent of
    it for the search) and ``n_off``."""
    if ctx.stack != "composed" or ctx.checkpoint != "sco":
        return dataclasses.replace(ctx, sco_host_bytes=0, num_offloaded=0)
    from planner.budget.host import default_sco_budget
    from planner.plans.sco import num_offloaded

    budget = ctx.sco_host_bytes
    if budget is None:
        budget = default_sco_budget(ctx)
        if pct is not None:
            budget = budget * pct // 100
    n_off = num_offloaded(ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes, ctx.num_boundaries, budget)
    return dataclasses.replace(ctx, sco_host_bytes=budget, num_offloaded=n_off)
