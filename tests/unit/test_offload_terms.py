"""Budget terms: boundaries, optimizer step and its host bytes (DESIGN §3.2, §3.3)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.budget import boundaries, boundary_terms, optimizer
from planner.budget.build import make_context
from planner.budget.phases import full_phases
from planner.plans.fsdp2_shards import param_tensors, pinned_shard_bytes, pow2_ceil, shard_numel, shard_params
from planner.schema import BaselineKnobs, ComposedKnobs, Plan, Workload
from planner.schema.io import load_model
from tests.conftest import tiny_moe

W = 8


def _ctx(h200, stack="composed", model=None, seq_len=8192, **kw):
    base = {k: v for k, v in kw.items() if k in BaselineKnobs.model_fields}
    comp = {k: v for k, v in kw.items() if k in ComposedKnobs.model_fields}
    plan = Plan(world_size=W, stack=stack, composed=ComposedKnobs(**comp), baseline=BaselineKnobs(**base))
    return make_context(model or tiny_moe(), h200, Workload(seq_len=seq_len), plan)


def _by_phase(ctx, mod):
    return {p.label: sum(int(t.bytes_in(p)) for t in mod.terms(ctx)) for p in full_phases(ctx)}


@settings(max_examples=300, deadline=None)
@given(x=st.integers(0, 2**50))
def test_pow2_ceil(x):
    want = 0 if x == 0 else 1 << (x - 1).bit_length()
    assert int(pow2_ceil(x)) == want


@pytest.mark.parametrize("name", ["gpt-oss-20b", "deepseek-v3", "qwen1.5-moe-a2.7b", "moe-667b"])
def test_param_tensor_inventory_matches_param_counts(name):
    m = load_model(name)
    assert sum(t.dim0 * t.rest * t.count for t in param_tensors(m)) == m.param_counts()["total"]


def test_fsdp2_cpu_offload_host_bytes_round_every_shard_to_a_power_of_two(h200):
    m = load_model("gpt-oss-20b")
    ctx = _ctx(h200, stack="fsdp2", model=m, cpu_offload=True)
    fsdp = ctx.dp_shard * ctx.cp
    brute = sum(t.count * (1 << (4 * int(shard_numel(t, tp=ctx.tp, fsdp=fsdp, ep=ctx.ep)) - 1).bit_length())
                for t in param_tensors(m))
    hb = [int(t.bytes) for t in optimizer.host_terms(ctx)]
    assert hb[0] == hb[1] == brute == int(pinned_shard_bytes(m, tp=1, fsdp=fsdp, ep=ctx.ep))
    shards = int(shard_params(m, tp=1, fsdp=fsdp, ep=ctx.ep))
    assert shards >= m.param_counts()["total"] // W and hb[2] == 8 * shards
    assert 4 * shards < hb[0] < 8 * shards  # power-of-two blocks cost between 1x and 2x
    assert optimizer.host_terms(_ctx(h200, stack="fsdp2", model=m)) == []


def test_stream_offload_terms(h200):
    ctx = _ctx(h200, optimizer="stream_offload", bucket_params=1 << 20, staging_slots=3)
    n = optimizer.rank_params(ctx)
    G = -(-n // (1 << 20))
    assert sum(int(t.bytes) for t in optimizer.terms(ctx) if t.name.startswith("staging")) == min(3, G) * min(1 << 20, n) * 16
    assert [int(t.bytes) for t in optimizer.host_terms(ctx)] == [-(-12 * n // 4096) * 4096]
    assert optimizer.host_terms(_ctx(h200, optimizer="gpu")) == []  # no offload: no host optimizer bytes
    cpu = _ctx(h200, optimizer="cpu_offload")
    assert sum(int(t.bytes) for t in optimizer.terms(cpu) if t.name.startswith("grad copy")) == 0
    assert sum(int(t.bytes) for t in optimizer.host_terms(cpu)) >= 18 * n


def test_sco_boundaries_by_phase(h200):
    N = _ctx(h200).tokens_per_rank
    ctx = _ctx(h200, checkpoint="sco", sco_host_bytes=3 * N * 256 * 2 + 4095)  # n_off = 3
    nh = N * ctx.hidden_size * ctx.act_bytes
    L_b = ctx.num_boundaries
    assert ctx.num_offloaded == 3
    got = _by_phase(ctx, boundaries)
    final_norm = N * ctx.hidden_size * 4 + N * 4 + nh  # saved fp32 input + rsqrt, normed input
    assert got["head"] == (L_b - 3) * nh + final_norm
    # forward[1] is an attention region (its output comes after its interior: input only); the last
    # region is a MoE region, whose forward holds the dispatcher's output beside its input
    assert ctx.regions[0] == "attention" and ctx.regions[-1] == "moe"
    assert got["forward[1]"] == nh and got[f"forward[{L_b}]"] == (L_b - 1 - 3 + 2) * nh
    # attention regions (odd r) past their recompute: an offloaded input (r <= n_off) is freed, the
    # outgoing gradient is the attention live set's (attention_norm's backward)
    assert got["backward[1]"] == 1 * nh  # grad in; the restored input freed, nothing to prefetch
    assert got["backward[3]"] == 2 * nh  # prefetch h_2 + grad in
    assert got["backward[2]"] == got["backward[4]"] == 4 * nh  # MoE: input + prefetch + grads
    assert got["backward[5]"] == 3 * nh  # h_4 retained + input h_5 (retained: kept) + grad in
    assert got["backward[6]"] == 5 * nh
    per_layer = _by_phase(_ctx(h200, checkpoint="per_layer"), boundaries)
    assert per_layer[f"backward[{L_b}]"] == (L_b + 2) * nh


def test_no_checkpointing_keeps_every_region(h200):
    """``checkpoint = none`` (``saved_composed``): a phase holds the saves of every region before it,
    the head all of them, the earlier MoE regions' dispatcher saves and the final norm's."""
    from planner.budget import dispatch, saved_composed

    ctx = _ctx(h200, checkpoint="none")
    got = _by_phase(ctx, boundary_terms)
    L_b, b = ctx.num_boundaries, ctx.act_bytes
    m, N, H = ctx.model, ctx.tokens_per_rank, ctx.hidden_size
    nh = N * H * b
    region = [int(cb) * b + int(cf) * 4 for cb, cf in (saved_composed.region_counts(ctx, r) for r in range(1, L_b + 1))]
    disp = sum(int(c) * eb for (_, eb), c in dispatch.components(ctx)[2]["saved"].items())
    n_moe = ctx.regions.count("moe")
    final_norm = N * H * 4 + N * 4 + N * H * b
    assert got["head"] == sum(region) + n_moe * disp + final_norm
    own_b, own_f = saved_composed.attention_norm_counts(ctx)   # region 1 (attention): input and the saves its
    assert got["forward[1]"] == nh + int(own_b) * b + int(own_f) * 4   # interior does not hold (no output yet)
    assert 0 < int(own_b) * b + int(own_f) * 4 < region[0]
    norm = 2 * N * H * b + (N * H + N) * 4
    shared_grad = nh if m.shared_expert_ffn else 0         # the shared experts' input gradient
    assert ctx.regions[1] == "moe" and got["backward[2]"] == region[0] + norm + 2 * nh + shared_grad
    fwd = [got[f"forward[{r}]"] for r in range(1, L_b + 1)]
    assert all(a < c for a, c in zip(fwd, fwd[1:]))
    assert got["head"] > _by_phase(_ctx(h200, checkpoint="per_layer"), boundaries)["head"]
    attn_b, attn_f = boundaries.saved_per_token(ctx, "attention")
    assert attn_b == 2 * m.hidden_size + m.num_heads * m.head_dim + m.num_kv_heads * 2 * m.head_dim + m.num_heads * m.v_dim
    assert attn_f == m.hidden_size + 1 + m.num_heads      # the norm's fp32 copy and rsqrt, the lse


def test_fsdp2_boundaries_order_and_tp(h200):
    peak = {(ac, tp): max(_by_phase(_ctx(h200, stack="fsdp2", ac=ac, tp=tp), boundary_terms).values())
            for ac in ("full", "selective", "none") for tp in (1, 2)}
    assert peak["full", 1] < peak["selective", 1] < peak["none", 1]
    assert all(peak[ac, 2] < peak[ac, 1] for ac in ("full", "selective", "none"))


def test_vectorised_over_candidates(h200):
    ctx = make_context(tiny_moe(), h200, Workload(seq_len=8192), Plan(world_size=W),
                       overrides={"sco_host_bytes": np.array([0, 2**22, 2**40]),
                                  "bucket_params": np.array([1 << 16, 1 << 20, 1 << 24])})
    for mod in (boundaries, optimizer):
        for t in mod.terms(ctx):
            for p in full_phases(ctx):
                assert np.all(np.asarray(t.bytes_in(p)) >= 0)
    assert ctx.num_offloaded.tolist()[0] == 0 and ctx.num_offloaded.tolist()[2] == ctx.num_boundaries
