"""The dense FFN's backward moment (``planner.budget.ffn.dense_backward_moment``) against torch's own
autograd of the runtime's ``GatedMLP``, and the expected dispatch size of one measured rank.

The autograd check counts every storage alive during ``backward`` (a dispatch mode over real CPU
tensors, float32): its peak, less the weights, the input, one ``N·H`` slot (the incoming
gradient, which the budget books in ``boundaries`` and which up's input gradient replaces) and what
the test itself holds, must equal the formula's activations plus the weight gradients it says are
made, exactly, on shapes where each moment binds.
"""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from planner.api import build_planfile  # noqa: E402
from planner.budget import ffn  # noqa: E402
from planner.budget.build import make_context  # noqa: E402
from planner.runtime.model_layers import GatedMLP  # noqa: E402
from planner.runtime.validate_plan import expert_group_rank, predict, truncate  # noqa: E402


class _Live(TorchDispatchMode):
    """Bytes of the storages created under the mode that are still alive, and their peak."""

    def __init__(self):
        super().__init__()
        self.bytes, self.peak, self._seen = 0, 0, set()

    def _track(self, t):
        s = t.untyped_storage()
        key = s.data_ptr()
        if key in self._seen or not s.nbytes():
            return
        self._seen.add(key)
        self.bytes += s.nbytes()
        weakref.finalize(s, self._free, key, s.nbytes())

    def _free(self, key, n):
        self._seen.discard(key)
        self.bytes -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        self.peak = max(self.peak, self.bytes)
        return out


class _C:   # the fields dense_backward_moment reads
    def __init__(self, N, H, I):
        self.tokens_per_rank, self.hidden_size, self.dense_ffn = N, H, I


@pytest.mark.parametrize("N,H,I,late", [(257, 16, 33, False), (3, 61, 130, True), (37, 96, 40, True),
                                         (64, 64, 64, False)])
def test_moment_is_autograds_peak(N, H, I, late):
    act, missing = ffn.dense_backward_moment(_C(N, H, I))
    assert (missing == 0) == late
    torch.manual_seed(0)
    mlp = GatedMLP(H, I, dtype=torch.float32)
    x = torch.randn(N, H, requires_grad=True)
    mode = _Live()
    for t in (*mlp.parameters(), x):   # already there: the weights (their views are not new) and the input
        mode._track(t)
    base = mode.bytes
    with mode:
        y = mlp(x)
    mode.peak = 0
    with mode:
        torch.autograd.backward(y, grad_tensors=torch.ones(N, H))
        del y
    peak = (mode.peak - base) // 4
    made = 3 * H * I - missing
    # beside the formula's activations and gradients: the N·H slot the budget books (the incoming
    # gradient at mul's moment, up's input gradient at gate's) and y, which this test holds; at
    # gate's moment also the incoming gradient, which backward()'s argument keeps alive here (in
    # the step the engine frees it after down's backward)
    held = N * H + N * H + (N * H if late else 0)
    assert peak == act + made + held, (peak, act, made)


def test_scalar_and_vector_forms_agree():
    Ns = np.array([1, 64, 851, 852, 65536])
    act, missing = ffn.dense_backward_moment(_C(Ns, 2048, 10944))
    for n, a, m in zip(Ns, act, missing):
        assert (int(a), int(m)) == ffn.dense_backward_moment(_C(int(n), 2048, 10944))
    # DeepSeek-V2-Lite's dense layer: gate's moment binds up to N = 851 tokens per rank
    assert list(missing == 0) == [True, True, True, False, False]


def test_measured_rank_gets_its_own_dispatch_plan():
    """At a skewed routing the verdict takes the largest dispatch over ranks; ``predict(rank=r)``
    books rank ``r``'s plan, never more, and one rank's prediction equals that maximum."""
    pf = truncate(build_planfile(model="deepseek-v2-lite", gpus=16, seq_len=8192), 2).planfile
    pf = pf.model_copy(update={"plan": pf.plan.model_copy(update={"routing": "80/16"})})
    top = predict(pf, "freed", timing=False, dispatch_bound="expected")
    per_rank = [predict(pf, "freed", timing=False, dispatch_bound="expected", rank=r) for r in range(16)]
    lab = "forward[4]"
    tot = [p.live_set_bytes(lab, "dispatch") for p in per_rank]
    assert max(tot) == top.live_set_bytes(lab, "dispatch")
    assert min(tot) < max(tot)                          # the ranks' plans differ at this skew
    assert [p.ctx.dispatch_rank for p in per_rank] == list(range(16))
    ctx = make_context(pf.model, pf.cluster, pf.workload, pf.plan)
    assert expert_group_rank(ctx, 21 % 16) == 5
    assert expert_group_rank(dataclasses.replace(ctx, stack="fsdp2", tp=2, ep=4), 13) == 2   # (13 // 2) % 4
