"""Ring-DTP's Python API refuses malformed arguments with one ``InvalidPlan`` line naming the argument,
its value and the fix (``ring_dtp_cross_entropy`` as ``RingDTPHead`` does; ``vocab_blocks`` within
the plan schema's bound; ``load_full_weight`` only the full head), instead of a deep ``TypeError`` or
silent acceptance. One process (``group=None``); the cross-rank cases are in
``tests/dist/test_ring_dtp_ranks.py``."""

from __future__ import annotations

import re

import pytest
import torch

from planner.errors import InvalidPlan
from planner.runtime.ring_dtp import RingDTPHead, ring_dtp_cross_entropy
from planner.schema.base import MAX_IMPORTS

V, H, N = 11, 4, 5


def _ce(**kw):
    g = torch.Generator().manual_seed(0)
    x, w, t = torch.randn(N, H, generator=g), torch.randn(V, H, generator=g), torch.randint(0, V, (N,), generator=g)
    return ring_dtp_cross_entropy(x, t, w, **{"group": None, "vocab_start": 0, **kw})


BAD_CALLS = {   # keyword: (value, what the message repeats)
    "vocab_blocks": [(1.5, r"\(1\.5\)"), ("2", r"\('2'\)"), (MAX_IMPORTS + 1, rf"\({MAX_IMPORTS + 1}\)"),
                     (True, r"\(True\)")],
    "vocab_size": [(11.0, r"\(11\.0\)"), ("11", r"\('11'\)")],
    "vocab_start": [(None, r"\(none given\)"), (0.0, r"\(0\.0\)")],
    "ignore_index": [(None, r"\(none given\)"), (1.5, r"\(1\.5\)")],
}


@pytest.mark.parametrize("name,value,shown", [(n, v, s) for n, cases in BAD_CALLS.items() for v, s in cases])
def test_bad_function_argument_raises_one_invalid_plan_line_naming_it(name, value, shown):
    with pytest.raises(InvalidPlan, match=rf"^{name} {shown} must be .*; fix: ") as err:
        _ce(**{name: value})
    assert "\n" not in str(err.value)


def test_vocab_blocks_is_capped_at_the_schema_bound():
    with pytest.raises(InvalidPlan, match=rf"vocab_blocks \({10 ** 12}\) must be an integer in \[1, {MAX_IMPORTS}\]"):
        RingDTPHead(H, V, vocab_blocks=10 ** 12)
    assert RingDTPHead(H, V, vocab_blocks=MAX_IMPORTS).vocab_blocks == MAX_IMPORTS
    assert torch.isfinite(_ce(vocab_blocks=64))            # more strips than rows: empty strips skipped


@pytest.mark.parametrize("shape", [(V, H + 1), (V + 5, H), (V - 1, H), (V * H,)])
def test_load_full_weight_takes_only_the_full_head(shape):
    head = RingDTPHead(H, V)
    before = head.weight.detach().clone()
    with pytest.raises(InvalidPlan, match=re.escape(f"w_VH ({tuple(shape)}) must be the full head of shape ({V}, {H})")):
        head.load_full_weight(torch.randn(*shape))
    assert torch.equal(head.weight, before)
    w = torch.randn(V, H)
    head.load_full_weight(w)
    assert torch.equal(head.weight, w)


def test_non_tensor_inputs_are_named():
    with pytest.raises(InvalidPlan, match=r"^x_NH \(a list\) must be a torch.Tensor"):
        ring_dtp_cross_entropy([[0.0] * H] * N, torch.zeros(N, dtype=torch.long), torch.randn(V, H), group=None,
                               vocab_start=0)
