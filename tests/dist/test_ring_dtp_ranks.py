"""Ring-DTP arguments that differ between the ranks of a group, or that one rank alone gets wrong,
under gloo with 2 and 3 processes: every rank raises before the ring (one clear line, the same on
every rank where the ranks disagree; the failing rank's own error and the others naming it where one
rank's arguments are refused), none hangs or aborts, and the group stays usable.

Before the checks rode on the operator's one all-reduce, these cases aborted gloo ("Received data
size doesn't match") or left the other ranks waiting in the ring or the all-reduce.
"""

from __future__ import annotations


import pytest
from gloo_world import serve, world_fixture
import torch

WORLDS = (2, 3)
WORKER_TIMEOUT_S = 90
"""Wall-clock limit for one world's workers (a hang fails the module instead of blocking it)."""
V, H, N = 13, 4, 3

# name: (arguments of the last rank or of every rank, by rank) -> what every rank must raise.
# SAME: every rank raises this line. ONE: the failing rank raises its own, the others name it.
SAME = {
    "mode_differs": (lambda r, W: {"mode": "activations" if r == 0 else "weights"},
                     r"^mode \('activations' on one rank, 'weights' on another\) must be the same on every rank"),
    "H_differs": (lambda r, W: {"H": H + 2 if r == W - 1 else H},
                  rf"^hidden size H \({H} on one rank, {H + 2} on another\) must be the same on every rank"),
    "dtype_differs": (lambda r, W: {"dtype": torch.bfloat16 if r == W - 1 else torch.float32},
                      r"^dtype \(torch.float32 on one rank, torch.bfloat16 on another\) must be the same"),
    "dtype_differs_weights": (lambda r, W: {"mode": "weights", "dtype": torch.bfloat16 if r == 0 else torch.float32},
                              r"^dtype \(torch.float32 on one rank, torch.bfloat16 on another\) must be the same"),
    "vocab_blocks_differs": (lambda r, W: {"vocab_blocks": 2 if r == W - 1 else 1},
                             r"^vocab_blocks \(1 on one rank, 2 on another\) must be the same on every rank"),
    "ignore_index_differs": (lambda r, W: {"ignore_index": 5 if r == W - 1 else -100},
                             r"^ignore_index \(-100 on one rank, 5 on another\) must be the same on every rank"),
    "vocab_size_differs": (lambda r, W: {"vocab_size": V + 1 if r == W - 1 else V},
                           rf"^vocab_size \({V} on one rank, {V + 1} on another\) must be the same on every rank"),
}
ONE = {   # name: (arguments by rank, failing rank, its own error)
    # without vocab_size, V is the largest vocab_start + V_r (here one too many), so the shard that
    # no longer fits may be another rank's: ``None`` takes the ranks that raise their own error
    "vocab_start_wrong_one_rank": (lambda r, W: {"start_shift": 1 if r == W - 1 else 0}, None,
                                   r"^vocab_start \(\d+\) with \d+ rows must give the shard"),
    "vocab_start_wrong_one_rank_sized": (lambda r, W: {"start_shift": 1 if r == W - 1 else 0, "vocab_size": V}, -1,
                                         r"^vocab_start \(\d+\) with \d+ rows must give the shard"),
    "vocab_blocks_error_one_rank": (lambda r, W: {"vocab_blocks": 0 if r == W - 1 else 1}, -1,
                                    r"^vocab_blocks \(0\) must be an integer in \[1, 1048576\]"),
    "shape_error_one_rank": (lambda r, W: {"short_targets": r == W - 1}, -1,
                             rf"^targets_N \(\({N - 1},\)\) must have shape \({N},\)"),
    "ignore_index_float_rank0": (lambda r, W: {"ignore_index": 1.5 if r == 0 else -100}, 0,
                                 r"^ignore_index \(1.5\) must be an integer"),
}


def _call(rank: int, W: int, kw: dict):
    from planner.plans.ring import shard_bounds
    from planner.runtime.ring_dtp import ring_dtp_cross_entropy

    kw = dict(kw)
    g = torch.Generator().manual_seed(rank)
    lo, hi = shard_bounds(V, W)[rank]
    h, dtype = kw.pop("H", H), kw.pop("dtype", torch.float32)
    x = torch.randn(N, h, generator=g).to(dtype).requires_grad_()
    w = torch.randn(hi - lo, h, generator=g).to(dtype).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    if kw.pop("short_targets", False):
        t = t[:-1]
    start = lo + kw.pop("start_shift", 0)
    loss = ring_dtp_cross_entropy(x, t, w, group=None, vocab_start=start, **kw)
    loss.backward()
    return float(loss)


def _cases(rank: int, W: int, out: dict) -> None:
    for name, (args, *_) in {**SAME, **ONE}.items():
        try:
            _call(rank, W, args(rank, W))
            out[name] = None
        except Exception as e:  # noqa: BLE001 - the error each rank raised is the result
            out[name] = (type(e).__name__, str(e))
        out[name + ":after"] = _call(rank, W, {})     # the group still works


def _worker(rank: int, W: int, store_path: str, queue) -> None:
    serve(rank, W, store_path, queue, _cases)


world = world_fixture(_worker, WORLDS, WORKER_TIMEOUT_S)
"""Every case on every rank of one gloo world (spawned once per module and world size)."""


@pytest.mark.dist
@pytest.mark.parametrize("case", list(SAME))
def test_arguments_that_differ_between_ranks_raise_the_same_error_on_every_rank(world, case):
    W, ranks = world
    msgs = {r: out[case] for r, out in ranks.items()}
    assert all(m is not None and m[0] == "InvalidPlan" for m in msgs.values()), msgs
    assert len({m[1] for m in msgs.values()}) == 1, f"W={W}: the ranks raised different errors: {msgs}"
    import re

    line = msgs[0][1]
    assert re.search(SAME[case][1], line) and "\n" not in line and "; fix: " in line, line
    assert all(isinstance(out[case + ":after"], float) for out in ranks.values()), "the group broke"


@pytest.mark.dist
@pytest.mark.parametrize("case", list(ONE))
def test_an_argument_refused_on_one_rank_raises_on_every_rank(world, case):
    import re

    W, ranks = world
    _, bad, own = ONE[case]
    failing = [r for r, out in ranks.items() if out[case] and re.search(own, out[case][1])]
    bad = failing[0] if bad is None and failing else (bad or 0) % W
    assert failing == [bad], f"W={W}: ranks {failing} raised their own error, expected [{bad}]"
    for r, out in ranks.items():
        m = out[case]
        assert m is not None and m[0] == "InvalidPlan", f"W={W} rank {r}: {m}"
        if r == bad:
            assert re.search(own, m[1]), f"W={W} rank {r}: {m[1]}"
        else:
            assert re.search(rf"\brank {bad}\b", m[1]) and "; fix: " in m[1], f"W={W} rank {r}: {m[1]}"
        assert "\n" not in m[1]
        assert isinstance(out[case + ":after"], float), f"W={W} rank {r}: the group broke after the error"
