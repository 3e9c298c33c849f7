"""Operator timing and recompute multiplicities (``planner.timing``), read back in closed form on the
flat profile (every GEMM at one rate, so seconds × rate = FLOPs executed).

The expected counts are derived here from the runtime's code, not from the timing modules:

- expert GEMMs per route, in units of ``2·H·I`` FLOPs (up ``x·W_up`` = 2 units, down = 1):
  EP/LLEP forward 3, backward (autograd of ``mlp``: g_down 1, gh 1, g_up 2, gx 2) 6;
  PipelinedLLEP forward 3, inner reentrant recompute (up only) 2, ``ExpertChunk.backward`` (down
  again 1 + the four gradients 6) 7; per-layer checkpointing adds one more forward (3).
- causal attention per layer, in units of ``S²·h·(d_qk + d_v)``: forward 1, backward 2.5, one more
  forward under checkpointing.
- heads: dense ``6·N·H·V``, Ring-DTP ``8·N·H·V`` FLOPs.
"""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_profiles import ATTN_RATE, BIDIR_BW, EXACT, GEMM_RATE, ctx_of, flat_cluster, tiny_model

from planner.errors import ProfileGap
from planner.plans.llep import LlepKnobs
from planner.timing import offload
from planner.timing.compute import Lookups
from planner.timing.ops import (
    cpu_offload_adamw_time,
    dense_head_s,
    dense_head_time,
    dispatch_time,
    offload_adamw_time,
    ring_dtp_s,
    ring_dtp_time,
)
from planner.timing.dispatch import moe_dispatch_s as dispatch_s
from planner.timing.dispatch import plan_loads
from planner.timing.step import step_time

EXPERT_UNITS = {("ep", "none"): 9, ("ep", "per_layer"): 12, ("llep", "sco"): 12,
                ("pipelined_llep", "none"): 12, ("pipelined_llep", "per_layer"): 15, ("pipelined_llep", "sco"): 15}
"""Expert GEMM FLOPs per route and MoE layer, in units of 2·H·I (module docstring)."""


@pytest.mark.parametrize("dispatch,checkpoint", sorted(EXPERT_UNITS))
def test_expert_matmul_multiplicity(flat, dispatch, checkpoint):
    m = tiny_model()
    ctx = ctx_of(m, flat, dispatch=dispatch, checkpoint=checkpoint, expert_parallel=8)
    st = step_time(ctx, strict=True)
    N = int(ctx.tokens_per_rank)
    want = EXPERT_UNITS[(dispatch, checkpoint)] * 2 * m.hidden_size * m.expert_ffn * m.top_k * N * m.num_moe_layers
    assert st.breakdown["compute_experts"] * GEMM_RATE == pytest.approx(want, rel=EXACT)


def test_pipelined_llep_up_projection_runs_three_times(flat):
    """Against EP under the same checkpointing, PipelinedLLEP adds exactly one up projection (2
    units) and one down projection (1 unit) per route: 15 − 12 = 3 units."""
    m = tiny_model()
    a = step_time(ctx_of(m, flat, dispatch="pipelined_llep", checkpoint="per_layer"), strict=True)
    b = step_time(ctx_of(m, flat, dispatch="ep", checkpoint="per_layer"), strict=True)
    ctx = ctx_of(m, flat)
    extra = 3 * 2 * m.hidden_size * m.expert_ffn * m.top_k * int(ctx.tokens_per_rank) * m.num_moe_layers
    diff = a.breakdown["compute_experts"] - b.breakdown["compute_experts"]
    assert diff * GEMM_RATE == pytest.approx(extra, rel=EXACT)


@pytest.mark.parametrize("checkpoint,units", [("none", 3.5), ("per_layer", 4.5), ("sco", 4.5)])
def test_attention_multiplicity(flat, checkpoint, units):
    m = tiny_model()
    ctx = ctx_of(m, flat, checkpoint=checkpoint, seq_parallel=2)
    st = step_time(ctx, strict=True)
    S, h = ctx.seq_len, m.num_heads / 2
    want = m.num_layers * units * S * S * h * (m.head_dim + m.v_dim)
    assert st.breakdown["compute_attention"] * ATTN_RATE == pytest.approx(want, rel=EXACT)


@pytest.mark.parametrize("N,P,B_v", [(1024, 4, 1), (1024, 4, 4), (4096, 2, 2), (8192, 8, 1)])
def test_ring_dtp_costs_8NHV_against_dense_6NHV(flat, N, P, B_v):
    """Both ring branches (activations when N ≤ V/P, weights otherwise) at V divisible by P·B_v."""
    lk = Lookups(flat, strict=True)
    H, V, b = 512, 8192, 4
    ring = ring_dtp_s(lk, N, H, V, P, B_v, b)
    dense = dense_head_s(lk, N, H, V, b)
    fp32_rate = GEMM_RATE / 8
    assert (ring["gemm_fwd"] + ring["gemm_bwd"]) * fp32_rate == pytest.approx(8 * N * H * V, rel=EXACT)
    assert ring["gemm_fwd"] * fp32_rate == pytest.approx(2 * N * H * V, rel=EXACT)
    assert (dense["gemm_fwd"] + dense["gemm_bwd"]) * fp32_rate == pytest.approx(6 * N * H * V, rel=EXACT)
    fwd, fb = ring_dtp_time(N, H, V, P, B_v, "fp32", flat)
    dfwd, dfb = dense_head_time(N, H, V, "fp32", flat)
    assert fwd > ring["gemm_fwd"] and fb > fwd and dfb > dfwd


def test_head_compute_in_the_step(flat):
    m = tiny_model(vocab_size=8192)
    ring = step_time(ctx_of(m, flat, vocab="ring_dtp", vocab_parallel=4), strict=True)
    dense = step_time(ctx_of(m, flat, vocab="dense"), strict=True)
    assert ring.breakdown["compute_head"] / dense.breakdown["compute_head"] == pytest.approx(4 / 3, rel=EXACT)


def test_expert_parallel_one_moves_no_dispatch_traffic(flat):
    m = tiny_model()
    Ep = np.array([1, 2, 4, 8, 1])
    for disp in ("ep", "llep", "pipelined_llep"):
        st = step_time(ctx_of(m, flat, dispatch=disp, overrides={"expert_parallel": Ep}), strict=True)
        a2a = st.breakdown["a2a_dispatch"]
        assert np.all(a2a[Ep == 1] == 0) and np.all(a2a[Ep > 1] > 0), disp
    base = step_time(ctx_of(m, flat, stack="fsdp2", overrides={"ep": np.array([1, 2, 8])}), strict=True)
    assert base.breakdown["a2a_dispatch"][0] == 0 and np.all(base.breakdown["a2a_dispatch"][1:] > 0)


PHASE_CASES = [dict(checkpoint="sco"), dict(checkpoint="per_layer", dispatch="ep"), dict(checkpoint="none"),
               dict(vocab="dense", optimizer="gpu"), dict(optimizer="cpu_offload", dispatch="llep"),
               dict(stack="fsdp2"), dict(stack="fsdp2", ac="selective"), dict(stack="fsdp2", ac="none"),
               dict(stack="fsdp2", cpu_offload=True)]


@pytest.mark.parametrize("plan", PHASE_CASES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("micro_steps", [1, 3])
def test_phases_sum_to_the_step(flat, plan, micro_steps):
    """The step's seconds by phase kind add up to the total (per candidate, with micro-steps), the
    optimizer phase is the optimizer step, and a checkpointed backward holds its recompute: it is
    at least the forward."""
    from planner.timing.step import PHASES

    overrides = {"expert_parallel": np.array([1, 2, 8])} if plan.get("stack", "composed") == "composed" else None
    st = step_time(ctx_of(tiny_model(), flat, overrides=overrides, **dict(plan)), strict=True,
                   micro_steps_override=micro_steps)
    assert tuple(st.phases) == PHASES
    assert np.allclose(sum(st.phases.values()), st.total_s, rtol=1e-12, atol=0)
    assert all(np.all(v >= 0) for v in st.phases.values())
    assert np.allclose(st.phases["optimizer"], st.optimizer_s, rtol=1e-12)
    assert np.all(st.phases["forward"] > 0) and np.all(st.phases["head"] > 0)
    if plan.get("checkpoint", "sco") != "none" and plan.get("ac", "full") == "full":
        assert np.all(st.phases["backward"] > st.phases["forward"])


def test_no_offload_means_no_host_optimizer_time(flat):
    m = tiny_model()
    gpu = step_time(ctx_of(m, flat, optimizer="gpu"), strict=True)
    assert gpu.breakdown["optimizer_stream"] == 0 and gpu.breakdown["optimizer_cpu_host"] == 0
    assert gpu.breakdown["optimizer_gpu"] > 0
    stream = step_time(ctx_of(m, flat, optimizer="stream_offload"), strict=True)
    cpu = step_time(ctx_of(m, flat, optimizer="cpu_offload"), strict=True)
    assert stream.breakdown["optimizer_stream"] > 0 and cpu.breakdown["optimizer_cpu_host"] > 0
    base = step_time(ctx_of(m, flat, stack="fsdp2"), strict=True)
    assert base.breakdown["optimizer_cpu_host"] == 0
    assert step_time(ctx_of(m, flat, stack="fsdp2", cpu_offload=True), strict=True).breakdown["optimizer_cpu_host"] > 0


def test_stream_steady_state_uses_the_bidirectional_rate():
    """Transfer-bound, 3 slots: every bucket after the first costs one bidirectional cycle, so the
    step moves by (G−1)·3·4β·Δ(1/bidir) when only the bidirectional rate changes."""
    beta, G = 10_000_000, 10
    t = {bw: offload.stream_adamw_s(Lookups(flat_cluster(bidir=bw), strict=True), G * beta, beta, 3)["total"]
         for bw in (BIDIR_BW, BIDIR_BW / 2)}
    want = (G - 1) * 3 * 4 * beta * (2 / BIDIR_BW - 1 / BIDIR_BW)
    assert t[BIDIR_BW / 2] - t[BIDIR_BW] == pytest.approx(want, rel=1e-6)
    serial = offload.stream_adamw_s(Lookups(flat_cluster(), strict=True), G * beta, beta, 1)["total"]
    assert serial > t[BIDIR_BW]


def test_streaming_or_cpu_wins_by_host_resources():
    """Few host cores and little DRAM per GPU: streaming wins; many cores and a slow link: the CPU."""
    theta = 2_000_000_000
    poor = flat_cluster(host_cores=16, host_bw=200e9)
    assert offload_adamw_time(theta, 100_000_000, 2, poor, world_size=8) < \
        cpu_offload_adamw_time(theta, 2, poor, world_size=8)
    slow_link = flat_cluster(host_cores=2048, h2d=4e9, d2h=4e9, bidir=3e9)
    assert cpu_offload_adamw_time(theta, 256, slow_link, world_size=8) < \
        offload_adamw_time(theta, 100_000_000, 2, slow_link, world_size=8)


def test_cpu_offload_threads_and_dram_share():
    """Per GPU: host_cores/G_n threads at the CPU AdamW rate, but never faster than 40 B/param at
    the GPU's share of host DRAM."""
    from synthetic_profiles import CPU_S_PER_PARAM_1T

    theta = 1_000_000_000
    rich = flat_cluster(host_cores=128)
    lk = Lookups(rich, strict=True)
    assert offload.cpu_threads_per_gpu(lk) == 16
    host = offload.host_adamw_s(lk, theta, 16, casts=True, ranks=8)
    assert host == pytest.approx(theta * CPU_S_PER_PARAM_1T / 16 * 40 / 28, rel=1e-6)
    starved = Lookups(flat_cluster(host_cores=128, host_bw=80e9), strict=True)
    assert offload.host_adamw_s(starved, theta, 16, casts=True, ranks=8) == pytest.approx(40 * theta / 10e9, rel=1e-9)
    assert any("host DRAM shared evenly" in a for a in starved.assumed)


def test_sco_exposes_only_slow_copies(flat):
    m = tiny_model(num_layers=6)
    ctx = ctx_of(m, flat, checkpoint="sco", S=16384)
    fast = step_time(ctx, strict=True)
    assert fast.breakdown["sco_exposed"] == 0 and int(ctx.num_offloaded) == 12
    slow = flat_cluster(h2d=2e8, d2h=2e8)
    n_off = np.array([0, 1, 4, 12])
    boundary = int(ctx.tokens_per_rank) * m.hidden_size * 2
    c2 = ctx_of(m, slow, checkpoint="sco", S=16384, overrides={"sco_host_bytes": n_off * boundary})
    assert np.all(c2.num_offloaded == n_off)
    exp = step_time(c2, strict=True).breakdown["sco_exposed"]
    assert exp[0] == 0 and np.all(np.diff(exp) > 0)


def test_sco_counts_pair_each_restore_with_the_next_region():
    regions = ("attention", "moe") * 3
    c = offload.sco_counts(regions, np.array([0, 1, 2, 5, 6]))
    assert c["attention"]["fwd"].tolist() == [0, 1, 1, 3, 3] and c["moe"]["fwd"].tolist() == [0, 0, 1, 2, 3]
    # restoring h_ℓ overlaps region ℓ+1: h_1 → moe, h_2 → attention, ...; h_6 → the head
    assert c["moe"]["bwd"].tolist() == [0, 1, 1, 3, 3] and c["attention"]["bwd"].tolist() == [0, 0, 1, 2, 2]
    assert c["head"].tolist() == [0, 0, 0, 0, 1]


def test_skewed_routing_binds_on_the_hot_rank(flat):
    """80/16 on 64 experts over 8 ranks: standard EP's hot rank computes far more than the mean;
    LLEP spreads the excess (never below the balanced load); both read the runtime's integer plan."""
    args = (4096, 256, 128, 64, 2, 8, 1024)
    ep_bal = dispatch_time("ep", *args, "balanced", flat)
    ep_hot = dispatch_time("ep", *args, "80/16", flat)
    llep_hot = dispatch_time("llep", *args, "80/16", flat)
    assert ep_hot[1] > 3 * ep_bal[1]
    assert ep_bal[1] * (1 - EXACT) <= llep_hot[1] < ep_hot[1] / 2


def test_public_ops_raise_profile_gap_outside_the_curves(h200):
    if h200.curves.gemm_fp32 is None:
        with pytest.raises(ProfileGap, match="gemm_fp32"):
            dense_head_time(16384, 7168, 200000, "fp32", h200)
    no_adamw = flat_cluster()
    no_adamw = no_adamw.model_copy(update={"curves": no_adamw.curves.model_copy(update={"gpu_adamw": None})})
    with pytest.raises(ProfileGap, match="gpu_adamw"):     # the HBM rate of the memory-bound kernels
        dispatch_time("ep", 8192, 256, 128, 16, 2, 8, 256, "balanced", no_adamw)


def test_chunk_curve_is_not_used_and_blocks_keep_the_flops():
    """The chunk-count curve (a single-rank emulation: no overlap to read) does not enter the model;
    PipelinedLLEP's GEMM FLOPs are the same whether a skewed slot runs in one block or several."""
    m = tiny_model()
    chunk = ([1, 2, 4, 8], [1.0, 1.1, 1.25, 1.5])
    ctx = ctx_of(m, flat_cluster(chunk=chunk), dispatch="pipelined_llep", checkpoint="per_layer", token_budget=512)
    assert int(ctx.num_chunks) == 4
    st = step_time(ctx, strict=True)
    plain = step_time(ctx_of(m, flat_cluster(), dispatch="pipelined_llep", checkpoint="per_layer", token_budget=512),
                      strict=True)
    assert st.total_s == pytest.approx(plain.total_s, rel=EXACT)
    base = 15 * 2 * m.hidden_size * m.expert_ffn * m.top_k * int(ctx.tokens_per_rank) * m.num_moe_layers
    assert st.breakdown["compute_experts"] * GEMM_RATE == pytest.approx(base, rel=EXACT)
    lk = Lookups(flat_cluster(), strict=True)
    N, H, I, E, k, E_p, K = 4096, 256, 128, 64, 2, 8, 4
    op = dispatch_s(lk, "pipelined_llep", N, E, k, E_p, K, H, I, 2, profile="95/16", knobs=LlepKnobs(1.0, 16, 1.3, 4),
                    comm=False)
    loads = plan_loads("pipelined_llep", N, E, k, E_p, K, "95/16", LlepKnobs(1.0, 16, 1.3, 4))
    assert (loads["cnt"] > 1).any()                        # the hot slots run in several blocks
    assert op["compute_fwd"] * GEMM_RATE == pytest.approx(3 * 2 * H * I * loads["recv"].sum(1).max(), rel=EXACT)
