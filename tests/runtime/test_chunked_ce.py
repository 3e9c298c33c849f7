"""Exactness of the chunked linear cross-entropy head (DESIGN §7 norm-wise bound).

Each case compares the operator and torch's own ``cross_entropy(x @ w.T, t)`` in the same dtype
against a float64 reference: error <= max(2·err_torch, 4·eps·‖ref‖).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from planner.errors import InvalidPlan
from planner.runtime.chunked_ce import chunked_linear_cross_entropy

TORCH_ERR_FACTOR = 2.0
"""DESIGN §7: the operator may err up to this multiple of torch's own reference error."""
EPS_FACTOR = 4.0
"""DESIGN §7: ... or up to this many machine epsilons of the reference norm."""

# name: N, H, V, chunk, dtype, reduction, ignored positions
CASES = {
    "fp32_uneven_chunks": (37, 16, 101, 8, torch.float32, "mean", (3, 20)),
    "fp32_one_chunk": (13, 24, 257, 64, torch.float32, "sum", ()),
    "fp32_chunk_1": (9, 8, 31, 1, torch.float32, "mean", (0,)),
    "bf16_mean": (41, 32, 509, 16, torch.bfloat16, "mean", (5,)),
}


def _grads(fn, x, w, t):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    loss = fn(x, w, t)
    loss.backward()
    return {"loss": loss.detach().double().reshape(1), "gx": x.grad.double(), "gw": w.grad.double()}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name):
    N, H, V, C, dtype, red, ignored = CASES[name]
    g = torch.Generator().manual_seed(7)
    x64 = torch.randn(N, H, generator=g, dtype=torch.float64) * 2
    w64 = torch.randn(V, H, generator=g, dtype=torch.float64) / H ** 0.5
    t = torch.randint(0, V, (N,), generator=g)
    for i in ignored:
        t[i] = -100
    x, w = x64.to(dtype), w64.to(dtype)
    ref = _grads(lambda a, b, c: F.cross_entropy(a @ b.t(), c, reduction=red), x.double(), w.double(), t)
    tor = _grads(lambda a, b, c: F.cross_entropy((a @ b.t()).float(), c, reduction=red), x, w, t)
    op = _grads(lambda a, b, c: chunked_linear_cross_entropy(a, c, b, chunk_tokens=C, reduction=red), x, w, t)
    eps = torch.finfo(dtype).eps
    for q in ("loss", "gx", "gw"):
        err_torch = (tor[q] - ref[q]).norm().item()
        err = (op[q] - ref[q]).norm().item()
        bound = max(TORCH_ERR_FACTOR * err_torch, EPS_FACTOR * eps * ref[q].norm().item())
        assert err <= bound, (name, q, err, bound)


def test_bad_arguments_refused():
    x, w, t = torch.randn(4, 8), torch.randn(5, 8), torch.zeros(4, dtype=torch.long)
    with pytest.raises(InvalidPlan, match="chunk_tokens"):
        chunked_linear_cross_entropy(x, t, w, chunk_tokens=0)
    with pytest.raises(InvalidPlan, match="x_NH"):
        chunked_linear_cross_entropy(x, t, torch.randn(5, 7))
    with pytest.raises(InvalidPlan, match="targets_N"):
        chunked_linear_cross_entropy(x, t[:3], w)


def test_baseline_builder_refuses_bad_layouts():
    from planner.runtime.fsdp2 import build_fsdp2_step
    from planner.runtime.fsdp2_layout import Layout
    from planner.schema import ModelSpec

    spec = ModelSpec(name="t", num_layers=1, hidden_size=16, vocab_size=32, num_heads=4, num_kv_heads=2,
                     head_dim=4, dense_ffn=8, dense_layers=(0,))
    with pytest.raises(InvalidPlan, match="dp_replicate·dp_shard·cp·tp"):
        Layout(world_size=4, dp_shard=3)
    with pytest.raises(InvalidPlan, match="plan.baseline.tp"):
        build_fsdp2_step(spec, Layout(world_size=4, tp=4), 0)
    with pytest.raises(InvalidPlan, match="plan.baseline.head"):
        build_fsdp2_step(spec, Layout(world_size=2, tp=2), 0, head="chunked")
    with pytest.raises(InvalidPlan, match="plan.baseline.ac"):
        build_fsdp2_step(spec, Layout(world_size=1), 0, ac="partial")
