"""Formula vs fake-tensor trace (DESIGN §8) for SCO's boundaries and the optimizer step.

- SCO at the bench shape (L_b = 48, N = 69,632, H = 2,880, bf16), budgets 0 / 1 / 8 GiB / 16 GiB /
  full: the traced device peak less the stand-in's input equals the ``boundaries`` live set's peak
  over phases (forward-only traces check the forward phases alone), and the traced host bytes
  equal SCO's pinned pool (= ``planner.budget.host``'s per-rank SCO bytes).
- OffloadStreamAdamW: traced device bytes above the weights and grads equal the ``optimizer_step``
  staging term; traced host bytes equal ``optimizer.host_terms``.
- torch's fused AdamW (the FSDP2 baseline's optimizer): no temporaries above params, grads, m, v.

The region stand-in saves its input (as every real region does through its first norm) and
allocates only its output; its backward allocates only the boundary gradient. So its whole
inventory is the boundary live set.
"""

from __future__ import annotations

import pytest
import torch

from planner.budget import boundaries, host, optimizer
from planner.budget.build import make_context
from planner.budget.phases import full_phases
from planner.runtime import trace
from planner.runtime.offload_adamw import OffloadStreamAdamW
from planner.runtime.sco import SCO
from planner.schema import ComposedKnobs, ModelSpec, Plan, Workload
from planner.units import GiB

FORMULA_VS_TRACE = 0.01
N, H, LAYERS = 69632, 2880, 24
L_B = 2 * LAYERS
NHB = N * H * 2


def _model(**kw) -> ModelSpec:
    base = dict(name="sco-trace", num_layers=LAYERS, hidden_size=H, vocab_size=201088, num_heads=64,
                num_kv_heads=8, head_dim=64, num_experts=32, top_k=4, expert_ffn=H)
    base.update(kw)
    return ModelSpec(**base)


def _ctx(h200, model=None, **knobs):
    return make_context(model or _model(), h200, Workload(seq_len=N), Plan(world_size=1, composed=ComposedKnobs(**knobs)))


class _Interior(torch.autograd.Function):
    """Saves its input, allocates only its output; backward allocates only the input grad."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return h * 2

    @staticmethod
    def backward(ctx, g):
        (h,) = ctx.saved_tensors
        assert h.shape == g.shape
        return g * 2


class _Head(torch.autograd.Function):
    """The head stand-in: keeps nothing; its backward hands back an ``N×H`` gradient."""

    @staticmethod
    def forward(ctx, h):
        ctx.shape = h.shape
        return h.sum()

    @staticmethod
    def backward(ctx, g):
        return g.expand(ctx.shape).contiguous()


def _sco_build(budget, upto=None):
    def build():
        x = torch.empty(N, H, dtype=torch.bfloat16, device=trace.DEVICE, requires_grad=True)
        sco = SCO(num_boundaries=L_B, boundary_shape=(N, H), dtype=torch.bfloat16, device=trace.DEVICE,
                  host_budget_bytes=budget)

        def step():
            h = x.clone()
            for i in range(1, (upto or L_B) + 1):
                h = sco.region(i, _Interior.apply, h)
            if upto is None:
                loss = _Head.apply(h)
                del h
                loss.backward()

        return [x, sco.pool.tensor], step

    return build


def _formula_peak(ctx, kinds=None) -> int:
    ph = [p for p in full_phases(ctx) if kinds is None or p.kind in kinds]
    ts = [t for t in boundaries.terms(ctx) if not t.name.startswith("final norm")]  # the stand-in has none
    return max(sum(int(t.bytes_in(p)) for t in ts) for p in ph)


@pytest.mark.parametrize("budget", [0, NHB, 8 * GiB, 16 * GiB, L_B * 2 * NHB])
def test_sco_boundaries_formula_vs_trace(h200, budget):
    ctx = _ctx(h200, checkpoint="sco", sco_host_bytes=budget)
    res = trace.trace_rank(_sco_build(budget), rank=0, world_size=1)
    got = res.peak_bytes - NHB  # less the stand-in's input x
    want = _formula_peak(ctx)
    assert abs(got - want) <= FORMULA_VS_TRACE * want, (ctx.num_offloaded, got / NHB, want / NHB)
    assert res.host_peak_bytes == int(host.sco_bytes_per_rank(ctx)) <= budget
    # forward alone: the forward phases of the formula
    fwd = trace.trace_rank(_sco_build(budget, upto=L_B), rank=0, world_size=1)
    want_f = _formula_peak(ctx, kinds=("forward",))
    assert abs(fwd.peak_bytes - NHB - want_f) <= FORMULA_VS_TRACE * want_f


def test_sco_device_peak_falls_one_boundary_per_boundary_offloaded(h200):
    """The formula (checked above against the trace) drops by N·H·b per boundary offloaded,
    until the ≤ 2 restored boundaries bind."""
    peaks = [_formula_peak(_ctx(h200, checkpoint="sco", sco_host_bytes=n * NHB)) for n in range(L_B + 1)]
    drops = [a - b for a, b in zip(peaks, peaks[1:])]
    assert all(d in (0, NHB) for d in drops) and drops[0] == NHB
    assert peaks[-1] == 4 * NHB  # input + prefetch + grad in/out
    assert _formula_peak(_ctx(h200, checkpoint="per_layer")) == peaks[0] == (L_B + 2) * NHB


def _opt_params(ctx):
    """One fake bf16 tensor per parameter-tensor kind and layer, totalling ``Θ_r`` exactly."""
    from planner.plans.fsdp2_shards import param_tensors

    shapes = [(t.dim0, t.rest) for t in param_tensors(ctx.model) for _ in range(t.count)]
    assert sum(a * b for a, b in shapes) == optimizer.rank_params(ctx)
    return shapes


@pytest.mark.parametrize("beta,slots", [(50_000_000, 2), (100 * 2**20, 3)])
def test_offload_stream_adamw_formula_vs_trace(h200, beta, slots):
    model = _model(num_layers=4, num_experts=8)
    ctx = _ctx(h200, model=model, optimizer="stream_offload", bucket_params=beta, staging_slots=slots,
               checkpoint="per_layer")
    shapes = _opt_params(ctx)

    def build():
        ps = [torch.nn.Parameter(torch.empty(s, dtype=torch.bfloat16, device=trace.DEVICE)) for s in shapes]
        for p in ps:
            p.grad = torch.empty_like(p)
        opt = OffloadStreamAdamW(ps, bucket_params=beta, staging_slots=slots)
        return [*ps, *[p.grad for p in ps], opt.host.tensor, opt.steps], opt.step

    res = trace.trace_rank(build, rank=0, world_size=1)
    persistent = 4 * optimizer.rank_params(ctx) + 4 * len(shapes)  # bf16 weights + grads, step counters
    staging = sum(int(t.bytes) for t in optimizer.terms(ctx) if t.name.startswith("staging"))  # the bare optimizer: no replicas
    assert abs(res.peak_bytes - persistent - staging) <= FORMULA_VS_TRACE * staging
    host_bytes = sum(int(t.bytes) for t in optimizer.host_terms(ctx))
    assert abs(res.host_peak_bytes - host_bytes) <= FORMULA_VS_TRACE * host_bytes


def test_fused_adamw_has_no_temporaries(h200):
    """FSDP2's optimizer (torch fused AdamW over fp32 shards): peak = params + grads + m + v."""
    shapes = [(4096, 1000), (333, 77), (1000,)]
    n = sum(torch.Size(s).numel() for s in shapes)

    def build():
        ps = [torch.nn.Parameter(torch.empty(s, device=trace.DEVICE)) for s in shapes]
        for p in ps:
            p.grad = torch.empty_like(p)
        opt = torch.optim.AdamW(ps, fused=True)
        opt.step()  # creates m, v and the step tensors
        return [*ps, *[p.grad for p in ps], *[v for st in opt.state.values() for v in st.values()]], opt.step

    res = trace.trace_rank(build, rank=0, world_size=1)
    base = 16 * n + 4 * len(shapes)
    temps = res.peak_bytes - base
    model = _model(num_layers=2, num_experts=4)
    ctx = make_context(model, h200, Workload(seq_len=4096), Plan(world_size=1, stack="fsdp2"))
    assert sum(int(t.bytes) for t in optimizer.terms(ctx)) == 0
    assert abs(temps) <= FORMULA_VS_TRACE * base
