"""The FSDP2 baseline's ring attention under context parallelism (``planner.budget.fsdp2_ring``)
against the H200 allocator histories of planner validate's own step (DeepSeek-V2-Lite, two layers,
the dense first layer's attention binding): the blocks the ring allocates inside the SDPA call, one
by one, and each history's phase totals within the memory bounds."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from planner.api import build_planfile
from planner.budget import fsdp2_layer, fsdp2_ring
from planner.runtime.validate import COMPARED_BOUND
from planner.runtime.validate_compare import memory_ok
from planner.runtime.validate_plan import predict, truncate

SNAPSHOTS = Path(__file__).resolve().parents[2] / "bench/results/memory_snapshot"
CASES = {   # as bench/memory_snapshot.py ran them
    "fsdp2-dsv2-W8-S393216-cp8": (8, 393216, {"cp": 8}, "accumulate"),
    "fsdp2-dsv2-W8-S262144-cp8-alltoall": (8, 262144, {"cp": 8, "cp_rotate": "alltoall"}, "freed"),
    "fsdp2-dsv2-W8-S262144-cp8-selective": (8, 262144, {"cp": 8, "ac": "selective"}, "freed"),
}
SDPA_SITE = "runtime/sdpa.py:56 _sdpa"
BACKWARD_NODE = "ScaledDotProductEfficientAttentionBackward0"
EXCHANGE = "attention, dK/dV exchange"


def _prediction(case, model="deepseek-v2-lite"):
    W, S, knobs, life = CASES[case]
    pf = truncate(build_planfile(model=model, gpus=W, seq_len=S, overrides={"stack": "fsdp2", **knobs}), 2).planfile
    return predict(pf, life, timing=False, dispatch_bound=COMPARED_BOUND)


def _doc(case):
    return json.loads((SNAPSHOTS / f"{case}.json").read_text())


def _blocks(doc, label, site):
    g = [g for g in doc["phases"][label]["groups"] if site in g["site"]]
    assert len(g) == 1 and g[0]["blocks"] == len(g[0]["largest_blocks"]), (label, site)
    return Counter(g[0]["largest_blocks"])


def _shapes(ctx):
    hq, hkv, d_qk, d_v = fsdp2_layer.dims(ctx)
    N, b = int(ctx.tokens_per_rank), ctx.act_bytes
    return N, hq, hkv, d_qk, d_v, b, N * hkv * (d_qk + d_v)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_phase_within_bounds(case):
    p, doc = _prediction(case), _doc(case)
    for r in doc["validate"]["rows"]:
        if r["unit"] == "bytes" and r["judged"] and r["measured"]:
            pred = p.phase_bytes(r["phase"]) if r["what"] == "phase total" else None
            if pred is not None:
                assert memory_ok(pred, r["measured"]), (case, r["phase"], pred / r["measured"])


@pytest.mark.parametrize("case", ["fsdp2-dsv2-W8-S393216-cp8", "fsdp2-dsv2-W8-S262144-cp8-selective"])
def test_forward_ring_blocks_are_the_measured_ones(case):
    """forward[1] inside the SDPA call, all-gather rotation: the gathered K/V, the send buffer, the
    fp32 merged output, the k and v copies, the output and its lse, block for block."""
    ctx = _prediction(case).ctx
    N, hq, hkv, d_qk, d_v, b, kv = _shapes(ctx)
    cp = int(ctx.cp)
    booked = Counter([cp * kv * b, kv * b, N * hq * d_v * 4, N * hkv * d_qk * b, N * hkv * d_v * b,
                      N * hq * d_v * b, N * hq * 4])
    items = {i.name: int(i.nbytes) for i in fsdp2_ring.forward_kernel(ctx, N, hq, hkv, d_qk, d_v, b)}
    assert items["ring attention: K/V contiguous copies"] == N * hkv * (d_qk + d_v) * b
    assert _blocks(_doc(case), "forward[1]", SDPA_SITE) == booked


def test_alltoall_holds_three_kv_buffers_at_step_one():
    """Under the all-to-all rotation, at step 1's exchange: the previous receive (which k and v view),
    the new send and receive, beside the step-0 copies, fp32 merged output, output and lse."""
    case = "fsdp2-dsv2-W8-S262144-cp8-alltoall"
    ctx = _prediction(case).ctx
    N, hq, hkv, d_qk, d_v, b, kv = _shapes(ctx)
    booked = Counter([kv * b] * 3 + [N * hq * d_v * 4, N * hkv * d_qk * b, N * hkv * d_v * b,
                                     N * hq * d_v * b, N * hq * 4])
    assert _blocks(_doc(case), "forward[1]", SDPA_SITE) == booked
    ring = {i.name: int(i.nbytes) for i in fsdp2_ring.forward_kernel(ctx, N, hq, hkv, d_qk, d_v, b)}
    cp_kv = int(fsdp2_layer._cp_kv(ctx, N, hkv, d_qk, d_v).nbytes)
    send = next(v for k, v in ring.items() if k.startswith("ring attention: K/V send buffer"))
    assert cp_kv + send == 3 * kv * b


def test_backward_node_blocks_are_the_measured_ones():
    """backward[1] inside ScaledDotProductEfficientAttentionBackward0 at the first dK/dV exchange:
    gathered K/V, two kv-sized b-byte blocks, the k and v copies, fp32 accumulators of q, k, v, the
    kernel's gradients of q, k, v and the fp32 exchange's send and receive."""
    case = "fsdp2-dsv2-W8-S393216-cp8"
    ctx = _prediction(case).ctx
    N, hq, hkv, d_qk, d_v, b, kv = _shapes(ctx)
    q, k, v = N * hq * d_qk, N * hkv * d_qk, N * hkv * d_v
    booked = Counter([int(ctx.cp) * kv * b, kv * b, kv * b, k * b, v * b, q * 4, k * 4, v * 4,
                      q * b, k * b, v * b, kv * 4, kv * 4])
    assert _blocks(_doc(case), "backward[1]", BACKWARD_NODE) == booked
    sub, _ = fsdp2_layer._substeps(ctx, "backward", "dense_mlp", False)
    ring = sum(int(i.nbytes) for i in sub[EXCHANGE] if i.name.startswith("ring attention backward"))
    assert ring == (kv + 2 * kv) * b + (q + kv) * 4 + 2 * kv * 4


def test_exchange_binds_the_dense_layer_backward_at_cp8():
    p = _prediction("fsdp2-dsv2-W8-S393216-cp8")
    sub, ref = fsdp2_layer._substeps(p.ctx, "backward", "dense_mlp", False)
    tot = {n: int(fsdp2_layer._total(v)) for n, v in sub.items()}
    assert max(tot, key=tot.get) == EXCHANGE and tot[EXCHANGE] > tot["attention"] > tot[ref]


def test_nothing_of_the_ring_without_context_parallelism():
    """cp = 1: no ring buffer; GQA keeps its o-projection moment as the attention's binding one."""
    pf = truncate(build_planfile(model="qwen3-30b-a3b", gpus=8, seq_len=32768, overrides={"stack": "fsdp2"}),
                  2).planfile
    ctx = predict(pf, "freed", timing=False).ctx
    N, hq, hkv, d_qk, d_v, b, _ = _shapes(ctx)
    ring = {i.name: int(i.nbytes) for i in fsdp2_ring.forward_kernel(ctx, N, hq, hkv, d_qk, d_v, b)}
    assert {k: v for k, v in ring.items() if v and "RoPE" not in k} == {}
    assert all(int(i.nbytes) == 0 for i in fsdp2_ring.backward_kernel(ctx, N, hq, hkv, d_qk, d_v, b))
    assert all(int(i.nbytes) == 0 for i in fsdp2_ring.backward_exchange(ctx, N, hkv, d_qk, d_v))
    sub, _ = fsdp2_layer._substeps(ctx, "forward", "moe", False)
    assert fsdp2_layer._total(sub["attention o-projection"]) > fsdp2_layer._total(sub["attention"])


def test_sac_projection_only_under_selective():
    for ac, want in (("full", 0), ("none", 0), ("selective", 1)):
        pf = truncate(build_planfile(model="deepseek-v2-lite", gpus=8, seq_len=262144,
                                     overrides={"stack": "fsdp2", "cp": 8, "ac": ac}), 2).planfile
        ctx = predict(pf, "freed", timing=False).ctx
        N, hq, hkv, d_qk, *_ = _shapes(ctx)
        assert fsdp2_ring.sac_projection_elems(ctx, N, hq, hkv, d_qk) == want * N * hq * d_qk
