"""``max-context`` / ``max-batch`` where the whole grid's dispatch plans are too costly (the FSDP2
baseline's EP at a routing profile, an expected bound): the grid is first evaluated with the dispatch
left out (``Ctx.dispatch_left_out``), a lower bound of the peak, and only the points it does not
already fail are planned. The bound must stay below the exact peak (a point it rejects would
otherwise be a false "does not fit"), and the verdicts must be the whole grid's."""

import numpy as np
import pytest

from planner.api.build import build
from planner.budget import frontier, work_bounds
from planner.context.resolve import resolve_plan
from planner.schema.knobs import default as knob_default

CASES = [
    ("gpt-oss-20b", {"stack": "fsdp2", "routing": "80/16", "ac": "full"}),
    ("qwen3-30b-a3b", {"stack": "fsdp2", "routing": "80/16", "ac": "selective"}),
    ("deepseek-v2-lite", {"stack": "fsdp2", "routing": "80/16", "ac": "none"}),
    ("olmoe-1b-7b", {"stack": "fsdp2", "routing": "50/8", "ac": "full"}),
    ("qwen3-30b-a3b", {"dispatch": "pipelined_llep", "dispatch_bound": "expected", "checkpoint": "per_layer"}),
    ("deepseek-v2-lite", {"dispatch": "llep", "dispatch_bound": "expected", "checkpoint": "none"}),
    ("gpt-oss-20b", {"dispatch": "ep", "routing": "80/16", "checkpoint": "sco"}),
]
GRID = np.array([1024 * 8 * j for j in (1, 2, 3, 5, 8, 12, 16, 24, 32, 48)], dtype=np.int64)


def _setup(model, overrides):
    pf, _ = build(model=model, gpus=8, seq_len=8192, overrides=overrides)
    workload = pf.workload.model_copy(update={"global_batch_tokens": None})
    return pf, workload, resolve_plan(pf.model, workload, pf.plan)


@pytest.mark.parametrize("model,overrides", CASES, ids=[f"{m}-{'-'.join(map(str, o.values()))}" for m, o in CASES])
def test_every_phase_without_dispatch_is_below_the_exact_phase(model, overrides):
    """Phase by phase (so also the peak): leaving the dispatch out never adds bytes anywhere, and it
    removes some in the MoE phases."""
    import dataclasses

    from planner.budget.build import make_context
    from planner.budget.peak import evaluate

    pf, workload, plan = _setup(model, overrides)
    ctx = make_context(pf.model, pf.cluster, workload, plan, resolved=True, overrides={"seq_len": GRID})
    exact = evaluate(ctx, critical=True, per_term=False)
    lower = evaluate(dataclasses.replace(ctx, dispatch_left_out=True), critical=True, per_term=False)
    assert [p.label for p in lower.phases] == [p.label for p in exact.phases]
    assert (lower.by_phase <= exact.by_phase).all()
    assert (lower.by_phase < exact.by_phase).any()
    assert (lower.peak_bytes <= exact.peak_bytes).all()


@pytest.mark.parametrize("model,overrides", CASES[:4], ids=[m for m, _ in CASES[:4]])
def test_the_pre_scan_gives_the_whole_grid_verdicts(model, overrides, monkeypatch):
    """With the work bound lowered below the whole grid's plans, ``scan`` takes the pre-scan: the
    same fits, first failure and best value as the whole-grid scan, exact peaks where it planned."""
    pf, workload, plan = _setup(model, overrides)
    values = 4096 * np.arange(1, 97, dtype=np.int64)
    whole = frontier.scan(pf, "seq_len", values, plan=plan)
    assert whole.exact is None
    lower = frontier._scan(pf, workload, plan, "seq_len", values, frontier.MIN_HEADROOM, dispatch_left_out=True)
    planned = int(lower.fits.sum())
    assert 0 < planned < len(values)
    per_shape = work_bounds.expected_work(plan.baseline.ep, 1, pf.model.num_experts, knob_default("max_imports"))
    monkeypatch.setattr(work_bounds, "MAX_EXPECTED_WORK", per_shape * (planned + 1))
    pre = frontier.scan(pf, "seq_len", values, plan=plan)
    assert pre.exact is not None and pre.exact.tolist() == lower.fits.tolist()
    assert pre.fits.tolist() == whole.fits.tolist()
    assert (pre.best, pre.first_fail) == (whole.best, whole.first_fail)
    assert (pre.peak_bytes[pre.exact] == whole.peak_bytes[pre.exact]).all()
    assert (pre.peak_bytes[~pre.exact] <= whole.peak_bytes[~pre.exact]).all()
    # fewer points allowed than the bound leaves: refused as before, naming the routing
    monkeypatch.setattr(work_bounds, "MAX_EXPECTED_WORK", per_shape * (planned - 1))
    with pytest.raises(work_bounds.TooCostly) as e:
        frontier.scan(pf, "seq_len", values, plan=plan)
    assert e.value.field == "--routing" and f"{planned} shape(s)" in str(e.value)
