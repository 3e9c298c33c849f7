"""The critical-phase reduction (DESIGN §5) equals the full phase scan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.budget.build import make_context
from planner.budget.peak import evaluate
from planner.errors import InvalidPlan
from planner.schema import BaselineKnobs, ComposedKnobs, Plan, Workload
from planner.units import GiB
from tests.conftest import tiny_moe

EXAMPLES = 150


@st.composite
def configs(draw):
    L = draw(st.integers(1, 6))
    dense = draw(st.sets(st.integers(0, L - 1), max_size=L - 1))
    shared = draw(st.integers(0, 1))
    model = tiny_moe(num_layers=L, dense_layers=tuple(sorted(dense)), dense_ffn=512 if dense else 0,
                     num_shared_experts=shared, shared_expert_ffn=128 * shared)
    W = draw(st.sampled_from([1, 2, 4, 8]))
    stack = draw(st.sampled_from(["composed", "fsdp2"]))
    composed = ComposedKnobs(
        dispatch=draw(st.sampled_from(["ep", "llep", "pipelined_llep"])),
        vocab=draw(st.sampled_from(["dense", "vocab_parallel", "ring_dtp"])),
        optimizer=draw(st.sampled_from(["gpu", "cpu_offload", "stream_offload"])),
        checkpoint=draw(st.sampled_from(["none", "per_layer", "sco"])),
        token_budget=draw(st.sampled_from([256, 1000, 4096])),
        sco_host_bytes=draw(st.sampled_from([0, 2**20, 2**26, None])))
    baseline = BaselineKnobs(ac=draw(st.sampled_from(["full", "selective", "none"])),
                             cpu_offload=draw(st.booleans()))
    plan = Plan(world_size=W, stack=stack, composed=composed, baseline=baseline,
                routing=draw(st.sampled_from(["balanced", "worst", "80/4"])),
                dispatch_bound=draw(st.sampled_from(["guarantee", "expected"])))
    S = draw(st.sampled_from([1024, 4096, 12288]))
    return model, plan, Workload(seq_len=S)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=configs())
def test_critical_phases_match_full_scan(h200, cfg):
    model, plan, wl = cfg
    try:
        ctx = make_context(model, h200, wl, plan)
    except InvalidPlan:
        return
    full = evaluate(ctx)
    crit = evaluate(ctx, critical=True)
    assert int(full.peak_bytes) == int(crit.peak_bytes)
    assert full.phases[int(full.binding_index)].label in {p.label for p in crit.phases} or \
        int(full.by_phase.max()) == int(crit.by_phase.max())


def test_peak_at_least_every_phase(h200):
    ctx = make_context(tiny_moe(), h200, Workload(seq_len=8192), Plan(world_size=4))
    ev = evaluate(ctx)
    assert (ev.peak_bytes >= ev.by_phase).all() and int(ev.peak_bytes) > GiB // 1024
