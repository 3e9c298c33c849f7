"""SCO exactness on the CPU (DESIGN §7).

SCO only moves region inputs to pinned host memory and back, so the gradients must be BITWISE
equal to plain per-region non-reentrant checkpointing, for every host budget (0 and full
included), and also when the region nests a reentrant checkpoint (PipelinedLLEP's composition).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

from planner.plans.sco import num_offloaded
from planner.runtime.sco import SCO, checkpoint_region

H, HEADS, FFN, BATCH, SEQ, LAYERS = 24, 4, 40, 2, 7, 3  # awkward sizes: SEQ odd, H/HEADS = 6
L_B = 2 * LAYERS


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


class Decoder(torch.nn.Module):
    """A small decoder: per layer an attention region and a gated-MLP region, each residual."""

    def __init__(self, nested_reentrant: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        p = lambda *s: torch.nn.Parameter(torch.randn(*s, generator=g) * 0.2)  # noqa: E731
        self.emb = p(50, H)
        self.layers = torch.nn.ModuleList()
        for _ in range(LAYERS):
            m = torch.nn.Module()
            m.n1, m.n2 = torch.nn.Parameter(torch.ones(H)), torch.nn.Parameter(torch.ones(H))
            m.wqkv, m.wo = p(3 * H, H), p(H, H)
            m.w1, m.w3, m.w2 = p(FFN, H), p(FFN, H), p(H, FFN)
            self.layers.append(m)
        self.nested = nested_reentrant

    def attention(self, m, x_BSH):
        q, k, v = F.linear(_rms(x_BSH, m.n1), m.wqkv).chunk(3, -1)
        split = lambda t: t.view(BATCH, SEQ, HEADS, H // HEADS).transpose(1, 2)  # noqa: E731
        o = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        return x_BSH + F.linear(o.transpose(1, 2).reshape(BATCH, SEQ, H), m.wo)

    def mlp(self, m, x_BSH):
        def inner(y):
            return F.linear(F.silu(F.linear(y, m.w1)) * F.linear(y, m.w3), m.w2)

        y = _rms(x_BSH, m.n2)
        out = tuc.checkpoint(inner, y, use_reentrant=True) if self.nested else inner(y)
        return x_BSH + out

    def regions(self):
        for m in self.layers:
            yield lambda x, m=m: self.attention(m, x)
            yield lambda x, m=m: self.mlp(m, x)

    def forward(self, ids, run_region):
        h = self.emb[ids]
        for i, fn in enumerate(self.regions(), start=1):
            h = run_region(i, fn, h)
        return (h.float() ** 2).mean()


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _ids():
    return torch.randint(0, 50, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def _baseline(model, ids):
    return _grads(model, model(ids, lambda i, fn, h: checkpoint_region(fn, h)))


def _sco(nbytes_budget, **kw):
    return SCO(num_boundaries=L_B, boundary_shape=(BATCH, SEQ, H), dtype=torch.float32, device="cpu",
               host_budget_bytes=nbytes_budget, **kw)


SLOT = 4096  # one boundary (2·7·24·4 = 1344 B) rounds up to one 4 KiB page


@pytest.mark.parametrize("nested", [False, True])
def test_sco_grads_bitwise_equal_to_per_region_checkpoint_for_every_budget(nested):
    model, ids = Decoder(nested), _ids()
    ref = _baseline(model, ids)
    nocp = _grads(model, model(ids, lambda i, fn, h: fn(h)))
    assert all(torch.equal(a, b) for a, b in zip(ref, nocp))
    for n in range(L_B + 2):  # 0 .. full, plus a budget beyond full
        budget = n * SLOT + (SLOT - 1 if n % 2 else 0)  # leftovers below one page never buy a slot
        sco = _sco(budget, keep_log=True)
        assert sco.num_offloaded == min(n, L_B) == num_offloaded(BATCH * SEQ, H, 4, L_B, budget)
        assert sco.offloaded == tuple(range(1, min(n, L_B) + 1))
        assert sco.pinned_bytes == sco.num_offloaded * SLOT <= budget
        for step in range(2):  # the pool is reused across steps
            got = _grads(model, model(ids, sco.region))
            assert all(torch.equal(a, b) for a, b in zip(ref, got)), (n, step)
        assert sco.stats.offloads == sco.stats.restores == 2 * sco.num_offloaded
        sco.close()


def test_restored_boundary_comes_from_the_host_pool():
    """Corrupting the pinned pool between forward and backward changes the gradients."""
    model, ids = Decoder(), _ids()
    ref = _baseline(model, ids)
    sco = _sco(L_B * SLOT)
    loss = model(ids, sco.region)
    sco.pool.tensor.view(torch.float32).mul_(1.5)
    model.zero_grad(set_to_none=True)
    loss.backward()
    got = [p.grad for p in model.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(ref, got))


@pytest.mark.parametrize("n_off", [1, 3, L_B])
def test_prefetch_order_one_region_ahead(n_off):
    """Backward prefetches h_{ℓ-1} when region ℓ recomputes: at most one prefetched at a time."""
    model, ids = Decoder(), _ids()
    sco = _sco(n_off * SLOT, keep_log=True)
    _grads(model, model(ids, sco.region))
    log = sco.stats.log
    assert log[:n_off] == [("d2h", i) for i in range(1, n_off + 1)]
    bwd = log[n_off:]
    expect = [] if n_off < L_B else [("h2d", L_B)]
    for ell in range(n_off, 0, -1):
        if ell == n_off and n_off < L_B:
            expect.append(("h2d", ell))  # prefetched when retained region n_off+1 recomputes
        expect.append(("use", ell))
        if ell > 1:
            expect.append(("h2d", ell - 1))
    assert bwd == expect
    assert sco.stats.prefetch_hits == (n_off if n_off < L_B else n_off - 1)


def test_offloaded_boundary_must_match_the_plan_shape():
    model, ids = Decoder(), _ids()
    sco = SCO(num_boundaries=L_B, boundary_shape=(BATCH, SEQ + 1, H), dtype=torch.float32, device="cpu",
              host_budget_bytes=SLOT)
    with pytest.raises(ValueError, match="must be a contiguous"):
        model(ids, sco.region)
    with pytest.raises(ValueError, match="region index"):
        sco.region(0, lambda x: x, torch.zeros(1))


def test_second_forward_before_backward_is_rejected_naming_the_region():
    """Two forwards summed into one loss overwrite the slots: the backward raises, never wrong."""
    model, ids = Decoder(), _ids()
    sco = _sco(2 * SLOT)
    loss = model(ids, sco.region) + model(ids, sco.region)
    with pytest.raises(RuntimeError, match=r"host slot of region [12] holds the boundary of a later "
                                           r"run of region [12] .*fix: call backward after each forward"):
        loss.backward()
    ref = _baseline(model, ids)                   # the SCO stays usable for the next step
    assert all(torch.equal(a, b) for a, b in zip(ref, _grads(model, model(ids, sco.region))))
    sco.close()


def test_discarded_graph_then_new_forward_and_retained_graph_stay_exact():
    """A forward whose graph is dropped without backward, then a normal step; a retained graph
    backwarded twice reads the same slots twice (no false alarm)."""
    model, ids = Decoder(), _ids()
    ref = _baseline(model, ids)
    sco = _sco(L_B * SLOT)
    model(ids, sco.region)                        # evaluation with grad on, no backward
    loss = model(ids, sco.region)
    model.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    assert all(torch.equal(a, p.grad) for a, p in zip(ref, model.parameters()))
    loss.backward()
    assert all(torch.equal(2 * a, p.grad) for a, p in zip(ref, model.parameters()))
    sco.close()


def test_use_after_close_is_a_clear_error():
    model, ids = Decoder(), _ids()
    sco = _sco(L_B * SLOT)
    loss = model(ids, sco.region)
    sco.close()
    sco.close()                                   # idempotent
    with pytest.raises(RuntimeError, match=r"SCO is closed .*fix: build a new SCO"):
        loss.backward()
    with pytest.raises(RuntimeError, match="SCO is closed"):
        model(ids, sco.region)


def _inplace_step(run, edit_h=False, edit_arg=False, in_region=False):
    """One region over a non-leaf boundary and a second tensor argument; the caller (or the region
    itself) then changes one of them in place before the backward."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(H, H, generator=g, requires_grad=True)
    x0 = torch.randn(BATCH * SEQ, H, generator=g, requires_grad=True)
    h, s = x0 * 1.0, (x0 * 0.5).detach()

    def fn(t, scale):
        y = torch.tanh((t * scale) @ w)
        if in_region:
            t.mul_(3.0)
        return y

    out = run(1, fn, h, s)
    with torch.no_grad():
        if edit_h:
            h.mul_(3.0)
        if edit_arg:
            s.add_(1.0)
    (out * h).sum().backward()
    return w.grad


@pytest.mark.parametrize("what", ["edit_h", "edit_arg", "in_region"])
@pytest.mark.parametrize("n_off", [0, 1])
def test_a_saved_input_changed_in_place_raises_as_plain_checkpointing_does(what, n_off):
    """torch skips its in-place check for tensors that pass through saved-tensor hooks: SCO makes
    it (a kept boundary gave gradients off by ~17, silently). An offloaded boundary changed after
    its region returned is restored as the forward read it: exact, no error."""
    kw = {what: True}
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _inplace_step(lambda i, fn, h, s: checkpoint_region(fn, h, s), **kw)
    sco = SCO(num_boundaries=1, boundary_shape=(BATCH * SEQ, H), dtype=torch.float32, device="cpu",
              host_budget_bytes=n_off * SLOT)
    if what == "edit_h" and n_off:
        truth = _inplace_step(lambda i, fn, h, s: fn(h.detach().clone(), s), **kw)  # the forward as run
        assert torch.equal(_inplace_step(sco.region, **kw), truth)
    else:
        role = "a tensor argument" if what == "edit_arg" else "the boundary h"
        with pytest.raises(RuntimeError, match=rf"modified by an inplace operation: {role} of SCO region 1 "
                                               r"\[torch.float32 \[14, 24\]\] is at version \d+; expected version "
                                               r"\d+ instead; fix: change it out of place"):
            _inplace_step(sco.region, **kw)
    assert torch.equal(_inplace_step(sco.region), _inplace_step(lambda i, fn, h, s: checkpoint_region(fn, h, s)))
    sco.close()
