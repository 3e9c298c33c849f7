"""How a plan file's cluster reference, sizes and error paths read: a ``profile:`` that is not a
cluster profile is named as such, a relative ``profile:`` resolves against the plan file's folder,
every field of a plan file is named by its path in the file (``plan.world_size``), sizes take
surrounding whitespace but no space inside, and ``planner validate`` without a GPU points at
something an installed user has."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from cli_lines import CLEAN_EXIT, one_line as _one_line  # noqa: F401
from planner import api, cli
from planner.errors import InvalidPlan
from planner.schema.io import load_planfile
from planner.units import parse_count

H200 = Path(__file__).resolve().parents[2] / "planner" / "profiles" / "clusters" / "h200.yaml"




def _plan_doc(**cluster) -> dict:
    pf = api.build_planfile(model="olmoe-1b-7b", gpus=8, seq_len=8192)
    doc = pf.model_dump(mode="json")
    if cluster:
        doc["cluster"] = cluster
    return doc


def _write(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_profile_that_is_not_a_cluster_profile_names_the_path(tmp_path, capsys):
    other = tmp_path / "passwd"
    other.write_text("root:x:0:0:root:/root:/bin/bash\n")
    plan = _write(tmp_path / "plan.yaml", _plan_doc(profile=str(other)))
    line = _one_line(["check", "--plan", plan], capsys)
    assert str(other) in line and "is not a cluster profile" in line, line
    assert "cluster ('str') must be a mapping" not in line, line


def test_relative_profile_resolves_against_the_plan_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "plans"
    (folder / "profiles").mkdir(parents=True)
    shutil.copy(H200, folder / "profiles" / "mine.yaml")
    plan = _write(folder / "plan.yaml", _plan_doc(profile="profiles/mine.yaml"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)                              # the cwd has no profiles/ folder
    pf = load_planfile(plan)
    assert pf.cluster.name == yaml.safe_load(H200.read_text())["name"]
    (elsewhere / "profiles").mkdir()                          # a same-named file in the cwd is not read
    (elsewhere / "profiles" / "mine.yaml").write_text("not: a profile\n")
    assert load_planfile(plan).cluster == pf.cluster


def test_plan_file_field_paths_have_no_document_prefix(tmp_path, capsys):
    doc = _plan_doc()
    doc["plan"]["world_size"] = 0
    line = _one_line(["check", "--plan", _write(tmp_path / "plan.yaml", doc)], capsys)
    assert "error: plan.world_size (0)" in line and "planfile." not in line, line
    doc = _plan_doc()
    doc["plan"]["bogus_knob"] = 1
    line = _one_line(["check", "--plan", _write(tmp_path / "plan2.yaml", doc)], capsys)
    assert "plan.bogus_knob" in line and "planfile." not in line, line


def test_plan_file_holding_a_list_names_the_file(tmp_path, capsys):
    p = tmp_path / "plan.yaml"
    p.write_text("- 1\n- 2\n")
    line = _one_line(["check", "--plan", p], capsys)
    assert str(p) in line and "is not a plan file" in line, line


@pytest.mark.parametrize("text, value", [("128k ", 131072), (" 128k", 131072), ("\t64k\n", 65536)])
def test_sizes_take_surrounding_whitespace(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["128 k", "1 28k", "128k k"])
def test_sizes_refuse_a_space_inside(text, capsys):
    with pytest.raises(InvalidPlan, match="is not a size"):
        parse_count(text, "--seq-len")
    line = _one_line(["check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", text], capsys)
    assert "--seq-len" in line, line


def test_validate_without_gpu_points_at_an_installed_module():
    import importlib

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from planner.runtime.validate import _require_gpu

    with pytest.raises(InvalidPlan) as e:
        _require_gpu("composed")
    msg = str(e.value)
    assert "tests/" not in msg, msg
    assert "planner.runtime.step_trace.trace_step" in msg, msg
    assert hasattr(importlib.import_module("planner.runtime.step_trace"), "trace_step")
    with pytest.raises(InvalidPlan) as e:   # an FSDP2 plan: its own tracer (trace_step refuses the stack)
        _require_gpu("fsdp2")
    assert "planner.runtime.fsdp2_trace.trace_fsdp2(" in str(e.value) and "tp = cp = 1" in str(e.value)
    assert hasattr(importlib.import_module("planner.runtime.fsdp2_trace"), "trace_fsdp2")
