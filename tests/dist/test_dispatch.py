"""Exactness of standard EP, LLEP and PipelinedLLEP under gloo with 2, 3 and 4 processes.

One process group per world size for the whole module: each world spawns its workers once; every
worker runs every case and sends back, per case and quantity, the norm-wise error of the operator
and of torch's own fp32 reference against a float64 reference MoE that holds every expert locally.
DESIGN §7: error <= max(2·err_torch, 4·eps·‖ref‖). Quantities: the output, the input gradient, the
router-weight gradient (this rank's tokens) and the expert-weight gradients (this rank's shard).
K1_CASES compare PipelinedLLEP at K = 1, both residue variants, with LLEP, LLEP standing in for
torch's reference: norm-wise, not bitwise, as they run different GEMM call sites whose blocking may
differ between CPUs. The backward is driven by a dense random ``N×H`` upstream gradient.
"""

from __future__ import annotations

import traceback
import zlib

import pytest
from gloo_world import world_fixture
import torch

WORLDS = (2, 3, 4)
TORCH_ERR_FACTOR = 2.0
"""DESIGN §7: the operator may err up to this multiple of torch's own fp32 reference error."""
EPS_FACTOR = 4.0
"""DESIGN §7: ... or up to this many machine epsilons of the reference norm."""
WORKER_TIMEOUT_S = 300
"""Wall-clock limit for one world's workers."""
E, H, I, K_TOP = 24, 12, 10, 3
"""Experts (divisible by 2, 3, 4), hidden, expert FFN width, top-k of every case."""
KNOBS = dict(token_budget=7, max_chunks=5, alpha=1.0, min_tokens=3, lam=1.3, max_imports=2)
"""Small ``m`` and ``n_import_max`` so that LLEP spills and the import limit binds."""
TOKENS = {"uneven": (37, 23, 29, 31), "zero_rank": (26, 0, 33, 19), "tiny": (5, 3, 1, 4)}
"""Tokens per rank (first W entries). 37 tokens at c=7, K_max=5: K=5 does not divide N."""
PROFILES = ("balanced", "30/16", "80/16", "95/16", "one_expert", "one_rank", "router")
"""``router``: the router's own top-k choice; the others fix the ids (weights still from it)."""
OPS = ("ep", "llep", "pipelined_llep", "pipelined_llep_contiguous", "pipelined_llep_source")
"""``pipelined_llep``: the destination-residue variant; ``pipelined_llep_source``: source-side state."""
CHUNKED = ("pipelined_llep", "pipelined_llep_source")
CASES = {f"{op}|{prof}|{tok}": (op, prof, tok) for op in OPS for prof in PROFILES for tok in TOKENS
         if tok != "tiny" or op in CHUNKED}
CASES.update({f"{op}|{p}|uneven|nested{'_reuse' if r else ''}": (op, p, "uneven", r)
              for op in CHUNKED for p in ("80/16", "one_rank") for r in (False, True)})
CASES.update({f"pipelined_llep_source|{p}|zero_rank|nested_reuse": ("pipelined_llep_source", p, "zero_rank", True)
              for p in ("balanced", "one_expert")})
K1_CASES = {f"{p}|{t}": (p, t) for p in ("balanced", "80/16", "one_expert", "router")
           for t in ("uneven", "zero_rank")}
QUANTITIES = ("out", "gx", "g_router", "g_up", "g_down")


def _inputs(seed: int, W: int, tokens, dtype):
    """Every rank's tokens, the router weight and all experts' weights (identical on all ranks)."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, H, generator=g, dtype=torch.float64).to(dtype) for n in tokens[:W]]
    wr = (torch.randn(E, H, generator=g, dtype=torch.float64) / H ** 0.5).to(dtype)
    up = (torch.randn(E, H, 2 * I, generator=g, dtype=torch.float64) / H ** 0.5).to(dtype)
    down = (torch.randn(E, I, H, generator=g, dtype=torch.float64) / I ** 0.5).to(dtype)
    gys = [torch.randn(n, H, generator=g, dtype=torch.float64).to(dtype) for n in tokens[:W]]
    return xs, wr, up, down, gys


def _ids(profile, n, W, router, x):
    from planner.runtime.routing import profile_ids

    if profile == "router":
        return router(x)[0].detach()
    return profile_ids(profile, n, E, K_TOP, W)


def _reference(xs, wr, up, down, gys, profile, W, dtype):
    """Single-process MoE holding every expert: per-rank out, gx, router grad; summed expert grads."""
    from planner.runtime.expert_mlp import mlp
    from planner.runtime.routing import TopKRouter

    w_up = up.to(dtype).requires_grad_()
    w_down = down.to(dtype).requires_grad_()
    outs, xs_g, routers, loss = [], [], [], 0.0
    for x0, gy in zip(xs, gys):
        router = TopKRouter(H, E, K_TOP, dtype=dtype)
        with torch.no_grad():
            router.w_EH.copy_(wr)
        x = x0.to(dtype).requires_grad_()
        ids = _ids(profile, x.shape[0], W, router, x)
        _, w = router(x, ids)
        out = torch.zeros_like(x)
        for e in range(E):
            n_idx, j_idx = (ids == e).nonzero(as_tuple=True)
            if len(n_idx):
                o = mlp(x[n_idx], w_up[e], w_down[e])
                out = out.index_add(0, n_idx, o * w[n_idx, j_idx][:, None])
        loss = loss + (out * gy.to(dtype)).sum()
        outs.append(out.detach())
        xs_g.append(x)
        routers.append(router)
    loss.backward()
    gxs = [x.grad if x.grad is not None else torch.zeros_like(x) for x in xs_g]
    grs = [r.w_EH.grad if r.w_EH.grad is not None else torch.zeros_like(r.w_EH) for r in routers]
    return outs, gxs, grs, w_up.grad, w_down.grad


def _run_op(op_name, profile, rank, W, xs, wr, up, down, gys, nested=None, group=None):
    """Run one operator on this rank; returns (out, gx, g_router, g_up, g_down, op)."""
    from torch.utils.checkpoint import checkpoint

    from planner.runtime.expert_mlp import ExpertShard
    from planner.runtime.expert_parallel import ExpertParallel
    from planner.runtime.llep import LLEP
    from planner.runtime.pipelined_llep import PipelinedLLEP
    from planner.runtime.pipelined_llep_source import PipelinedLLEPSource
    from planner.runtime.routing import TopKRouter

    dtype = xs[0].dtype
    n = E // W
    shard = ExpertShard(n, H, I, dtype=dtype)
    router = TopKRouter(H, E, K_TOP, dtype=dtype)
    with torch.no_grad():
        shard.w_up_nHJ.copy_(up[rank * n:(rank + 1) * n])
        shard.w_down_nIH.copy_(down[rank * n:(rank + 1) * n])
        router.w_EH.copy_(wr)
    knobs = dict(KNOBS)
    cls = {"ep": ExpertParallel, "llep": LLEP}.get(op_name, PipelinedLLEP)
    if op_name.startswith("pipelined_llep_source"):
        cls = PipelinedLLEPSource
    if op_name == "pipelined_llep_contiguous":
        knobs["membership"] = "contiguous"
    if op_name in ("pipelined_llep_k1", "pipelined_llep_source_k1"):   # one chunk, unsplit experts
        knobs.update(token_budget=10**6, block_rows=10**6)
    op = cls(shard, E, K_TOP, group, **knobs)
    x = xs[rank].clone().requires_grad_()
    ids = _ids(profile, x.shape[0], W, router, x)

    def layer(x_):
        _, w = router(x_, ids)
        return op(x_, ids, w)

    from planner.runtime import exchange

    calls = []
    orig = exchange.ImportWeights.backward
    exchange.ImportWeights.backward = staticmethod(lambda ctx, *g: calls.append(1) or orig(ctx, *g))
    try:
        if nested is None:
            out = layer(x)
        else:
            kw = {"context_fn": op.plan_reuse} if nested else {}
            out = checkpoint(layer, x, use_reentrant=False, **kw)
        (out * gys[rank]).sum().backward()
    finally:
        exchange.ImportWeights.backward = orig
    a = op.last_plan.assignment
    op.transfer_backward_calls = len(calls)
    op.transfers = bool(a.active and (a.imports[rank] or a.exports[rank]))
    op.expert_grads_exist = shard.w_up_nHJ.grad is not None and shard.w_down_nIH.grad is not None
    grads = [t.grad if t.grad is not None else torch.zeros_like(t)
             for t in (x, router.w_EH, shard.w_up_nHJ, shard.w_down_nIH)]
    return (out.detach(), *grads, op)


def _errs(ours, torch_ref, ref64, eps):
    ours, torch_ref = ours.double(), torch_ref.double()
    return {"err": float((ours - ref64).norm()), "err_torch": float((torch_ref - ref64).norm()),
            "ref": float(ref64.norm()), "eps": eps}


def _case(name, W, rank):
    op_name, profile, tok, *rest = CASES[name]
    # the source-side variant gets its destination counterpart's inputs (same seed)
    seed = zlib.crc32(name.replace("pipelined_llep_source", "pipelined_llep").encode())
    xs, wr, up, down, gys = _inputs(seed, W, TOKENS[tok], torch.float32)
    got = _run_op(op_name, profile, rank, W, xs, wr, up, down, gys, nested=rest[0] if rest else None)
    r64 = _reference(xs, wr, up, down, gys, profile, W, torch.float64)
    r32 = _reference(xs, wr, up, down, gys, profile, W, torch.float32)
    n = E // W
    sl = slice(rank * n, (rank + 1) * n)
    eps = torch.finfo(torch.float32).eps
    pick = lambda ref, i: ref[i][rank] if i < 3 else ref[i][sl]  # noqa: E731 - per rank / shard
    res = {q: _errs(got[i], pick(r32, i), pick(r64, i), eps) for i, q in enumerate(QUANTITIES)}
    op = got[5]
    res["plans_computed"] = op.plans_computed
    res["transfer_backward_calls"] = op.transfer_backward_calls
    res["transfers"] = op.transfers
    res["expert_grads_exist"] = op.expert_grads_exist
    return res


def _k1_vs_llep(name, W, rank):
    """PipelinedLLEP with one chunk against LLEP, both against the float64 reference, LLEP in the
    place of torch's fp32 reference: not bitwise, as the two run different GEMM call sites
    (ExpertChunk's gathered blocks vs GroupedMLP's slot slices) whose blocking may differ by CPU."""
    profile, tok = K1_CASES[name]
    xs, wr, up, down, gys = _inputs(zlib.crc32(name.encode()), W, TOKENS[tok], torch.float32)
    a = _run_op("llep", profile, rank, W, xs, wr, up, down, gys)
    r64 = _reference(xs, wr, up, down, gys, profile, W, torch.float64)
    n = E // W
    sl = slice(rank * n, (rank + 1) * n)
    pick = lambda ref, i: ref[i][rank] if i < 3 else ref[i][sl]  # noqa: E731 - per rank / shard
    eps = torch.finfo(torch.float32).eps
    out = {}
    for variant in ("pipelined_llep_k1", "pipelined_llep_source_k1"):
        b = _run_op(variant, profile, rank, W, xs, wr, up, down, gys)
        assert b[5].plans_computed == 1
        out.update({f"{variant}:{q}": _errs(b[i], a[i], pick(r64, i), eps) for i, q in enumerate(QUANTITIES)})
    return out


def _worker(rank: int, W: int, store_path: str, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, W), rank=rank, world_size=W)
    out = {}
    try:
        for name in CASES:
            out[name] = _case(name, W, rank)
        for name in K1_CASES:
            out["k1|" + name] = _k1_vs_llep(name, W, rank)
        queue.put((rank, out, None))
    except Exception:  # noqa: BLE001 - report the traceback to the parent
        queue.put((rank, out, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


world = world_fixture(_worker, WORLDS, WORKER_TIMEOUT_S)
"""Every case on every rank of one gloo world (spawned once per module and world size)."""


@pytest.mark.dist
@pytest.mark.parametrize("case", list(CASES))
def test_dispatch_matches_float64_reference(world, case):
    W, ranks = world
    bad = []
    for rank, out in ranks.items():
        for q in QUANTITIES:
            e = out[case][q]
            bound = max(TORCH_ERR_FACTOR * e["err_torch"], EPS_FACTOR * e["eps"] * e["ref"])
            if not e["err"] <= bound:
                bad.append(f"rank {rank} {q}: err {e['err']:.3e} > bound {bound:.3e} "
                           f"(err_torch {e['err_torch']:.3e}, ‖ref‖ {e['ref']:.3e})")
    assert not bad, f"W={W} {case}: " + "; ".join(bad)
    for rank, out in ranks.items():         # the weight transfer's backward fires once per layer
        assert out[case]["transfer_backward_calls"] == int(out[case]["transfers"]), (rank, out[case])
        # every rank's expert grads exist (zeros without routes), so AdamW treats replicas alike
        assert out[case]["expert_grads_exist"], f"W={W} rank {rank} {case}: expert .grad is None"
    if case.endswith("nested_reuse"):
        assert all(out[case]["plans_computed"] == 1 for out in ranks.values()), "plan not reused"
    elif case.endswith("nested"):
        assert all(out[case]["plans_computed"] == 2 for out in ranks.values())


@pytest.mark.dist
@pytest.mark.parametrize("case", list(K1_CASES))
def test_pipelined_llep_k1_matches_llep(world, case):
    W, ranks = world
    for rank, out in ranks.items():
        for q, e in out["k1|" + case].items():
            bound = max(TORCH_ERR_FACTOR * e["err_torch"], EPS_FACTOR * e["eps"] * e["ref"])
            assert e["err"] <= bound, (f"W={W} rank {rank} {case} {q}: K=1 err {e['err']:.3e} > bound "
                                       f"{bound:.3e} (LLEP's err {e['err_torch']:.3e})")
