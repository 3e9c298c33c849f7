"""``calibration.step_host`` on the CPU (gloo, one rank): the FSDP2 step of tiny-width shipped
structures, timed per phase, and the fragment the time model reads.

- the phases are the step's (``embedding``, ``forward[l]``, ``head``, ``backward[l]``, ``optimizer``),
  each with positive host seconds;
- the expert loops run as ``planner.timing.baseline_host`` assumes: every local expert one block
  per forward, the backward reruns the forward loop exactly when ``ac ≠ none``
  (``RECOMPUTES_LOOP``), one backward loop per layer;
- the seconds outside the loops are the phase's seconds less the loops', never negative;
- the fragment validates against ``BaselineHostCurve`` and merges into a profile that
  ``step_time`` reads (a floor appears, the step gets no shorter).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibration import step_host as SH  # noqa: E402
from planner.timing.baseline_host import RECOMPUTES_LOOP  # noqa: E402

SMOKE = dict(tokens=256, warmup=1, steps=2)


@pytest.fixture(scope="module")
def cases():
    import torch.distributed as dist

    started = not dist.is_initialized()
    dev = torch.device("cpu")
    if started:
        SH._start_world(dev)
    try:
        yield {(m, ac): SH.measure_case(m, ac, SMOKE, dev) for m in ("qwen3-30b-a3b", "deepseek-v2-lite")
               for ac in ("full", "none")}
    finally:
        if started:
            dist.destroy_process_group()


def test_phases_and_loops(cases):
    for (model, ac), c in cases.items():
        ph = c["phases"]
        want = {"embedding", "forward[1]", "forward[2]", "head", "backward[2]", "backward[1]", "optimizer"}
        assert set(ph) == want, (model, ac)
        assert all(p["host_s"] > 0 for p in ph.values())
        E = c["num_experts"]
        for i, kind in enumerate(c["layer_kinds"], start=1):
            f, b = ph[f"forward[{i}]"], ph[f"backward[{i}]"]
            n = E if kind == "moe" else 0
            assert (f["fwd_blocks"], f["bwd_blocks"]) == (n, 0), (model, ac, i)
            assert (b["fwd_blocks"], b["bwd_blocks"]) == (int(n * RECOMPUTES_LOOP[ac]), n), (model, ac, i)
        assert ph["head"]["fwd_blocks"] == ph["optimizer"]["fwd_blocks"] == 0


def test_row_outside_loops(cases):
    for c in cases.values():
        r = SH.row(c)
        assert set(r["layer_fwd_s"]) == set(c["layer_kinds"])
        for i, kind in enumerate(c["layer_kinds"], start=1):
            p = c["phases"][f"forward[{i}]"]
            assert 0 <= r["layer_fwd_s"][kind] <= p["host_s"]
        assert r["loop_fwd_s_per_block"] > 0 and r["loop_bwd_s_per_block"] > 0
        assert r["head_s"] > 0 and r["optimizer_s"] > 0


def test_fragment_feeds_the_time_model(cases, h200):
    from planner.runtime.measure import provenance
    from planner.schema.curves import BaselineHostCurve
    from planner.schema.io import load_model
    from planner.timing.step import step_time
    from synthetic_profiles import ctx_of

    doc = {"provenance": provenance("pytest"), "layers": SH.LAYERS, "tiny": SH.TINY, "cases": list(cases.values())}
    frag = SH.fragment(doc)
    curve = BaselineHostCurve.model_validate(frag["curves"]["baseline_host"])
    assert {(r.model, r.ac) for r in curve.rows} == set(cases)
    # measured on the CPU: re-labelled for the H200 profile's device check
    curve = curve.model_copy(update={"status": "assumed", "provenance": None})
    cl = h200.model_copy(update={"curves": h200.curves.model_copy(update={"baseline_host": curve})})
    m = load_model("qwen3-30b-a3b").model_copy(update={"num_layers": 2})
    base = step_time(ctx_of(m, h200, W=1, S=4096, stack="fsdp2"), micro_steps_override=1)
    st = step_time(ctx_of(m, cl, W=1, S=4096, stack="fsdp2"), micro_steps_override=1)
    assert float(st.total_s) >= float(base.total_s)
    assert any("calibration.step_host, qwen3-30b-a3b, ac=full" in a for a in st.assumed)
