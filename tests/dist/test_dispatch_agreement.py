"""Ranks that disagree, under gloo with 2 processes (one world for the module).

- A plan-shaping argument that differs between ranks (a knob, ``H``, a dtype, ``E``, the operator,
  which tensors require grad) makes every rank raise the same ``InvalidPlan`` naming it, with every
  rank's value: no hang, no gloo abort.
- A local argument error on one rank: that rank raises its own error, the other an ``InvalidPlan``
  naming the rank and the argument; no rank is left waiting.
- The group still works afterwards; a forward without backward leaves no stale plan for the next
  step's recompute (gradients equal a fresh operator's, bitwise); frozen experts keep ``.grad`` None
  and ``grad_dtype`` is honoured while LLEP moves experts between the ranks.
"""

from __future__ import annotations


import pytest
from gloo_world import serve, world_fixture
import torch

W = 2
WORKER_TIMEOUT_S = 120
"""Wall-clock limit for the world's workers (a hang fails here)."""
E, K, H, I, N = 6, 2, 8, 5, 9
KNOBS = dict(token_budget=3, min_tokens=1, alpha=1.0, lam=1.0)
"""Three chunks; LLEP spills the hot experts of ``_ids(hot=True)`` to the other rank."""
OPS = ("ep", "llep", "pipelined_llep", "source")
LLEP_FAMILY = OPS[1:]
CHUNKED = OPS[2:]
DIFFERS = {"num_experts": OPS, "hidden_size": OPS, "x_NH.dtype": OPS, "x_NH.requires_grad": OPS,
           "w_up_nHJ.requires_grad": OPS, "alpha": LLEP_FAMILY, "lam": LLEP_FAMILY,
           "min_tokens": LLEP_FAMILY, "max_imports": LLEP_FAMILY, "max_chunks": CHUNKED,
           "membership": CHUNKED, "weights_Nk.requires_grad": CHUNKED, "operator": ("llep",)}
"""The field that differs on rank 1, and the operators whose plan it shapes."""
ONE_RANK = {"ids_Nk": OPS, "weights_Nk": OPS}
"""A local argument error on rank 1 only: an expert id out of range, a row missing."""
CASES = [("differs", f, op) for f, ops in DIFFERS.items() for op in ops]
CASES += [("one_rank", a, op) for a, ops in ONE_RANK.items() for op in ops]


def _cls(op):
    from planner.runtime.expert_parallel import ExpertParallel
    from planner.runtime.llep import LLEP
    from planner.runtime.pipelined_llep import PipelinedLLEP
    from planner.runtime.pipelined_llep_source import PipelinedLLEPSource

    return {"ep": ExpertParallel, "llep": LLEP, "pipelined_llep": PipelinedLLEP, "source": PipelinedLLEPSource}[op]


def _ids(g, n, e, hot=False):
    if hot:
        return torch.tensor([[0, 1 + i % (e - 1)] for i in range(n)])
    return torch.stack([torch.randperm(e, generator=g)[:K] for _ in range(n)])


def _mismatch(kind, name, op, rank):
    """Run ``op`` with ``name`` different (or wrong) on rank 1; the raised error or ``None``."""
    from planner.runtime.expert_mlp import ExpertShard

    g = torch.Generator().manual_seed(10 + rank)
    other = rank == 1 and kind == "differs"
    e, h, dt, kw = E, H, torch.float32, dict(KNOBS)
    if other and name == "num_experts":
        e = 2 * E
    h = H + 2 if other and name == "hidden_size" else h
    dt = torch.float64 if other and name == "x_NH.dtype" else dt
    if other and name in ("alpha", "lam", "min_tokens", "max_imports", "max_chunks", "membership"):
        kw[name] = {"alpha": 4.0, "lam": 50.0, "min_tokens": 100, "max_imports": 0, "max_chunks": 2,
                    "membership": "contiguous"}[name]
    cls = _cls("ep" if other and name == "operator" else op)
    shard = ExpertShard(e // W, h, I, dtype=dt)
    shard.requires_grad_(not (other and name == "w_up_nHJ.requires_grad"))
    x = torch.randn(N, h, generator=g, dtype=dt).requires_grad_(not (other and name == "x_NH.requires_grad"))
    w = torch.rand(N, K, generator=g).requires_grad_(not (other and name == "weights_Nk.requires_grad"))
    ids = _ids(g, N, e)
    if rank == 1 and kind == "one_rank":
        if name == "ids_Nk":
            ids[0, 0] = E
        else:
            w = w[:-1]
    try:
        cls(shard, e, K, None, **kw)(x, ids, w).square().sum().backward()
    except ValueError as err:
        return type(err).__name__, str(err)
    return None


def _step(op, x0, ids, w):
    from torch.utils.checkpoint import checkpoint

    x = x0.clone().requires_grad_()
    out = checkpoint(lambda x_: op(x_, ids, w), x, use_reentrant=False, context_fn=op.plan_reuse)
    out.square().sum().backward()
    return x.grad


def _stale_plan(op, rank):
    """Step 2's gradients after a step 1 whose backward never ran, equal to a fresh operator's."""
    from torch.utils.checkpoint import checkpoint

    from planner.runtime.expert_mlp import ExpertShard

    g = torch.Generator().manual_seed(20 + rank)
    shard = ExpertShard(E // W, H, I, dtype=torch.float32)
    x0, ids, w = torch.randn(N, H, generator=g), _ids(g, N, E), torch.rand(N, K, generator=g)
    ref = (_step(_cls(op)(shard, E, K, None, **KNOBS), x0, ids, w), shard.w_up_nHJ.grad.clone())
    shard.zero_grad(set_to_none=True)
    o = _cls(op)(shard, E, K, None, **KNOBS)
    x1, ids1 = torch.randn(N + 3 * rank, H, generator=g).requires_grad_(), _ids(g, N + 3 * rank, E, hot=True)
    checkpoint(lambda x_: o(x_, ids1, torch.rand(N + 3 * rank, K)), x1, use_reentrant=False, context_fn=o.plan_reuse)
    got = (_step(o, x0, ids, w), shard.w_up_nHJ.grad)
    return all(torch.equal(a, b) for a, b in zip(got, ref))


def _frozen_and_grad_dtype(op, rank):
    """With LLEP moving experts: frozen experts get no ``.grad`` and leave ``x.grad`` unchanged;
    bf16 experts with ``grad_dtype = float32`` get fp32 gradients close to EP's."""
    from planner.runtime.expert_mlp import ExpertShard

    g = torch.Generator().manual_seed(30 + rank)
    x0, ids, w = torch.randn(N, H, generator=g), _ids(g, N, E, hot=True), torch.rand(N, K, generator=g)
    res, xg = {}, []
    for frozen in (False, True):
        torch.manual_seed(rank)
        shard = ExpertShard(E // W, H, I, dtype=torch.float32).requires_grad_(not frozen)
        o = _cls(op)(shard, E, K, None, **KNOBS)
        x = x0.clone().requires_grad_()
        o(x, ids, w).square().sum().backward()
        xg.append(x.grad)
        a = o.last_plan.assignment
        res["moves"] = bool(a.active and any(a.imports))
    res["frozen_grad_none"] = shard.w_up_nHJ.grad is None and shard.w_down_nIH.grad is None
    res["x_grad_equal"] = torch.equal(*xg)
    if hasattr(torch.Tensor, "grad_dtype"):
        grads = []
        for c in ("ep", op):
            torch.manual_seed(rank)
            shard = ExpertShard(E // W, H, I, dtype=torch.bfloat16)
            for p in shard.parameters():
                p.grad_dtype = torch.float32
            _cls(c)(shard, E, K, None, **KNOBS)(x0.bfloat16(), ids, w).float().square().sum().backward()
            grads.append(shard.w_up_nHJ.grad)
        res["grad_dtype"] = str(grads[1].dtype)
        res["rel_to_ep"] = float((grads[1] - grads[0]).norm() / grads[0].norm())
    return res


def _cases(rank: int, world: int, out: dict) -> None:
    for case in CASES:
        out[case] = _mismatch(*case, rank)
    out["after"] = _mismatch("none", "", "pipelined_llep", rank)
    for op in OPS:
        out[("stale", op)] = _stale_plan(op, rank)
    for op in LLEP_FAMILY:
        out[("frozen", op)] = _frozen_and_grad_dtype(op, rank)


def _worker(rank: int, world: int, store_path: str, queue) -> None:
    serve(rank, world, store_path, queue, _cases)


world = world_fixture(_worker, (W,), WORKER_TIMEOUT_S)


@pytest.mark.dist
@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "differs"], ids="|".join)
def test_a_differing_argument_raises_the_same_error_on_every_rank(world, case):
    _, ranks = world
    errs = [ranks[r][case] for r in range(W)]
    assert errs[0] is not None and errs[0] == errs[1], errs
    kind, msg = errs[0]
    assert kind == "InvalidPlan" and msg.startswith(f"{case[1]} ("), msg
    assert " on rank 0, " in msg and " on rank 1) must be the same on every rank" in msg and "; fix: " in msg


@pytest.mark.dist
@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "one_rank"], ids="|".join)
def test_a_local_error_on_one_rank_raises_on_every_rank(world, case):
    _, ranks = world
    bad, peer = ranks[1][case], ranks[0][case]
    assert bad is not None and bad[0] == "ValueError" and bad[1].startswith(case[1]), bad
    assert peer == ("InvalidPlan", f"{case[1]} (refused on rank 1) failed that rank's check (its error names the "
                                   f"value), so no rank of the group dispatches; fix: correct {case[1]} on rank 1")


@pytest.mark.dist
def test_the_group_still_works_after_the_errors(world):
    _, ranks = world
    assert all(ranks[r]["after"] is None for r in range(W))


@pytest.mark.dist
@pytest.mark.parametrize("op", OPS)
def test_a_forward_without_backward_leaves_no_stale_plan(world, op):
    _, ranks = world
    assert all(ranks[r][("stale", op)] for r in range(W))


@pytest.mark.dist
@pytest.mark.parametrize("op", LLEP_FAMILY)
def test_frozen_experts_and_grad_dtype_while_experts_move(world, op):
    _, ranks = world
    assert any(ranks[r][("frozen", op)]["moves"] for r in range(W)), "the case must move experts"
    for r in range(W):
        res = ranks[r][("frozen", op)]
        assert res["frozen_grad_none"] and res["x_grad_equal"], (r, res)
        if "grad_dtype" in res:
            assert res["grad_dtype"] == "torch.float32" and res["rel_to_ep"] < 2e-2, (r, res)
