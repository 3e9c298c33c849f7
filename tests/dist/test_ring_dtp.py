"""Exactness of Ring-DTP and vocab-parallel cross-entropy under gloo with 2, 3 and 4 processes.

One process group per world size for the whole module: each world spawns its workers once, every
worker runs every case and sends back, per case and quantity, the norm-wise error of the operator
and of torch's own reference (same dtype) against a float64 reference holding the full head.
DESIGN §7: error <= max(2·err_torch, 4·eps·‖ref‖).
"""

from __future__ import annotations

import zlib

import pytest
from gloo_world import serve, world_fixture
import torch

WORLDS = (2, 3, 4)
TORCH_ERR_FACTOR = 2.0
"""DESIGN §7: the operator may err up to this multiple of torch's own reference error."""
EPS_FACTOR = 4.0
"""DESIGN §7: ... or up to this many machine epsilons of the reference norm."""
WORKER_TIMEOUT_S = 240
"""Wall-clock limit for one world's workers."""

# name: V, H, tokens per rank (first W entries), mode, B_v, reduction, dtype, ignore pattern, ignore_index
RING_CASES = {
    "auto_act_mean": (1031, 24, (13, 5, 7, 9), None, 1, "mean", "fp32", "some", -100),
    "auto_weights_mean": (37, 24, (23, 17, 20, 19), None, 1, "mean", "fp32", "some", -100),
    "act_blocks_sum_zero_rank": (1031, 24, (13, 0, 7, 9), "activations", 3, "sum", "fp32", "some", -100),
    "weights_blocks_mean_zero_rank": (1031, 24, (13, 0, 7, 9), "weights", 4, "mean", "fp32", "some", -100),
    "act_rank0_ignored_mean": (1031, 24, (13, 5, 7, 9), "activations", 2, "mean", "fp32", "rank0", -100),
    "weights_rank0_ignored_sum": (1031, 24, (13, 5, 7, 9), "weights", 2, "sum", "fp32", "rank0", -100),
    "weights_rank0_ignored_mean": (1031, 24, (13, 5, 7, 9), "weights", 1, "mean", "fp32", "rank0", -100),
    "act_empty_blocks": (37, 16, (6, 11, 3, 8), "activations", 12, "mean", "fp32", "some", -100),
    "weights_empty_blocks": (37, 16, (6, 11, 3, 8), "weights", 12, "sum", "fp32", "some", -100),
    "act_ignore_index_5": (1031, 24, (13, 5, 7, 9), "activations", 2, "mean", "fp32", "some", 5),
    "act_bf16_mean": (1031, 32, (13, 5, 7, 9), "activations", 2, "mean", "bf16", "some", -100),
    "weights_bf16_sum": (1031, 32, (13, 5, 7, 9), "weights", 3, "sum", "bf16", "some", -100),
}
# name: V, H, tokens per rank, mode, B_v, weight range k (w in {-k..k}/4; x in {-3..3}): fp32, mean.
# Logits exact in fp32 (``_exact_logit_data``), up to |logit| ≈ 60 (k = 26) or ≈ 175 (k = 66). The
# backward once formed exp(logit - lse) with lse = m + log z rounded at |m|: several times the bound.
LARGE_LOGIT_CASES = {
    "logits_60_act": (29, 8, (5, 6, 7, 4), "activations", 2, 26),
    "logits_60_weights": (29, 8, (5, 6, 7, 4), "weights", 1, 26),
    "logits_175_act": (29, 8, (5, 6, 7, 4), "activations", 1, 66),
    "logits_175_weights": (29, 8, (5, 6, 7, 4), "weights", 2, 66),
}
# name: V, H, tokens (the same batch on every rank), reduction, dtype
VP_CASES = {
    "vp_mean": (1031, 24, 29, "mean", "fp32"),
    "vp_sum": (1031, 24, 17, "sum", "fp32"),
    "vp_bf16_mean": (1031, 32, 29, "mean", "bf16"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
QUANTITIES = ("loss", "gx", "gw")


def _data(seed: int, V: int, H: int, Ns, W: int, ignore: str, ig: int, dtype):
    """Every rank's batch and the full head, identical on all ranks (inputs rounded to dtype)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(V, H, generator=g, dtype=torch.float64) / H ** 0.5).to(dtype)
    xs, ts = [], []
    for r in range(W):
        n = Ns[r]
        xs.append(torch.randn(n, H, generator=g, dtype=torch.float64).mul_(2.0).to(dtype))
        t = torch.randint(0, V, (n,), generator=g)
        if ig >= 0:
            t[torch.rand(n, generator=g) < 0.3] = ig
        drop = torch.rand(n, generator=g) < 0.2
        t[drop] = ig
        if ignore == "rank0" and r == 0:
            t[:] = ig
        ts.append(t)
    return w, xs, ts


def _exact_logit_data(seed: int, V: int, H: int, Ns, W: int, k: int):
    """Large logits that fp32 holds exactly (small integers times quarters), so that whichever order a
    GEMM sums them in, the operator and torch see the same logits: the errors compared are the
    softmax's alone (a GEMM's rounding, an ulp of the logit, differs between kernels). 20% ignored."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-k, k + 1, (V, H), generator=g).float() / 4
    xs = [torch.randint(-3, 4, (n, H), generator=g).float() for n in Ns[:W]]
    ts = [torch.randint(0, V, (n,), generator=g).masked_fill_(torch.rand(n, generator=g) < 0.2, -100)
          for n in Ns[:W]]
    return w, xs, ts


def _reference(w, xs, ts, ig, reduction, dtype):
    """Per-rank loss and dx, and the summed dW, computed in ``dtype`` by torch's dense head."""
    from planner.runtime.vocab_baselines import dense_cross_entropy

    losses, gxs, gw = [], [], torch.zeros(w.shape, dtype=dtype)
    for x, t in zip(xs, ts):
        xx, ww = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
        loss = dense_cross_entropy(xx, t, ww, ignore_index=ig, reduction=reduction)
        loss.backward()
        losses.append(loss.detach())
        gxs.append(xx.grad)
        gw += ww.grad
    return losses, gxs, gw


def _errs(ours, torch_ref, ref64, eps):
    ours, torch_ref = ours.double(), torch_ref.double()
    if ref64.numel() == 1 and torch.isnan(ref64).all():
        return {"nan_ok": bool(torch.isnan(ours).all()), "err": 0.0, "err_torch": 0.0, "ref": 0.0, "eps": eps}
    return {"nan_ok": True, "err": float((ours - ref64).norm()), "err_torch": float((torch_ref - ref64).norm()),
            "ref": float(ref64.norm()), "eps": eps}


def _ring_case(name, W, rank, group):
    from planner.plans.ring import shard_bounds
    from planner.runtime.ring_dtp import ring_dtp_cross_entropy

    if name in LARGE_LOGIT_CASES:
        V, H, Ns, mode, B, k = LARGE_LOGIT_CASES[name]
        red, dt, ig = "mean", "fp32", -100
        w, xs, ts = _exact_logit_data(zlib.crc32(name.encode()), V, H, Ns, W, k)
    else:
        V, H, Ns, mode, B, red, dt, ignore, ig = RING_CASES[name]
        w, xs, ts = _data(zlib.crc32(name.encode()), V, H, Ns[:W], W, ignore, ig, DTYPES[dt])
    dtype = DTYPES[dt]
    lo, hi = shard_bounds(V, W)[rank]
    x = xs[rank].clone().requires_grad_()
    wr = w[lo:hi].clone().requires_grad_()
    loss = ring_dtp_cross_entropy(x, ts[rank], wr, group=group, vocab_start=lo, vocab_blocks=B,
                                  ignore_index=ig, reduction=red, mode=mode)
    loss.backward()
    l64, gx64, gw64 = _reference(w, xs, ts, ig, red, torch.float64)
    lt, gxt, gwt = _reference(w, xs, ts, ig, red, dtype)
    eps = torch.finfo(dtype).eps
    return {"loss": _errs(loss.detach(), lt[rank], l64[rank], eps),
            "gx": _errs(x.grad, gxt[rank], gx64[rank], eps),
            "gw": _errs(wr.grad, gwt[lo:hi], gw64[lo:hi], eps)}


def _vp_case(name, W, rank, group):
    from planner.plans.ring import shard_bounds
    from planner.runtime.vocab_baselines import vocab_parallel_cross_entropy

    V, H, N, red, dt = VP_CASES[name]
    dtype = DTYPES[dt]
    w, xs, ts = _data(zlib.crc32(name.encode()), V, H, (N,), 1, "some", -100, dtype)
    lo, hi = shard_bounds(V, W)[rank]
    x = xs[0].clone().requires_grad_()
    wr = w[lo:hi].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(x, ts[0], wr, group=group, vocab_start=lo, reduction=red)
    loss.backward()
    l64, gx64, gw64 = _reference(w, xs, ts, -100, red, torch.float64)
    lt, gxt, gwt = _reference(w, xs, ts, -100, red, dtype)
    eps = torch.finfo(dtype).eps
    return {"loss": _errs(loss.detach(), lt[0], l64[0], eps), "gx": _errs(x.grad, gxt[0], gx64[0], eps),
            "gw": _errs(wr.grad, gwt[lo:hi], gw64[lo:hi], eps)}


def _head_module_case(W, rank, group):
    """The module form (``RingDTPHead.load_full_weight``) on the auto branch with strips."""
    from planner.runtime.ring_dtp import RingDTPHead

    V, H, Ns = 1031, 24, (13, 5, 7, 9)[:W]
    w, xs, ts = _data(7, V, H, Ns, W, "some", -100, torch.float32)
    head = RingDTPHead(H, V, group=group, vocab_blocks=2)
    head.load_full_weight(w)
    x = xs[rank].clone().requires_grad_()
    loss = head(x, ts[rank])
    loss.backward()
    l64, gx64, gw64 = _reference(w, xs, ts, -100, "mean", torch.float64)
    lt, gxt, gwt = _reference(w, xs, ts, -100, "mean", torch.float32)
    lo, hi = head.vocab_start, head.vocab_start + head.weight.shape[0]
    eps = torch.finfo(torch.float32).eps
    return {"loss": _errs(loss.detach(), lt[rank], l64[rank], eps), "gx": _errs(x.grad, gxt[rank], gx64[rank], eps),
            "gw": _errs(head.weight.grad, gwt[lo:hi], gw64[lo:hi], eps)}


def _noncontig_weight_case(W, rank, group):
    """The weights branch with ``w_VpH`` a non-contiguous view (the shard of a head stored ``H × V``,
    as a tied embedding is): the shard travels, so it is sent contiguous. Once raised "input tensor
    has to be contiguous" in ``batch_isend_irecv`` at ``P > 1``. ``{"error": ...}`` if it raises."""
    from planner.plans.ring import shard_bounds
    from planner.runtime.ring_dtp import ring_dtp_cross_entropy

    V, H, Ns = 37, 8, (9, 4, 6, 7)[:W]
    w, xs, ts = _data(11, V, H, Ns, W, "some", -100, torch.float32)
    lo, hi = shard_bounds(V, W)[rank]
    w_HV = w.t().contiguous().requires_grad_()
    x = xs[rank].clone().requires_grad_()
    try:
        loss = ring_dtp_cross_entropy(x, ts[rank], w_HV.t()[lo:hi], group=group, vocab_start=lo, vocab_blocks=2,
                                      mode="weights")
        loss.backward()
    except RuntimeError as e:
        return {"error": str(e).splitlines()[0]}
    l64, gx64, gw64 = _reference(w, xs, ts, -100, "mean", torch.float64)
    lt, gxt, gwt = _reference(w, xs, ts, -100, "mean", torch.float32)
    eps = torch.finfo(torch.float32).eps
    return {"loss": _errs(loss.detach(), lt[rank], l64[rank], eps), "gx": _errs(x.grad, gxt[rank], gx64[rank], eps),
            "gw": _errs(w_HV.grad.t()[lo:hi], gwt[lo:hi], gw64[lo:hi], eps)}


def _bad_target_case(W, rank, group):
    """The last rank holds one target ``= V``: every rank must raise the same ValueError (the check
    rides on the ``N_max`` all-reduce), none may hang in the ring; the group stays usable."""
    from planner.plans.ring import shard_bounds
    from planner.runtime.ring_dtp import ring_dtp_cross_entropy

    V, H = 37, 8
    lo, hi = shard_bounds(V, W)[rank]
    x, w = torch.randn(5, H), torch.randn(hi - lo, H)
    t = torch.tensor([0, 1, 2, 3, V if rank == W - 1 else 4])
    try:
        ring_dtp_cross_entropy(x, t, w, group=group, vocab_start=lo)
    except ValueError as e:
        msg = str(e)
    else:
        msg = None
    t[4] = -100                                   # then a valid call on the same group still works
    ok = bool(torch.isfinite(ring_dtp_cross_entropy(x, t, w, group=group, vocab_start=lo)))
    return {"msg": msg, "ok_after": ok}


def _cases(rank: int, W: int, out: dict) -> None:
    for name in (*RING_CASES, *LARGE_LOGIT_CASES):
        out[name] = _ring_case(name, W, rank, None)
    for name in VP_CASES:
        out[name] = _vp_case(name, W, rank, None)
    out["head_module"] = _head_module_case(W, rank, None)
    out["noncontig_weight"] = _noncontig_weight_case(W, rank, None)
    out["bad_target"] = _bad_target_case(W, rank, None)


def _worker(rank: int, W: int, store_path: str, queue) -> None:
    serve(rank, W, store_path, queue, _cases)


world = world_fixture(_worker, WORLDS, WORKER_TIMEOUT_S)
"""Every case on every rank of one gloo world (spawned once per module and world size)."""


def _check(world, case: str) -> None:
    W, ranks = world
    bad = []
    for rank, out in ranks.items():
        for q in QUANTITIES:
            e = out[case][q]
            assert e["nan_ok"], f"{case} rank {rank} {q}: reference is NaN but the operator is not"
            bound = max(TORCH_ERR_FACTOR * e["err_torch"], EPS_FACTOR * e["eps"] * e["ref"])
            if not e["err"] <= bound:
                bad.append(f"rank {rank} {q}: err {e['err']:.3e} > bound {bound:.3e} "
                           f"(err_torch {e['err_torch']:.3e}, ‖ref‖ {e['ref']:.3e})")
    assert not bad, f"W={W} {case}: " + "; ".join(bad)


@pytest.mark.dist
@pytest.mark.parametrize("case", list(RING_CASES))
def test_ring_dtp_matches_float64_reference(world, case):
    _check(world, case)


@pytest.mark.dist
@pytest.mark.parametrize("case", list(LARGE_LOGIT_CASES))
def test_ring_dtp_gradients_stay_within_the_bound_at_large_logits(world, case):
    _check(world, case)
    assert all(out[case]["gx"]["err_torch"] > 0 for out in world[1].values()), "torch's error is 0"


@pytest.mark.parametrize("case", list(LARGE_LOGIT_CASES))
def test_ring_dtp_gradients_stay_within_the_bound_at_large_logits_on_one_rank(case):
    """P = 1 (``group=None``): the error grew with |logit| even without a ring."""
    _check((1, {0: {case: _ring_case(case, 1, 0, None)}}), case)


@pytest.mark.dist
@pytest.mark.parametrize("case", list(VP_CASES))
def test_vocab_parallel_matches_float64_reference(world, case):
    _check(world, case)


@pytest.mark.dist
def test_ring_dtp_head_module_matches_float64_reference(world):
    _check(world, "head_module")


@pytest.mark.dist
def test_weights_branch_takes_a_non_contiguous_weight_shard(world):
    W, ranks = world
    errors = {r: out["noncontig_weight"]["error"] for r, out in ranks.items() if "error" in out["noncontig_weight"]}
    assert not errors, f"W={W}: {errors}"
    _check(world, "noncontig_weight")


@pytest.mark.dist
def test_out_of_range_target_on_one_rank_raises_on_every_rank(world):
    W, ranks = world
    for rank, out in ranks.items():
        msg = out["bad_target"]["msg"]
        assert msg is not None and "has target 37" in msg, f"W={W} rank {rank}: {msg!r}"
        assert out["bad_target"]["ok_after"], f"W={W} rank {rank}: the group broke after the error"


@pytest.mark.parametrize("ig", [-100, 3])
def test_out_of_range_targets_are_rejected_on_one_rank(ig):
    from planner.runtime.ring_dtp import ring_dtp_cross_entropy

    x, w = torch.randn(5, 8), torch.randn(11, 8)
    for bad in (11, -1, -7):
        with pytest.raises(ValueError, match=rf"must lie in \[0, 11\) or equal ignore_index \({ig}\): "
                                             rf"a rank of the group has target {bad}"):
            ring_dtp_cross_entropy(x, torch.tensor([0, ig, 2, 3, bad]), w, group=None, vocab_start=0,
                                   ignore_index=ig)
    loss = ring_dtp_cross_entropy(x, torch.tensor([0, ig, 10, 3, ig]), w, group=None, vocab_start=0,
                                  ignore_index=ig)
    assert torch.isfinite(loss)


def test_wrong_shard_start_is_rejected_with_the_plan_shard():
    from planner.errors import InvalidPlan
    from planner.runtime.ring_dtp import ring_dtp_cross_entropy

    x, t, w = torch.randn(4, 8), torch.zeros(4, dtype=torch.long), torch.randn(10, 8)
    with pytest.raises(InvalidPlan, match=r"vocab_start \(5\) with 10 rows must give the shard \(0, 15\)"):
        ring_dtp_cross_entropy(x, t, w, group=None, vocab_start=5)
    with pytest.raises(InvalidPlan, match=r"reduction \('none'\) must be 'mean' or 'sum'"):
        ring_dtp_cross_entropy(x, t, w, group=None, vocab_start=0, reduction="none")
    with pytest.raises(InvalidPlan, match=r"dtype .* must be the same, fp32 or bf16"):
        ring_dtp_cross_entropy(x.double(), t, w.double(), group=None, vocab_start=0)
