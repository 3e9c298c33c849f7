"""The curves of the coverage run as the time model reads them: long-S attention tables per runtime
variant, dispatch-kernel curves per width, and SCO's measured cost against plain checkpointing.
Synthetic profiles (the flat profile of ``test_timing_profiles`` plus one curve), so every value
is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.schema.io import load_cluster
from planner.timing import curves as C
from planner.timing import kernel_rates as KR
from planner.timing.compute import Lookups, attention_s
from planner.timing.offload import sco_exposed_s, sco_fit_row, sco_overhead_per_byte, sco_row_exposed_s

REL = 1e-9
"""Closed-form values match to rounding."""
SEQS, HEADS = [65536, 131072, 262144], [1, 2, 8]


def _with(flat_spec, **curves):
    data = flat_spec.model_dump(mode="json")
    data["curves"].update(curves)
    return C.parse_cluster(data)


def _long(variant="mla", d_qk=192, d_v=128, window=None, sinks=False, t0=0.5):
    """Times ``t0·(S/S0)²·h`` (``·S/S0`` with a window): exactly a power law, so the log-bilinear
    reading is exact between grid points."""
    p = 1 if window else 2
    f = [[t0 * (S / SEQS[0]) ** p * h for h in HEADS] for S in SEQS]
    return {"status": "assumed", "variant": variant, "d_qk": d_qk, "d_v": d_v, "window": window, "sinks": sinks,
            "seq_len": SEQS, "heads": HEADS, "fwd_s": f, "bwd_s": [[2.5 * v for v in r] for r in f]}


def test_long_table_read_for_its_variant_only(flat):
    cl = _with(flat, attention_long={"mla": _long()})
    lk = Lookups(cl)
    S, h = np.array([65536, 92682, 262144]), np.array([1, 4, 8])
    got = attention_s(lk, S, h, 192, 128)
    want = 0.5 * (S / 65536) ** 2 * h
    assert np.allclose(got, want, rtol=1e-6)
    assert math.isclose(attention_s(lk, 131072, 2, 192, 128, backward=True), 2.5 * 0.5 * 4 * 2, rel_tol=REL)
    assert not any("d_v (128) != d_qk" in a for a in lk.assumed), "the long table has the exact widths"
    # another variant reads the generic table as before; S below the table: the generic time × the
    # variant's measured/generic ratio at the table's shortest S
    ref = Lookups(flat)
    assert attention_s(lk, 131072, 2, 128, 128) == attention_s(ref, 131072, 2, 128, 128)
    ratio = attention_s(lk, 65536, 2, 192, 128) / attention_s(ref, 65536, 2, 192, 128)
    assert math.isclose(attention_s(lk, 32768, 2, 192, 128), ratio * attention_s(ref, 32768, 2, 192, 128), rel_tol=1e-9)
    assert any("S below its shortest measured 65536" in a for a in lk.assumed)


def test_long_table_reads_no_generic_gap_it_does_not_use(flat):
    """Where the variant's table times S, a head count beyond the generic table's is no gap (the
    generic table is not read there): strict timing succeeds and gives the table's time, with its
    heads rule listed; below the table's S the generic gap stays."""
    cl = _with(flat, attention_long={"mla": _long()})
    h_big = 2 * max(cl.curves.attention_fwd.axes[1])
    strict = Lookups(cl, strict=True)
    assert math.isclose(attention_s(strict, 131072, h_big, 192, 128), 0.5 * 4 * h_big, rel_tol=1e-9)
    assert any("heads per rank above the measured 8" in a for a in strict.assumed)
    lk = Lookups(cl)
    assert np.isfinite(attention_s(lk, 131072, h_big, 192, 128)) and not lk.gaps
    assert np.isnan(attention_s(lk, 32768, h_big, 192, 128)) and lk.gaps
    mixed = attention_s(Lookups(cl), np.array([32768, 131072]), h_big, 192, 128)
    assert np.isnan(mixed[0]) and math.isclose(mixed[1], 0.5 * 4 * h_big, rel_tol=1e-9)


def test_long_table_rules_are_listed(flat):
    lk = Lookups(_with(flat, attention_long={"mla": _long()}))
    t = attention_s(lk, 524288, 16, 192, 128)
    assert math.isclose(t, 0.5 * 64 * 16, rel_tol=1e-9)      # (S/S0)² · h: both rules, exact for a power law
    text = " ".join(lk.assumed)
    assert "heads per rank above the measured 8" in text and "S above the measured 262144" in text


def test_sliding_table_scales_linearly_beyond(flat):
    lk = Lookups(_with(flat, attention_long={"sliding64": _long("sliding64", 64, 64, 128, True)}))
    t = attention_s(lk, 524288, 8, 64, 64, window=128, sinks=True)
    assert math.isclose(t, 0.5 * 8 * 8, rel_tol=1e-9)
    assert not any("band's share" in a for a in lk.assumed)
    ref = Lookups(flat)                                      # without sinks: not this variant
    assert attention_s(lk, 131072, 8, 64, 64, window=128) == attention_s(ref, 131072, 8, 64, 64, window=128)


def test_dispatch_curve_at_width_exact_and_nearest():
    h200 = load_cluster("h200")
    base = h200.curves.dispatch_kernels
    if base is None:
        pytest.skip("the shipped profile has no dispatch_kernels curve")
    data = h200.model_dump(mode="json")
    other = base.model_dump(mode="json")
    other["widths"] = {**other["widths"], "H": 4096, "I": 4096, "k": 4}
    other["memory"] = {c: {**r, "vs_reference": r["vs_reference"] / 2} for c, r in other["memory"].items()}
    data["curves"]["dispatch_kernels_widths"] = [base.model_dump(mode="json"), other]
    cl = C.parse_cluster(data)
    lk = Lookups(cl)
    with KR.at_width(lk, 4096, 4096, 4):
        half = KR.class_rates(lk)
    with KR.at_width(lk, 7168, 2048, 8):
        full = KR.class_rates(lk)
    assert all(math.isclose(half[c], full[c] / 2, rel_tol=REL) for c in full)
    assert not any("no curve measured at these widths" in a for a in lk.assumed)
    with KR.at_width(lk, 4096, 3000, 4):
        near = KR.class_rates(lk)
    assert near == half and any("H=4096, I=3000, k=4: no curve measured" in a for a in lk.assumed)
    assert KR.curve(lk) is cl.curves.dispatch_kernels     # outside a block: the profile's own


def _sco_rows():
    # copy-bound: copies 10 ms against 1 ms regions; compute-bound: copies hidden, 2% slower measured
    return [dict(config="copy-bound", boundary_bytes=400_000_000, num_boundaries=16, plain_step_s=0.2, sco_step_s=0.5,
                 forward_s=0.016, d2h_s=0.01, h2d_s=0.01),
            dict(config="compute-bound", boundary_bytes=400_000_000, num_boundaries=16, plain_step_s=1.0,
                 sco_step_s=1.02, forward_s=0.4, d2h_s=0.01, h2d_s=0.01)]


def test_sco_overhead_from_the_hidden_row(flat):
    cl = _with(flat, sco={"status": "assumed", "rows": _sco_rows()})
    lk = Lookups(cl)
    fit = sco_fit_row(cl.curves.sco)
    assert fit.config == "compute-bound" and sco_row_exposed_s(fit) == 0.0
    eps = sco_overhead_per_byte(lk)
    assert math.isclose(eps, 0.02 / (16 * 400_000_000), rel_tol=REL)
    copy = cl.curves.sco.rows[0]
    assert math.isclose(sco_row_exposed_s(copy), 16 * (0.009 + max(0.0, 0.01 - 0.184 / 16)), rel_tol=REL)
    r = sco_exposed_s(lk, ("attention", "moe") * 4, 8, 1e9, {"attention": 1.0, "moe": 1.0},
                      {"attention": 1.0, "moe": 1.0}, 1.0)
    assert math.isclose(float(r["overhead"]), 8 * 1e9 * eps, rel_tol=REL)
    assert float(r["offload"]) == 0.0 and float(r["restore"]) == 0.0


def test_sco_without_curve_is_listed(flat):
    lk = Lookups(flat)
    assert sco_overhead_per_byte(lk) == 0.0
    assert any("SCO: no cost beyond the exposed copies" in a for a in lk.assumed)


COMPONENT_SUM_REL = 1e-9
"""The components regroup the breakdown: they sum to the step time to rounding."""


@pytest.mark.parametrize("model,ckpt", [("qwen3-30b-a3b", "per_layer"), ("gpt-oss-20b", "sco")])
def test_components_sum_to_the_step(model, ckpt):
    from planner.budget.build import make_context
    from planner.schema import ComposedKnobs, Plan, Workload
    from planner.schema.io import load_model
    from planner.timing.step import step_time

    ctx = make_context(load_model(model), load_cluster("h200"), Workload(seq_len=32768),
                       Plan(world_size=8, composed=ComposedKnobs(checkpoint=ckpt, seq_parallel=4, expert_parallel=8)))
    st = step_time(ctx)
    comp = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in st.components.items()}
    assert set(comp) == {"compute", "attention", "optimizer", "copies", "host", "recompute", "communication"}
    assert math.isclose(sum(comp.values()), float(np.asarray(st.total_s).reshape(-1)[0]), rel_tol=COMPONENT_SUM_REL)
    assert all(v >= 0 for v in comp.values())
    assert comp["recompute"] > 0 and comp["attention"] > 0 and comp["compute"] > 0
