"""A YAML file that states a mapping key twice (YAML would keep the last silently) and a file with
nothing in it are refused with one line naming the file (and the key), in plan, model and cluster
files alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli_lines import CLEAN_EXIT, one_line as _one_line  # noqa: F401
from planner import api, cli
from planner.errors import InvalidPlan
from planner.schema.documents import read_structured

PROFILES = Path(__file__).resolve().parents[2] / "planner" / "profiles"




def _plan_text() -> str:
    pf = api.build_planfile(model="olmoe-1b-7b", gpus=8, seq_len=8192)
    return yaml.safe_dump(pf.model_dump(mode="json"), sort_keys=False)


def _with_duplicate(text: str, key: str) -> str:
    """``text`` (a block-style mapping) with its top-level ``key`` line stated a second time."""
    doc = yaml.safe_load(text)
    return text + yaml.safe_dump({key: doc[key]}, sort_keys=False)


def _duplicate_cases(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(_with_duplicate(_plan_text(), "workload"))
    model = tmp_path / "model.yaml"
    model.write_text(_with_duplicate((PROFILES / "models" / "gpt-oss-20b.yaml").read_text(), "num_layers"))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(_with_duplicate((PROFILES / "clusters" / "h200.yaml").read_text(), "name"))
    return {
        "plan": (["check", "--plan", plan], plan, "workload"),
        "model": (["check", model, "--gpus", "8", "--seq-len", "32k"], model, "num_layers"),
        "cluster": (["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "32k", "--cluster", cluster],
                    cluster, "name"),
    }


@pytest.mark.parametrize("kind", ["plan", "model", "cluster"])
def test_duplicate_top_level_key_is_refused(kind, tmp_path, capsys):
    argv, path, key = _duplicate_cases(tmp_path)[kind]
    line = _one_line(argv, capsys)
    assert str(path) in line and repr(key) in line and "twice" in line, line


def test_duplicate_nested_key_names_both_lines(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("plan:\n  world_size: 8\n  world_size: 16\n")
    with pytest.raises(InvalidPlan) as e:
        read_structured(p)
    msg = str(e.value)
    assert "'world_size'" in msg and "lines 2 and 3" in msg and str(p) in msg, msg


def test_merge_key_override_is_still_allowed(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("base: &B {a: 1, b: 2}\nderived:\n  <<: *B\n  a: 3\n")
    assert read_structured(p)["derived"] == {"a": 3, "b": 2}


@pytest.mark.parametrize("text", ["", "\n\n", "# a comment only\n# and another\n", "null\n"],
                         ids=["zero_bytes", "blank_lines", "comments_only", "null"])
def test_empty_plan_file_says_it_is_empty(text, tmp_path, capsys):
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    line = _one_line(["check", "--plan", p], capsys)
    assert str(p) in line and "is empty" in line, line
