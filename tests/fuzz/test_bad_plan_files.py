"""Hypothesis fuzz over bad plan files: each gives exit 2 and one ``error:`` line, never a traceback."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import api, cli

FUZZ_EXAMPLES = 60
"""Generated bad files per strategy (kept small: each runs the CLI in-process)."""


@pytest.fixture(scope="module")
def good_doc():
    pf = api.build_planfile(model="olmoe-1b-7b", gpus=8, seq_len=8192)
    return pf.model_dump(mode="json")


def _run(tmp_path_factory, text: str, capsys) -> tuple[int, str]:
    path = tmp_path_factory.mktemp("fuzz") / "plan.yaml"
    path.write_text(text)
    code = cli.main(["check", "--plan", str(path)])
    return code, capsys.readouterr().err


def _assert_clean(code: int, errtxt: str) -> None:
    assert code == 2, errtxt
    assert "Traceback" not in errtxt
    lines = [ln for ln in errtxt.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("error:"), errtxt


NUMERIC_PATHS = [("workload", "seq_len"), ("plan", "world_size"), ("model", "hidden_size"),
                 ("model", "num_layers"), ("model", "vocab_size"), ("plan", "composed", "token_budget"),
                 ("plan", "composed", "staging_slots"), ("model", "num_heads")]
DEGREE_PATHS = [("plan", "composed", "expert_parallel"), ("plan", "composed", "seq_parallel"),
                ("plan", "composed", "vocab_parallel")]


def _set(doc, path, value):
    d = doc
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


settings_ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def _not_a_positive_int(v) -> bool:
    """pydantic's lax mode accepts 16.0 and "16" for an int field: those are valid input, not bad."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return True
    return not (f == f and f not in (float("inf"), float("-inf")) and f > 0 and f == int(f))


BAD_NUMBERS = st.one_of(st.integers(max_value=0), st.text(max_size=5), st.floats(allow_nan=True),
                        st.none()).filter(_not_a_positive_int)


@settings_
@given(path=st.sampled_from(NUMERIC_PATHS), value=BAD_NUMBERS)
def test_bad_numbers(good_doc, tmp_path_factory, capsys, path, value):
    doc = copy.deepcopy(good_doc)
    _set(doc, path, value)
    _assert_clean(*_run(tmp_path_factory, yaml.safe_dump(doc), capsys))


@settings_
@given(path=st.sampled_from(DEGREE_PATHS), value=st.sampled_from([3, 5, 6, 7, 9, 12, 16, 24, 1000]))
def test_impossible_degrees(good_doc, tmp_path_factory, capsys, path, value):
    doc = copy.deepcopy(good_doc)
    _set(doc, path, value)
    _assert_clean(*_run(tmp_path_factory, yaml.safe_dump(doc), capsys))


@settings_
@given(section=st.sampled_from(["", "model", "plan", "workload", "cluster", "plan.composed"]),
       key=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12))
def test_unknown_keys(good_doc, tmp_path_factory, capsys, section, key):
    doc = copy.deepcopy(good_doc)
    d = doc
    for k in filter(None, section.split(".")):
        d = d[k]
    if key in d:
        return
    d[key] = 1
    _assert_clean(*_run(tmp_path_factory, yaml.safe_dump(doc), capsys))


@settings_
@given(section=st.sampled_from(["model", "plan", "workload", "cluster"]), data=st.data())
def test_missing_fields(good_doc, tmp_path_factory, capsys, section, data):
    doc = copy.deepcopy(good_doc)
    required = {"model": ["name", "num_layers", "hidden_size", "vocab_size", "num_heads", "head_dim"],
                "plan": ["world_size"], "workload": ["seq_len"], "cluster": ["name", "topology", "memory"]}
    key = data.draw(st.sampled_from(required[section]))
    del doc[section][key]
    _assert_clean(*_run(tmp_path_factory, yaml.safe_dump(doc), capsys))


@settings_
@given(text=st.text(max_size=200))
def test_garbage_text(tmp_path_factory, capsys, text):
    code, errtxt = _run(tmp_path_factory, text, capsys)
    _assert_clean(code, errtxt)


def test_truncated_yaml(good_doc, tmp_path_factory, capsys):
    text = yaml.safe_dump(good_doc)
    for cut in range(10, len(text), max(1, len(text) // 40)):
        code, errtxt = _run(tmp_path_factory, text[:cut] + "\n  - ]:", capsys)
        _assert_clean(code, errtxt)
