"""Class 6 of issue 10: the operators' Python API refuses malformed arguments, generated over each
kind (shapes, counts, ranges, NaN, torch's AdamW hyper-parameters), with an exception rather than a
wrong result. Runs in one process on the CPU (``group=None``)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from planner.runtime.cpu_offload_adamw import CPUOffloadAdamW
from planner.runtime.expert_mlp import ExpertShard
from planner.runtime.llep import LLEP
from planner.runtime.offload_adamw import OffloadStreamAdamW
from planner.runtime.pipelined_llep import PipelinedLLEP
from planner.runtime.ring_dtp import ring_dtp_cross_entropy
from planner.runtime.sco import SCO

SEED = 6
E, K, H, I, N = 4, 2, 6, 5, 7


def _inputs(rng):
    g = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    return (torch.randn(N, H, generator=g), torch.randint(0, E, (N, K), generator=g), torch.rand(N, K, generator=g))


@pytest.mark.parametrize("case", range(24))
def test_dispatch_refuses_malformed_inputs(case):
    rng = random.Random(SEED * 100 + case)
    cls = rng.choice([LLEP, PipelinedLLEP])
    op = cls(ExpertShard(E, H, I, dtype=torch.float32), E, K, None, min_tokens=1)
    x, ids, w = _inputs(rng)
    kind = case % 6
    if kind == 0:
        ids = ids[:-rng.randint(1, 3)]                     # a row too few
    elif kind == 1:
        w = torch.rand(N, K + rng.randint(1, 2))           # too wide
    elif kind == 2:
        ids = torch.randint(0, E, (N, K + 1))              # k disagrees with top_k
    elif kind == 3:
        ids = ids.clone()
        ids[rng.randrange(N), rng.randrange(K)] = rng.choice([-1, E, E + 5, -(2 ** 63)])
    elif kind == 4:
        ids = ids.float()
    else:
        x = torch.randn(N, H + 1)
    with pytest.raises(ValueError):
        op(x, ids, w)


@pytest.mark.parametrize("case", range(16))
def test_dispatch_refuses_bad_knobs(case):
    rng = random.Random(SEED * 200 + case)
    kw = dict(min_tokens=1)
    num_experts, top_k = E, K
    kind = case % 8
    if kind == 0:
        kw["token_budget"] = rng.choice([0, -1, -4096])
    elif kind == 1:
        kw["max_chunks"] = rng.choice([0, -3])
    elif kind == 2:
        kw["block_rows"] = rng.choice([0, -1])
    elif kind == 3:
        kw["alpha"] = rng.choice([math.nan, 0.5])
    elif kind == 4:
        kw["lam"] = rng.choice([math.nan, math.inf, 0.9])
    elif kind == 5:
        num_experts = rng.choice([E * 2, E + 1, 3])          # disagrees with the shard
    elif kind == 6:
        top_k = rng.choice([0, E + 1])
    else:
        kw["min_tokens"] = rng.choice([0, -1])
    with pytest.raises(ValueError):
        PipelinedLLEP(ExpertShard(E, H, I, dtype=torch.float32), num_experts, top_k, None, **kw)


@pytest.mark.parametrize("bad", [1.5, 2.0, -1, 11, -(2 ** 63), 2 ** 63 - 1])
def test_ring_dtp_refuses_float_and_out_of_range_targets(bad):
    x, w = torch.randn(5, 8), torch.randn(11, 8)
    dtype = torch.float32 if isinstance(bad, float) else torch.long
    t = torch.tensor([0, 1, 2, 3, bad], dtype=dtype)
    with pytest.raises(ValueError):
        ring_dtp_cross_entropy(x, t, w, group=None, vocab_start=0)


@pytest.mark.parametrize("n", [0, -1, -48, 2.5, True])
def test_sco_refuses_bad_boundary_counts(n):
    with pytest.raises(ValueError):
        SCO(num_boundaries=n, boundary_shape=(3, 4), dtype=torch.float32, device="cpu",
            host_budget_bytes=1 << 20, register=False)


HYPER = [dict(lr=-1e-3), dict(lr=math.nan), dict(betas=(1.0, 0.999)), dict(betas=(0.9, -0.1)),
         dict(betas=(math.nan, 0.9)), dict(eps=-1e-8), dict(eps=math.nan), dict(weight_decay=-0.1),
         dict(weight_decay=math.nan)]


@pytest.mark.parametrize("cls", [OffloadStreamAdamW, CPUOffloadAdamW])
@pytest.mark.parametrize("hyper", HYPER, ids=[next(iter(h)) + str(i) for i, h in enumerate(HYPER)])
def test_offloaded_adamw_refuses_what_torch_refuses(cls, hyper):
    p = torch.nn.Parameter(torch.zeros(32))
    with pytest.raises(ValueError) as ours:
        cls([p], register=False, **hyper)
    with pytest.raises(ValueError) as theirs:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(32))], **hyper)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError):                          # a group's own values are checked too
        cls([{"params": [p], **hyper}], register=False)


@pytest.mark.parametrize("cls", [OffloadStreamAdamW, CPUOffloadAdamW])
def test_offloaded_adamw_refuses_duplicate_parameters(cls):
    a, b = torch.nn.Parameter(torch.zeros(32)), torch.nn.Parameter(torch.zeros(16))
    with pytest.raises(ValueError, match="duplicate parameters"):
        cls([a, b, a], register=False)
    with pytest.raises(ValueError, match="more than one parameter group"):
        cls([{"params": [a]}, {"params": [a, b]}], register=False)
    if cls is OffloadStreamAdamW:
        opt = cls([a], register=False, bucket_params=64)
        with pytest.raises(ValueError, match="more than one parameter group"):
            opt.add_param_group({"params": [a]})
        with pytest.raises(ValueError, match="Invalid learning rate"):
            opt.add_param_group({"params": [b], "lr": -1.0})
        opt.close()
