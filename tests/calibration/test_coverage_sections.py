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
    """One smoke calibration of every section on the CPU (the CUDA-only ones are skipped and named)."""
    out = tmp_path_factory.mktemp("cov") / "cov.yaml"
    spec = calibration.run(out, quick=False, smoke=True, progress=False, command="pytest")
    return out, spec, runner.LAST_RUN[0]


def test_smoke_runs_every_section_on_cpu(profile):
    _, spec, st = profile
    for name in ("gemm", "grouped_gemm", "attention_fwd", "attention_bwd", "cpu_adamw"):
        assert getattr(spec.curves, name) is not None, (name, st.failed)
    assert spec.curves.grouped_gemm.backend in ("torch._grouped_mm", "loop of torch.mm")
    # host-to-host copies on a shared CPU may be too noisy to fit: then they are reported, not lost
    for name, section in (("h2d", "transfer"), ("d2h", "transfer"), ("bidir", "transfer"),
                          ("gpu_adamw", "gpu_adamw")):
        fitted = getattr(spec.curves, name) is not None
        assert fitted or any(f.startswith(f"{section}: ") for f in st.failed), name
    assert {f"{s}: needs CUDA" for s in config.CUDA_ONLY} <= set(st.skipped)


def test_every_coverage_section_writes_its_curve(profile):
    out, spec, st = profile
    assert not [f for f in st.failed if f.split(":")[0] in coverage_sections.SECTIONS], st.failed
    assert [k for k in st.timings if k in coverage_sections.SECTIONS] == list(coverage_sections.SECTIONS)
    assert list(st.timings)[-2] == coverage_sections.SECTIONS[-1]   # attention last, then the total
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
    assert all(s.endswith(("would pass the section's budget", "the section's budget is spent")) for s in skipped)
    assert skipped[0] == "attention flash128 S=64 h=1,2: the section's budget is spent"   # nothing measured yet
    curves, skipped = coverage_sections.run("sco", "smoke", CPU, PROV, budget_s=1e-9, log=lambda m: None)
    assert curves == {} and skipped == ["sco copy-bound: out of budget"]


def test_a_length_is_measured_for_every_head_count_or_skipped_whole(monkeypatch):
    """A table keeps an ``S`` only where every head count was measured: a budget that admits only
    the first (unguessed) points measures ``S`` = 64 at all heads and skips each later group whole."""
    monkeypatch.setattr(Clock, "fits", lambda self, guess, margin=1.15: guess == 0)
    clock = Clock(60.0)
    doc = attention_long.measure(attention_long.SMOKE, CPU, clock, 0.0, log=lambda m: None)
    assert {(r["variant"], r["seq_len"], r["heads"]) for r in doc["rows"]} == {
        (name, 64, h) for name, v in attention_long.SMOKE["variants"].items() for h in v["heads"]}
    assert "attention mla S=128 h=1,2: " in " | ".join(clock.skipped)


def test_runner_reports_skips_in_its_state(tmp_path):
    calibration.run(tmp_path / "p.yaml", quick=False, smoke=True, progress=False, command="pytest",
                    only=("sco",), budgets={"sco": 1e-9})
    st = runner.LAST_RUN[0]
    assert st.skipped == ["sco: sco copy-bound: out of budget"] and not st.failed
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["curves"]["sco"] is None


@pytest.mark.parametrize("only, budgets, field, problem", [
    (("bogus",), None, "only", "is not a calibration section"),
    (("SCO",), None, "only", "did you mean sco"),
    ("sco", None, "only", "must be a tuple of section names, not str"),
    (5, None, "only", "not int"),
    ((), None, "only", "names no section"),
    ((None,), None, "only", "is not a calibration section"),
    (("constants",), None, "only", "is not measured by the smoke grid on this machine (no CUDA device)"),
    (None, {"attention": 10.0}, "budgets", "names no section with a wall budget"),
    (None, [("attention_long", 5)], "budgets", "must be a mapping"),
    (None, {"attention_long": -1.0}, "budgets['attention_long']", "positive finite"),
    (None, {"attention_long": math.nan}, "budgets['attention_long']", "positive finite"),
    (None, {"attention_long": True}, "budgets['attention_long']", "positive finite"),
    (None, {"attention_long": 10**400}, "budgets['attention_long']", "positive finite"),
    (None, {"sco": math.inf}, "budgets['sco']", "positive finite"),
    (("sco",), {"attention_long": 5.0}, "budgets['attention_long']", "does not apply"),
])
def test_bad_sections_and_budgets_are_refused_before_measuring(tmp_path, only, budgets, field, problem):
    with pytest.raises(InvalidPlan) as e:
        calibration.run(tmp_path / "p.yaml", quick=False, smoke=True, progress=False, command="pytest",
                        only=only, budgets=budgets)
    assert e.value.field == field and problem in str(e.value), str(e.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("out, problem", [("", "is an empty path"), (".", "names a folder, not a file"),
                                          ("/", "names a folder, not a file"),
                                          ("new_folder/", "names a folder, not a file")])
def test_an_out_that_names_a_folder_is_refused(tmp_path, monkeypatch, out, problem):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidPlan, match=problem):
        calibration.run(out, quick=False, smoke=True, progress=False, command="pytest", only=("sco",))
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


def test_an_out_of_memory_point_is_skipped_and_named_not_fatal():
    clock = Clock(60.0)
    with clock.point("attention mla S=1048576 h=8", CPU) as done:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB\nmore")
    assert not done and clock.skipped == ["attention mla S=1048576 h=8: out of memory (CUDA out of memory. "
                                          "Tried to allocate 64.00 GiB)"]
    with clock.point("ok", CPU) as done:
        pass
    assert done == [True]
    with pytest.raises(ValueError):          # anything else is the section's failure, not a skip
        with clock.point("bad", CPU):
            raise ValueError("x")
