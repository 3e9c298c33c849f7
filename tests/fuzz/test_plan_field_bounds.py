"""Plan-file fields whose bounds depend on the model or on each other: ``max_imports`` at most
``E − E/E_p``, strict integers, ``world_size`` against ``gpus_per_node``."""

from __future__ import annotations

import pytest
import yaml

from cli_lines import CLEAN_EXIT, one_line as _one_line  # noqa: F401
from planner import api, cli
from planner.errors import InvalidPlan
from planner.plans.llep import import_bound, resolve_max_imports
from planner.schema.plan import ComposedKnobs

GPT_OSS_BOUND = 32 - 32 // 8
"""gpt-oss-20b has E = 32 experts; at W = 8 the default E_p is 8."""




def _plan_file(tmp_path, model="gpt-oss-20b", gpus=8, seq_len=1 << 15, **plan_changes) -> str:
    pf = api.build_planfile(model=model, gpus=gpus, seq_len=seq_len)
    doc = pf.model_dump(mode="json")
    for k, v in plan_changes.items():
        if k in ComposedKnobs.model_fields:
            doc["plan"]["composed"][k] = v
        else:
            doc["plan"][k] = v
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# ---- max_imports ---------------------------------------------------------------------------------
def test_import_bound_is_the_foreign_experts():
    assert import_bound(32, 8) == GPT_OSS_BOUND
    assert import_bound(8, 2) == 4


@pytest.mark.parametrize("n", [GPT_OSS_BOUND + 1, 100_000])
def test_max_imports_above_the_bound_is_refused(n, capsys):
    line = _one_line(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "32k", "--max-imports", n], capsys)
    assert line.startswith(f"error: --max-imports ({n}) must be") and f"= {GPT_OSS_BOUND}" in line, line


def test_max_imports_above_the_bound_in_a_plan_file_is_refused(tmp_path, capsys):
    line = _one_line(["check", "--plan", _plan_file(tmp_path, max_imports=100_000)], capsys)
    assert line.startswith("error: plan.composed.max_imports (100000)") and f"= {GPT_OSS_BOUND}" in line, line


def test_max_imports_at_the_bound_gives_the_same_guarantee_as_any_larger_cap():
    """At ``E − E/E_p`` every foreign expert may be imported: the bound is no cap at all, so the
    peak there is the peak a 'no cap' plan has; below it the peak can only be lower or equal."""
    at = api.check(model="gpt-oss-20b", gpus=8, seq_len=1 << 15, overrides={"max_imports": GPT_OSS_BOUND})
    low = api.check(model="gpt-oss-20b", gpus=8, seq_len=1 << 15, overrides={"max_imports": 0})
    assert at.peak_bytes >= low.peak_bytes
    assert at.peak_bytes < 2 * low.peak_bytes, (at.peak_bytes, low.peak_bytes)


def test_default_max_imports_is_lowered_to_the_bound_on_few_experts():
    default = ComposedKnobs.model_fields["max_imports"].default
    assert resolve_max_imports(default, 4, 2, default) == import_bound(4, 2) == 2
    with pytest.raises(InvalidPlan, match="max_imports"):
        resolve_max_imports(default + 1, 4, 2, default)
    assert resolve_max_imports(100, 4, 1, default) == 100      # E_p = 1 imports nothing: inert


# ---- strict integers -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["8", "0x8", " 8"])
def test_quoted_number_for_an_int_in_a_plan_file_is_refused(value, tmp_path, capsys):
    line = _one_line(["check", "--plan", _plan_file(tmp_path, world_size=value)], capsys)
    assert "plan.world_size" in line and "not a string" in line, line


def test_quoted_number_in_a_nested_int_is_refused(tmp_path, capsys):
    line = _one_line(["check", "--plan", _plan_file(tmp_path, token_budget="4096")], capsys)
    assert "plan.composed.token_budget" in line and "not a string" in line, line


def test_yaml_ints_still_read(tmp_path, capsys):
    code = cli.main(["check", "--plan", _plan_file(tmp_path, world_size=8)])
    capsys.readouterr()
    assert code in (0, 1)


# ---- world_size against gpus_per_node ------------------------------------------------------------
@pytest.mark.parametrize("gpus, gpn, ok", [(8, 3, False), (12, 8, False), (6, 3, True), (2, 3, True),
                                           (16, 8, True), (3, 8, True)])
def test_world_size_fills_whole_nodes_or_part_of_one(gpus, gpn, ok, capsys):
    argv = ["check", "olmoe-1b-7b", "--gpus", gpus, "--seq-len", "8k", "--gpus-per-node", gpn]
    if ok:
        assert cli.main([str(a) for a in argv]) in (0, 1), capsys.readouterr().err
        capsys.readouterr()
    else:
        line = _one_line(argv, capsys)
        assert line.startswith(f"error: --gpus ({gpus}) must be") and f"gpus_per_node ({gpn})" in line, line
