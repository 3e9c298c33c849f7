"""A new user's mistakes, each answered by one line that names the field, the value and the fix
(exit 2, no traceback): an unknown key anywhere in a plan file, a plan file or a model given as
``--cluster``, a cluster reference with a stray key or a bare name, a binary file, a control
character, a name or an output path longer than the file system takes, a long unknown option;
``--help`` shows no value type beside a flag; counts agree with their noun (``1 token``)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from planner import api, cli
from planner.errors import MAX_TEXT_CHARS

from cli_lines import one_line  # noqa: E402 (tests/: the shared one-line refusal)

LONG_NAME = "x" * 300
"""A name longer than the 255 bytes a Linux file name may have."""
MAX_LINE_CHARS = 3 * MAX_TEXT_CHARS
"""An error line repeats at most MAX_TEXT_CHARS of its problem and of its fix, and 120 of its field
and value: three times MAX_TEXT_CHARS bounds it."""
HF_CONFIG = Path(__file__).resolve().parents[2] / "planner" / "profiles" / "hf-configs" / "olmoe-1b-7b-0924.json"


def _one_line(argv, capsys) -> str:
    """``cli_lines.one_line``, and the line names a fix within ``MAX_LINE_CHARS``."""
    line = one_line(argv, capsys)
    assert "; fix: " in line and len(line) <= MAX_LINE_CHARS, line[:300]
    return line


@pytest.fixture(scope="module")
def plan_doc() -> dict:
    return api.build_planfile(model="olmoe-1b-7b", gpus=8, seq_len=8192).model_dump(mode="json")


def _plan(tmp_path: Path, doc: dict, *path, value=None, name="plan.yaml") -> Path:
    """``doc`` with ``value`` set at ``path`` (nothing changed without a path), written as YAML."""
    doc = copy.deepcopy(doc)
    if path:
        at = doc
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
    out = tmp_path / name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


# ---- unknown keys ---------------------------------------------------------------------------------
def test_unknown_top_level_key_names_the_plan_file_and_its_keys(tmp_path, plan_doc, capsys):
    line = _one_line(["check", "--plan", _plan(tmp_path, plan_doc, "bogus", value=1)], capsys)
    assert line.startswith("error: bogus (1) is not a known key of the plan file; fix: remove it"), line
    assert "schema_version, model, cluster, workload, plan" in line, line
    assert "in bogus" not in line, line


def test_unknown_nested_key_names_its_section_and_the_close_spelling(tmp_path, plan_doc, capsys):
    line = _one_line(["check", "--plan", _plan(tmp_path, plan_doc, "workload", "seqlen", value=8192)], capsys)
    assert line.startswith("error: workload.seqlen (8192) is not a known key of workload"), line
    assert "did you mean seq_len?" in line, line
    line = _one_line(["check", "--plan", _plan(tmp_path, plan_doc, "plan", "composed", "bogus", value=1)], capsys)
    assert "plan.composed.bogus (1) is not a known key of plan.composed" in line and "token_budget" in line, line


def test_unknown_key_in_a_cluster_reference_is_refused(tmp_path, plan_doc, capsys):
    doc = copy.deepcopy(plan_doc)
    doc["cluster"] = {"profile": "h200", "bogus": 1}
    line = _one_line(["check", "--plan", _plan(tmp_path, doc)], capsys)
    assert line.startswith("error: cluster.bogus (1) is not a known key of a cluster reference"), line
    assert "profile, sha256, topology" in line, line


def test_max_batch_below_one_sequence_is_refused(capsys):
    """A cap below one sequence reported a batch above the cap; now one line names the smallest batch."""
    line = _one_line(["max-batch", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--max-tokens", "100k"], capsys)
    assert line.startswith("error: --max-tokens (102400) must be >= --seq-len (131072)"), line


@pytest.mark.parametrize("topology", [5, "abc", None, [], ["hbm_bytes"]])
@pytest.mark.parametrize("command", [["check"], ["max-context"], ["check", "--cluster", "h100", "--json"]])
def test_a_cluster_reference_topology_that_is_no_mapping_is_refused(topology, command, tmp_path, plan_doc, capsys):
    """A hand-edited ``cluster.topology`` that is not a mapping: one line, exit 2 (it was a TypeError)."""
    doc = copy.deepcopy(plan_doc)
    doc["cluster"] = {"profile": "h100", "topology": topology}
    line = _one_line([command[0], "--plan", _plan(tmp_path, doc), *command[1:]], capsys)
    assert line.startswith("error: cluster.topology (") and "must be a mapping of topology fields" in line, line


@pytest.mark.parametrize("key, name, start, fix", [
    ("model", "gpt-oss-20b", "model ('gpt-oss-20b') must be the model's fields, not a profile name",
     "planner search gpt-oss-20b --gpus W --seq-len S --out plan.yaml"),
    ("cluster", "h200", "cluster ('h200') must be a mapping", "cluster: {profile: h200}"),
])
def test_bare_name_in_a_plan_file_says_how_to_write_it(tmp_path, plan_doc, capsys, key, name, start, fix):
    doc = copy.deepcopy(plan_doc)
    doc[key] = name
    line = _one_line(["check", "--plan", _plan(tmp_path, doc)], capsys)
    assert line.startswith(f"error: {start}"), line
    assert fix in line, line


# ---- a file of one kind given where another is read -------------------------------------------------
def test_plan_file_given_as_cluster_is_named(tmp_path, plan_doc, capsys):
    plan = _plan(tmp_path, plan_doc)
    line = _one_line(["check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "8k", "--cluster", plan], capsys)
    assert line.startswith(f"error: --cluster ('{plan}') is a plan file, not a cluster profile"), line
    assert f"--plan {plan}" in line and "cluster.name" not in line, line


@pytest.mark.parametrize("kind", ["model profile", "hf config"])
def test_model_given_as_cluster_is_named(kind, tmp_path, plan_doc, capsys):
    if kind == "hf config":
        path = HF_CONFIG
    else:
        path = tmp_path / "model.yaml"
        path.write_text(yaml.safe_dump(plan_doc["model"], sort_keys=False))
    line = _one_line(["search", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "8k", "--cluster", path], capsys)
    assert line.startswith(f"error: --cluster ('{path}') is a model"), line
    assert "not a cluster profile" in line and "is missing" not in line, line


# ---- what a file holds --------------------------------------------------------------------------
def test_binary_file_is_named_as_binary(tmp_path, capsys):
    blob = tmp_path / "plan.yaml"
    blob.write_bytes(bytes(range(256)) * 4)
    line = _one_line(["check", "--plan", blob], capsys)
    assert line.startswith(f"error: {blob} ('a NUL byte at offset 0') is a binary file"), line
    line = _one_line(["check", blob, "--gpus", "8", "--seq-len", "8k"], capsys)
    assert "is a binary file" in line, line


def test_control_character_is_named_with_its_line(tmp_path, capsys):
    bad = tmp_path / "plan.yaml"
    bad.write_text("schema_version: 1\nplan: \x07\n")
    line = _one_line(["check", "--plan", bad], capsys)
    assert line.startswith(f"error: {bad} ('line 2') is not valid YAML: it holds the control character #x0007"), line


@pytest.mark.parametrize("path, value, problem", [
    (("plan", "world_size"), [8], "must be an integer"),
    (("plan", "composed"), [1], "must be a mapping"),
    (("plan", "composed", "dispatch"), "foo", "must be one of 'ep', 'llep' or 'pipelined_llep'"),
])
def test_wrong_type_says_what_the_field_must_be(path, value, problem, tmp_path, plan_doc, capsys):
    line = _one_line(["check", "--plan", _plan(tmp_path, plan_doc, *path, value=value)], capsys)
    assert line.startswith(f"error: {'.'.join(path)} ({value!r}) {problem}; fix: "), line
    assert "correct the value" not in line, line


# ---- very long values ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, field", [
    (["check", LONG_NAME, "--gpus", "8", "--seq-len", "8k"], "MODEL"),
    (["check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "8k", "--cluster", LONG_NAME], "--cluster"),
    (["search", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "8k", "--out", f"/tmp/{LONG_NAME}.yaml"], "--out"),
    (["sweep", "olmoe-1b-7b", "--gpus", "8", "--seq-lens", "8k", "--csv", f"/tmp/{LONG_NAME}/s.csv"], "--csv"),
])
def test_name_longer_than_the_file_system_takes_exits_2(argv, field, capsys):
    line = _one_line(argv, capsys)
    assert line.startswith(f"error: {field} ('"), line
    assert "xxxxxxxxxx" in line and "more characters" in line, line


def test_long_unknown_option_stays_one_short_line(capsys):
    line = _one_line(["check", "olmoe-1b-7b", "--" + "y" * 100_000], capsys)
    assert line.startswith("error: No such option: --yyyy") and "more characters" in line, line[:200]


# ---- help and counts ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, flag_lines", [
    (["--help"], ("--version", "--help")),
    (["check", "--help"], ("--json", "--explain", "--baseline", "--help")),
])
def test_help_shows_no_value_type_beside_a_flag(argv, flag_lines, capsys):
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    for flag in flag_lines:
        rows = [ln for ln in text.splitlines() if f"│ {flag} " in ln]
        assert rows and all("<bool>" not in r for r in rows), (flag, rows)
    if argv[0] == "check":      # an option that takes a value keeps its type
        assert any("--gpus" in ln and "<int>" in ln for ln in text.splitlines())


@pytest.mark.parametrize("argv, singular, plural", [
    (["check", "olmoe-1b-7b", "--gpus", "1", "--seq-len", "1"],
     ("S = 1 (1 token)", "host RAM per node (1 rank)", "· 1 token per step"), ("1 tokens", "1 ranks")),
    (["max-context", "olmoe-1b-7b", "--gpus", "1", "--max-seq-len", "1", "--seq-step", "1"],
     ("on 1 GPU (", "max context 1 (1 token)", "scanned 1 grid point;"), ("1 GPUs", "1 tokens", "1 grid points")),
    (["max-batch", "olmoe-1b-7b", "--gpus", "1", "--seq-len", "1k", "--max-tokens", "1k"],
     ("1 sequence of", "scanned 1 batch size;"), ("1 sequences", "1 batch sizes")),
])
def test_counts_agree_with_their_noun(argv, singular, plural, capsys):
    assert cli.main(argv) in (0, 1)
    text = " ".join(capsys.readouterr().out.split())
    for s in singular:
        assert s in text, (s, text[:400])
    for p in plural:
        assert p not in text, (p, text[:400])
    assert "step: step time" not in text


# ---- Ctrl-C during a command ----------------------------------------------------------------------
def test_ctrl_c_during_a_command_exits_130_with_one_line_and_no_file(tmp_path, monkeypatch, capsys):
    import importlib

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module("planner.api.search"), "build", interrupted)
    out = tmp_path / "plan.yaml"
    code = cli.main(["search", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "8k", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 130, err
    assert [ln for ln in err.splitlines() if ln.strip()] == ["interrupted"], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, value", [(["--version", "3"], "'3'"), (["--version", "check", "x"], "'check x'")])
def test_version_takes_no_value(argv, value, capsys):
    line = _one_line(argv, capsys)
    assert line.startswith(f"error: --version ({value}) takes no value"), line
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("planner (moe-planner) ")


@pytest.mark.parametrize("text, where, key, kind", [
    ("1: 2\n", "top level", "key 1", "is an integer"),
    ("on: 1\n", "top level", "key True", "is a boolean"),
    ("plan:\n  null: 8\n", "plan", "key None", "is null"),
])
def test_non_string_key_is_refused_not_a_traceback(text, where, key, kind, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    line = _one_line(["check", "--plan", plan], capsys)
    assert line.startswith(f"error: plan.yaml: {where} ('{key}') {kind}"), line


def test_zero_experts_in_a_hf_config_is_named_in_the_warning(tmp_path, capsys):
    import json

    config = json.loads(HF_CONFIG.read_text())
    config["num_experts"] = 0
    src = tmp_path / "config.json"
    src.write_text(json.dumps(config))
    assert cli.main(["import-hf", str(src), "-o", str(tmp_path / "m.yaml")]) == 0
    err = capsys.readouterr().err
    assert "warning: config.num_experts is 0: imported as a dense model" in err, err


def test_output_through_a_link_to_a_pipe_is_named_as_a_stream(tmp_path, capsys):
    import os

    r, w = os.pipe()
    try:
        link = tmp_path / "stdout"                  # as /dev/stdout is when the output is piped
        link.symlink_to(f"/proc/self/fd/{w}")
        line = _one_line(["import-hf", HF_CONFIG, "-o", link], capsys)
        assert line.startswith(f"error: --output ('{link}') is a link to a stream"), line
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("command", ["check", "validate"])
@pytest.mark.parametrize("kind", ["model profile", "cluster profile"])
def test_profile_given_as_a_plan_file_is_named(command, kind, tmp_path, plan_doc, capsys):
    path = tmp_path / "file.yaml"
    if kind == "model profile":
        path.write_text(yaml.safe_dump(plan_doc["model"], sort_keys=False))
        what = "is a model (a profile or a Hugging Face config), not a plan file"
    else:
        path.write_text(yaml.safe_dump(plan_doc["cluster"], sort_keys=False))
        what = "is a cluster profile, not a plan file"
    argv = ["check", "--plan", path] if command == "check" else ["validate", path]
    line = _one_line(argv, capsys)
    assert line.startswith(f"error: {path} ('a {kind.split()[0]}") and what in line, line
    assert "is missing" not in line, line


def test_validate_given_a_model_name_says_to_write_a_plan(capsys):
    line = _one_line(["validate", "olmoe-1b-7b"], capsys)
    assert line.startswith("error: PLAN ('olmoe-1b-7b') is a model name, not a plan file"), line
    assert "planner search olmoe-1b-7b" in line and "--out plan.yaml" in line, line


@pytest.mark.parametrize("argv", [["models"], ["check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "8k"]])
def test_profiles_override_naming_no_folder_is_refused(argv, tmp_path, monkeypatch, capsys):
    from planner.schema import profiles

    missing = tmp_path / "no-profiles"
    monkeypatch.setenv("MOE_PLANNER_PROFILES", str(missing))
    monkeypatch.setattr(profiles, "PROFILES_DIR", missing)     # as the variable sets it at import
    line = _one_line(argv, capsys)
    assert line.startswith(f"error: MOE_PLANNER_PROFILES ('{missing}') names no folder of profiles"), line


@pytest.mark.parametrize("name", ["a[/]b", "[bold red]x", "qwen [v2]"])
def test_a_name_that_looks_like_markup_prints_as_written(name, tmp_path, plan_doc, capsys):
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({**plan_doc["model"], "name": name}, sort_keys=False))
    assert cli.main(["check", str(model), "--gpus", "8", "--seq-len", "8k"]) in (0, 1)
    assert capsys.readouterr().out.startswith(f"{name} on 8 × ")
    assert cli.main(["max-context", str(model), "--gpus", "8", "--max-seq-len", "16k"]) in (0, 1)
    assert capsys.readouterr().out.startswith(f"{name} on 8 GPUs (")


def test_an_output_path_that_looks_like_markup_is_reported_as_written(tmp_path, capsys):
    out = tmp_path / "a[/]b.yaml"
    assert cli.main(["import-hf", str(HF_CONFIG), "-o", str(out)]) == 0
    assert f"wrote {out}: " in capsys.readouterr().err and out.is_file()


def test_a_flag_not_given_reads_none_given(capsys):
    line = _one_line(["check", "olmoe-1b-7b", "--gpus", "8"], capsys)
    assert line == "error: --seq-len (none given) is required without --plan; fix: add e.g. --seq-len 128k", line


def test_a_context_beyond_the_released_one_is_a_warning_in_text_and_json(capsys):
    """``S`` above the model's ``max_position_embeddings`` fits or not as any ``S`` does; the note
    that the model may need context extension is one ``warning:`` line and in ``--json``'s
    ``warnings`` (it was printed only by the text view)."""
    import json

    rc = cli.main(["check", "qwen3-30b-a3b", "--gpus", "16", "--seq-len", "256k", "--json"])
    out, err = capsys.readouterr()
    note = "S = 262,144 exceeds the model's released context (40,960 tokens)"
    assert rc in (0, 1) and any(w.startswith(note) for w in json.loads(out)["warnings"])
    assert [ln for ln in err.splitlines() if note in ln] == [f"warning: {note}: the memory verdict holds, "
                                                            "the model may need context extension"]
    rep = api.check(model="qwen3-30b-a3b", gpus=16, seq_len=32768)
    assert not [w for w in rep.warnings if "released context" in w]
