"""What op-level selective AC keeps of one FSDP2 baseline layer (``planner.budget.fsdp2_saved
.sac_saved_parts``), rule by rule, on gpt-oss-20b and Qwen3-30B-A3B: a biased projection is an
``addmm`` (always saved), the bias-free ones ``mm``s (every second saved); the router's ``addmm``
logits and its top-k; the SDPA output over the kernel's rows, sink-padded."""

from __future__ import annotations

import pytest

from planner.api.build import build_planfile
from planner.budget.build import make_context
from planner.budget.fsdp2_saved import dims, sac_saved_counts, sac_saved_parts
from planner.plans.sdpa_layout import SINK_PAD

W, S = 8, 8192


def _ctx(model: str, **model_update):
    pf = build_planfile(model=model, gpus=W, seq_len=S, overrides={"stack": "fsdp2", "ac": "selective"})
    spec = pf.model.model_copy(update=model_update) if model_update else pf.model
    return make_context(spec, pf.cluster, pf.workload, pf.plan)


def _parts(ctx, **kw) -> dict[str, tuple]:
    return {n.split(" (")[0] if n.startswith("SAC-saved matmul") else n: (c, eb, f)
            for n, c, eb, f in sac_saved_parts(ctx, "moe", **kw)}


def _matmuls(ctx) -> str:
    return next(n for n, *_ in sac_saved_parts(ctx, "moe") if n.startswith("SAC-saved matmul"))


def test_biased_projections_are_all_saved_bias_free_ones_every_second():
    biased, plain = _ctx("gpt-oss-20b"), _ctx("gpt-oss-20b", attention_bias=False)
    assert _matmuls(biased).endswith("(q, k, v, o)") and _matmuls(plain).endswith("(q, v)")
    N, H = biased.tokens_per_rank, biased.hidden_size
    hq, hkv, d_qk, d_v = dims(biased)
    got = _parts(biased)["SAC-saved matmul outputs"][0] - _parts(plain)["SAC-saved matmul outputs"][0]
    assert got == N * (hkv * d_qk + H)
    assert _matmuls(_ctx("qwen3-30b-a3b")).endswith("(q, v)")


@pytest.mark.parametrize("model", ["gpt-oss-20b", "qwen3-30b-a3b"])
def test_router_logits_only_when_biased_and_top_k_always(model):
    ctx = _ctx(model)
    p, N, E, k = _parts(ctx), ctx.tokens_per_rank, ctx.num_experts, ctx.top_k
    assert ("SAC-saved router logits (addmm)" in p) == bool(ctx.model.router_bias)
    if ctx.model.router_bias:
        assert p["SAC-saved router logits (addmm)"][:2] == (N * E, None)
    assert p["SAC-saved top-k values (fp32)"][:2] == (N * k, 4)
    assert p["SAC-saved top-k ids (int64)"][:2] == (N * k, 8)
    # the running layer's top-k values are the dispatch live set's router weights
    assert "SAC-saved top-k values (fp32)" not in _parts(ctx, current=True)


def test_sdpa_output_rows_and_sink_padded_width():
    ctx = _ctx("gpt-oss-20b")
    N, B, w = ctx.tokens_per_rank, ctx.seqs_per_microbatch, ctx.model.sliding_window
    hq, _, d_qk, d_v = dims(ctx)
    glob, local = _parts(ctx)["SAC-saved SDPA output"], _parts(ctx, local=True)["SAC-saved SDPA output"]
    assert glob[0] == (N + B) * hq * (d_qk + SINK_PAD)       # the sink's dummy query row per sequence
    assert local[0] == B * -(-(N // B) // w) * w * hq * (d_qk + SINK_PAD)
    plain = _parts(_ctx("gpt-oss-20b", attention_sinks=False))["SAC-saved SDPA output"]
    assert plain[0] == N * hq * d_v
    assert _parts(ctx)["SAC-saved SDPA lse (fp32)"][:2] == ((N + B) * hq, 4)


@pytest.mark.parametrize("local", [False, True])
def test_counts_sum_the_parts(local):
    ctx = _ctx("gpt-oss-20b")
    parts = sac_saved_parts(ctx, "moe", local)
    cb, cf = sac_saved_counts(ctx, "moe", local)
    assert cb == sum(c for _, c, eb, _ in parts if eb is None)
    assert cf == sum(c * eb // 4 for _, c, eb, _ in parts if eb is not None)
    assert all(f for *_, f in parts)   # every part carries its formula text


def test_a_running_sub_step_holds_only_the_matmul_outputs_before_it():
    """The current layer's FFN outputs after the running sub-step do not exist yet: none of the
    shared experts' while the routed experts run, not the down projection inside the gated MLP."""
    pf = build_planfile(model="deepseek-v2-lite", gpus=W, seq_len=S, overrides={"stack": "fsdp2", "ac": "selective"})
    ctx = make_context(pf.model, pf.cluster, pf.workload, pf.plan)
    names = lambda kind, stage: next(n for n, *_ in sac_saved_parts(ctx, kind, stage=stage)  # noqa: E731
                                     if n.startswith("SAC-saved matmul"))
    assert names("dense_mlp", None).endswith("(q, kv_b, gate, down)")
    assert names("dense_mlp", "mlp").endswith("(q, kv_b, gate)")
    assert names("moe", None).endswith("(q, kv_b, gate, down)")     # the shared experts' gate and down
    assert names("moe", "dispatch").endswith("(q, kv_b)")
