"""The dispatch operators at their call, one process on the CPU (``group=None``; the multi-rank
counterparts are in ``tests/dist/test_dispatch_agreement.py``):

- a forward whose backward never runs leaves no plan for a later recompute (plan reuse is keyed by
  the checkpoint call): the next step's gradients equal a fresh operator's, bitwise;
- a shard on the meta device, a missing shard, a ``plan`` that is not one, and a shard built for
  another group size are refused with an ``InvalidPlan`` naming them;
- frozen expert weights keep ``.grad`` None (as EP and LLEP leave them) and the other gradients
  are unchanged; ``grad_dtype`` is honoured (fp32 accumulation of bf16 experts).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from planner.errors import InvalidPlan
from planner.runtime.expert_mlp import ExpertShard, mlp
from planner.runtime.expert_parallel import ExpertParallel
from planner.runtime.llep import LLEP
from planner.runtime.pipelined_llep import PipelinedLLEP
from planner.runtime.pipelined_llep_source import PipelinedLLEPSource

E, K, H, I = 4, 2, 6, 5
OPS = (ExpertParallel, LLEP, PipelinedLLEP, PipelinedLLEPSource)
KNOBS = dict(token_budget=4, min_tokens=1, lam=1.0)
"""Several chunks, and LLEP active on one rank (nothing moves, but the plan is LLEP's)."""


def _batch(n: int, seed: int, hot: int | None = None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, H, generator=g)
    ids = (torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]) if hot is None
           else torch.tensor([[hot, (hot + 1) % E]] * n))
    return x, ids, torch.rand(n, K, generator=g)


def _step(op, x, ids, w):
    x = x.clone().requires_grad_()
    out = checkpoint(lambda x_: op(x_, ids, w), x, use_reentrant=False, context_fn=op.plan_reuse)
    return out, x


@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("n_skipped", [5, 11])
def test_a_forward_without_backward_leaves_no_plan_for_the_next_recompute(cls, n_skipped):
    shard = ExpertShard(E, H, I, dtype=torch.float32)
    x2, ids2, w2 = _batch(11, 1)
    fresh = cls(shard, E, K, **KNOBS)
    out, x = _step(fresh, x2, ids2, w2)
    out.square().sum().backward()
    ref = (out.detach(), x.grad, shard.w_up_nHJ.grad.clone(), shard.w_down_nIH.grad.clone())
    shard.zero_grad(set_to_none=True)
    op = cls(shard, E, K, **KNOBS)
    _step(op, *_batch(n_skipped, 2, hot=0))            # its backward never runs
    out, x = _step(op, x2, ids2, w2)
    out.square().sum().backward()
    got = (out.detach(), x.grad, shard.w_up_nHJ.grad, shard.w_down_nIH.grad)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    assert op.plans_computed == 2                     # the recompute reused its own forward's plan
    assert (op.last_plan.counts_WE == fresh.last_plan.counts_WE).all()


@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_a_meta_shard_is_refused(cls):
    op = cls(ExpertShard(E, H, I, dtype=torch.float32, device="meta"), E, K)
    with pytest.raises(InvalidPlan, match=r"shard\.w_up_nHJ\.device \('meta'\) holds no data; fix: .*to_empty"):
        op(*_batch(7, 0))


def test_a_missing_shard_and_a_plan_that_is_not_one_are_named():
    with pytest.raises(InvalidPlan, match=r"^shard \(none given\) is needed to run the operator"):
        PipelinedLLEP(None, E, K)(*_batch(3, 0))
    op = PipelinedLLEP(ExpertShard(E, H, I, dtype=torch.float32), E, K)
    with pytest.raises(InvalidPlan, match=r"^plan \('x'\) must be a planner\.plans\.dispatch\.DispatchPlan"):
        op(*_batch(3, 0), plan="x")
    other = PipelinedLLEP(None, 2 * E, K).plan_from_counts([[1] * (2 * E)])
    with pytest.raises(InvalidPlan, match=r"^plan \('W=1, E=8, k=2'\) must be planned for .* E=4"):
        op(*_batch(3, 0), plan=other)


@pytest.fixture
def fake_two_ranks():
    """A fake process group of two ranks, set up after the operator is built (the test does)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    yield lambda: dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_an_operator_built_before_the_group_is_refused_at_its_call(fake_two_ranks, cls):
    op = cls(ExpertShard(E, H, I, dtype=torch.float32), E, K)          # W = 1: all four experts
    fake_two_ranks()
    with pytest.raises(InvalidPlan, match=r"^shard \('4 experts from expert 0'\) must hold num_experts / group "
                                          r"size = 4 / 2 = 2 experts from expert 2 \(rank 1\); the operator was "
                                          r"built for a group of 1; fix: build the operator"):
        op(*_batch(7, 0))


def _shard(dtype: torch.dtype, *, seed: int) -> ExpertShard:
    """All ``E`` experts, weights drawn from N(0, 1) under ``seed``."""
    shard = ExpertShard(E, H, I, dtype=dtype)
    torch.manual_seed(seed)
    torch.nn.init.normal_(shard.w_up_nHJ)
    torch.nn.init.normal_(shard.w_down_nIH)
    return shard


@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_frozen_experts_get_no_grad_and_the_rest_is_unchanged(cls):
    x0, ids, w0 = _batch(9, 3)
    grads = []
    for frozen in (False, True):
        shard = _shard(torch.float32, seed=0)
        shard.requires_grad_(not frozen)
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        cls(shard, E, K, token_budget=3)(x, ids, w).square().sum().backward()
        grads.append((x.grad, w.grad))
        if frozen:
            assert shard.w_up_nHJ.grad is None and shard.w_down_nIH.grad is None
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def _reference_grads(shard, x, ids, w):
    """float64 gradients of the experts for the loss ``Σ out²``."""
    up, down = (p.detach().double().requires_grad_() for p in (shard.w_up_nHJ, shard.w_down_nIH))
    out = torch.stack([sum(w[t, j].double() * mlp(x[t:t + 1].double(), up[ids[t, j]], down[ids[t, j]])[0]
                           for j in range(K)) for t in range(x.shape[0])])
    out.square().sum().backward()
    return up.grad, down.grad


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"), reason="this torch has no Tensor.grad_dtype")
@pytest.mark.parametrize("cls", (PipelinedLLEP, PipelinedLLEPSource), ids=lambda c: c.__name__)
def test_grad_dtype_is_honoured(cls):
    """bf16 experts with ``grad_dtype = float32``: the stacked gradients accumulate in fp32, at most
    as far from a float64 reference as EP's (DESIGN §7's norm-wise bound, EP in torch's place)."""
    from normwise import normwise_excess

    x0, ids, w0 = _batch(9, 4)
    got = []
    for c in (ExpertParallel, cls):
        shard = _shard(torch.bfloat16, seed=1)
        for p in shard.parameters():
            p.grad_dtype = torch.float32
        x = x0.bfloat16().requires_grad_()
        c(shard, E, K, token_budget=3)(x, ids, w0).float().square().sum().backward()
        got.append((shard.w_up_nHJ.grad, shard.w_down_nIH.grad))
    ref = _reference_grads(shard, x0.bfloat16(), ids, w0)
    for ours, ep, r in zip(got[1], got[0], ref):
        assert ours.dtype == torch.float32
        assert normwise_excess(ours, ep, r) is None, normwise_excess(ours, ep, r)
