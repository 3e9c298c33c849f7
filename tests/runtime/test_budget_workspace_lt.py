"""Which threads run a biased linear (``aten.addmm``, cuBLASLt's bias epilogue on CUDA) in a step:
the op-level facts behind ``planner.budget.workspace.blaslt_handles``, on the CPU with the FSDP2
baseline's own checkpoint wrappers (``planner.runtime.fsdp2_layout.apply_ac``).

- forward: every biased ``F.linear`` (2-D input, or a contiguous 3-D one) is one ``addmm``;
- backward of a biased linear: ``mm``s and a sum, no ``addmm``;
- the backward re-runs the ``addmm`` under ``ac = full`` only: ``selective`` saves its output
  (torchtitan's op list holds ``addmm``) and ``none`` recomputes nothing.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from planner.runtime.fsdp2_layout import apply_ac

B, T, H, F = 2, 5, 8, 12


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


class _Block(nn.Module):
    """A biased projection of a ``B×T×H`` input (gpt-oss q/k/v) and a biased router on ``N×H``."""

    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(H, F, bias=True)
        self.router = nn.Linear(F, 4, bias=True)
        self.wo = nn.Linear(F, H, bias=False)

    def forward(self, x_BTH):
        h = torch.relu(self.wq(x_BTH))
        g = self.router(h.reshape(B * T, F)).softmax(-1).sum(-1).reshape(B, T, 1)
        return self.wo(h * g)


def _addmm_counts(mode: str) -> tuple[int, int]:
    torch.manual_seed(0)
    block = apply_ac(_Block(), mode, router_shapes=set(), extra_context=[])
    x = torch.randn(B, T, H, requires_grad=True)
    with _Count() as fwd:
        y = block(x)
    loss = y.square().sum()
    with _Count() as bwd:
        loss.backward()
    return fwd.ops.count("addmm"), bwd.ops.count("addmm")


@pytest.mark.parametrize("mode,backward_addmm", [("full", 2), ("selective", 0), ("none", 0)])
def test_the_backward_reruns_the_biased_linears_only_under_full_ac(mode, backward_addmm):
    fwd, bwd = _addmm_counts(mode)
    assert fwd == 2
    assert bwd == backward_addmm
