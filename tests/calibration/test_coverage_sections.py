"""``planner calibrate``'s coverage sections (``calibration.coverage_sections``): long-context
attention, every dispatch width, SCO against plain checkpointing and the FSDP2 host rows, run at the
smoke shapes on the CPU through the same code the GPU runs, with their wall budgets and arguments."""

from __future__ import annotations

import math

import pytest
import yaml

torch = pytest.importorskip("torch")

import calibration  # noqa: E402
from calibration import attention_long, config, coverage_sections, dispatch_widths, runner  # noqa: E402
from calibration.wall_budget import Clock, timed  # noqa: E402
from planner.errors import InvalidPlan  # noqa: E402
from planner.schema.io import load_cluster, load_model  # noqa: E402
from planner.schema.profiles import shipped  # noqa: E402

PROV = {"device": "cpu", "date": "2026-12-07", "command": "pytest", "host_instance": "vm-test"}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """One smoke calibration of the four coverage sections only, written as a profile."""
    out = tmp_path_factory.mktemp("cov") / "cov.yaml"
    spec = calibration.run(out, quick=False, smoke=True, progress=False, command="pytest",
                           only=coverage_sections.SECTIONS)
    return out, spec, runner.LAST_RUN[0]


def test_every_coverage_section_writes_its_curve(profile):
    out, spec, st = profile
    assert not st.failed, st.failed
    assert list(st.timings)[:-1] == list(coverage_sections.SECTIONS)
    c = spec.curves
    assert sorted(c.attention_long) == sorted(attention_long.SMOKE["variants"])
    mla = c.attention_long["mla"]
    assert (mla.d_qk, mla.d_v, mla.heads) == (24, 16, [1, 2]) and mla.seq_len == [64, 128]
    assert c.sco.rows[0].config == "copy-bound" and c.sco.rows[0].sco_step_s > 0
    assert {r.model for r in c.baseline_host.rows} == {"qwen3-30b-a3b", "deepseek-v2-lite"}
    assert c.attention_long["flash128"].provenance.command == "pytest"
    # the profile on disk is the one the planner loads
    assert sorted(load_cluster(str(out)).curves.attention_long) == sorted(c.attention_long)


def test_dispatch_widths_cover_every_shipped_moe_width(profile):
    _, spec, _ = profile
    want = {(m.hidden_size, m.expert_ffn, m.top_k) for m in map(load_model, shipped("models")) if m.num_experts}
    got = [w for w in dispatch_widths.model_widths()]
    assert want | {dispatch_widths.SHAPE_B_WIDTHS} == {(w["H"], w["I"], w["k"]) for w in got}
    assert [(w["H"], w["I"], w["k"]) for w in got[:2]] == [(7168, 2048, 8), dispatch_widths.SHAPE_B_WIDTHS]
    curves = spec.curves.dispatch_kernels_widths
    assert len(curves) == len(got)                  # the smoke run shrinks H and I, one curve per width
    R = dispatch_widths.ROUTES["smoke"]
    assert [c.widths["k"] for c in curves] == [w["k"] for w in got]
    assert all(c.host_loops and c.memory and c.widths["R"] == R // c.widths["k"] * c.widths["k"] for c in curves)


def test_beyond_points_outside_the_complete_grid_are_named_not_used(profile):
    """``S`` = 256 is measured at one head only: the table stops at 128 and its note names the point."""
    _, spec, _ = profile
    flash = spec.curves.attention_long["flash128"]
    assert flash.seq_len == [64, 128] and "S=256 h=1" in flash.note


def test_the_summary_lists_the_coverage_curves(profile):
    out, _, _ = profile
    text = out.with_name(out.stem + ".summary.md").read_text()
    assert "| attention_long.mla |" in text and "S 64..128" in text
    assert "SCO/plain" in text and "baseline_host" in text and "dispatch_kernels_widths.0" in text


def test_a_spent_budget_skips_and_names_every_point():
    curves, skipped = coverage_sections.run("attention_long", "smoke", CPU, PROV, budget_s=1e-9, log=lambda m: None)
    assert curves == {}
    assert len(skipped) == len(attention_long.plan(attention_long.SMOKE))
    assert all("would pass the section's budget" in s for s in skipped)
    curves, skipped = coverage_sections.run("sco", "smoke", CPU, PROV, budget_s=1e-9, log=lambda m: None)
    assert curves == {} and skipped == ["sco copy-bound: out of budget"]


def test_runner_reports_skips_in_its_state(tmp_path):
    calibration.run(tmp_path / "p.yaml", quick=False, smoke=True, progress=False, command="pytest",
                    only=("sco",), budgets={"sco": 1e-9})
    st = runner.LAST_RUN[0]
    assert st.skipped == ["sco: sco copy-bound: out of budget"] and not st.failed
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["curves"]["sco"] is None


@pytest.mark.parametrize("only, budgets, field", [
    (("bogus",), None, "--sections"),
    (None, {"attention": 10.0}, "budgets"),
    (None, {"attention_long": -1.0}, "budget of attention_long"),
    (None, {"attention_long": math.nan}, "budget of attention_long"),
    (None, {"sco": math.inf}, "budget of sco"),
])
def test_bad_sections_and_budgets_are_refused_before_measuring(tmp_path, only, budgets, field):
    with pytest.raises(InvalidPlan) as e:
        calibration.run(tmp_path / "p.yaml", quick=False, smoke=True, progress=False, command="pytest",
                        only=only, budgets=budgets)
    assert e.value.field == field
    assert not list(tmp_path.iterdir())


def test_clock_and_timer_validate_their_arguments():
    with pytest.raises(ValueError, match="budget_s"):
        Clock(0.0)
    with pytest.raises(ValueError, match="median_of"):
        timed(lambda: None, CPU, 0.0, median_of=0)
    t, n = timed(lambda: sum(range(1000)), CPU, 0.001)
    assert t > 0 and n >= 3


def test_full_grid_host_tables_run_at_the_benches_parameter_count():
    assert config.FULL.cpu_adamw_params == config.HOST_TABLE_PARAMS == 10**9
    assert config.GPU_SECTIONS[-4:] == coverage_sections.SECTIONS
