"""``calibration.step_host`` on the CPU (gloo, one rank): the FSDP2 step of tiny-width shipped
structures, timed per phase, and the fragment the time model reads.

- the phases are the step's (``embedding``, ``forward[l]``, ``head``, ``backward[l]``, ``optimizer``),
  each with positive host seconds;
- the expert loops run as ``planner.timing.baseline_host`` assumes: every local expert one block
  per forward, the backward reruns the forward loop exactly when ``ac ≠ none``
  (``RECOMPUTES_LOOP``), one backward loop per layer;
- the seconds outside the loops are the phase's seconds less the loops', never negative;
- the launches counted inside the loops are the time model's count (``loop_launches``), and the
  whole step's count is within ``KERNEL_COUNT_TOL`` of the H200 profiler's kernel count of the same
  structure (``bench/results/step_profile/step_profile_run2.json``); the row keeps the launches
  outside the loops per phase;
- the fragment validates against ``BaselineHostCurve`` and merges into a profile that
  ``step_time`` reads (host time appears, the step gets no shorter).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibration import step_host as SH  # noqa: E402
from planner.timing import baseline_host as BH  # noqa: E402
from planner.timing.baseline_host import RECOMPUTES_LOOP  # noqa: E402

SMOKE = dict(tokens=256, warmup=1, steps=2)
KERNEL_COUNT_TOL = 0.05
"""CPU-counted launches (tiny widths) against the H200 profiler's kernels of the same 2-layer
structure: the CPU's fused AdamW and attention are one call where CUDA launches a few kernels."""
PROFILE = Path(__file__).resolve().parents[2] / "bench" / "results" / "step_profile" / "step_profile_run2.json"
PROFILED = {("qwen3-30b-a3b", "full"): "fsdp2-qwen3-S8192", ("deepseek-v2-lite", "full"): "fsdp2-dsv2-S4096"}
"""The profiled FSDP2 cases (``bench/step_profile.py``: default ``ac = full``, 2 layers)."""


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
        for kind in set(c["layer_kinds"]):   # the row holds the mean over the kind's layers
            most = max(c["phases"][f"forward[{i}]"]["host_s"] for i, k in enumerate(c["layer_kinds"], start=1)
                       if k == kind)
            assert 0 <= r["layer_fwd_s"][kind] <= most
        assert r["loop_fwd_s_per_block"] > 0 and r["loop_bwd_s_per_block"] > 0
        assert r["head_s"] > 0 and r["optimizer_s"] > 0


def test_launch_counts(cases):
    """Inside the loops: exactly the time model's count; the whole step: the profiler's kernels."""
    prof = {c["case"]: c["measured"]["kernels"] for c in json.loads(PROFILE.read_text())["cases"] if "measured" in c}
    for (model, ac), c in cases.items():
        ph = c["phases"]
        assert "count_error" not in c, c.get("count_error")
        for i, kind in enumerate(c["layer_kinds"], start=1):
            want = BH.loop_launches(kind, ac, c["num_experts"])
            assert ph[f"forward[{i}]"]["loop_launches"] == want["fwd"], (model, ac, i)
            assert ph[f"backward[{i}]"]["loop_launches"] == want["bwd"], (model, ac, i)
        r = SH.row(c)
        assert set(r["launches"]) == {*(f"layer_{d}:{k}" for d in ("fwd", "bwd") for k in c["layer_kinds"]),
                                      "head", "optimizer", "embedding"}
        assert all(n > 0 for n in r["launches"].values())
        if (model, ac) in PROFILED:
            total = sum(p["launches"] + p["loop_launches"] for p in ph.values())
            kernels = prof[PROFILED[(model, ac)]]
            assert abs(total - kernels) <= KERNEL_COUNT_TOL * kernels, (model, total, kernels)


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
    st = step_time(ctx_of(m, cl, W=1, S=4096, stack="fsdp2"), micro_steps_override=1)
    row = next(r for r in curve.rows if (r.model, r.ac) == ("qwen3-30b-a3b", "full"))
    host = (m.num_layers * (row.layer_fwd_s["moe"] + row.layer_bwd_s["moe"]) + row.head_s + row.optimizer_s
            + row.embedding_s)        # the fragment's seconds outside the loops (planner.timing.baseline_host)
    assert float(st.components["host"]) == pytest.approx(host, rel=1e-9)
    assert any("calibration.step_host, qwen3-30b-a3b, ac=full" in a for a in st.assumed)
    assert not any("launches per phase not counted" in a for a in st.assumed)   # the fragment counts them
