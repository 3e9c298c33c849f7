"""What a new user met on output and input files: a closed pipe, a full disk or a closed standard
output never reads as a verdict (exit 0/1) or a traceback; JSON states no key twice, a ``.json``
output reads back; a usable capacity is never negative; a ``config.json`` with no folder in its path
gets a name; booleans take true or false; an existing file is read as a file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner import cli
from planner.errors import PIPE_CLOSED
from planner.schema.hf_import import default_profile_name
from planner.schema.io import read_structured, write_yaml_atomic

from cli_lines import one_line  # noqa: E402 (tests/: the shared one-line refusal)

HF_CONFIG = Path(__file__).resolve().parents[2] / "planner" / "profiles" / "hf-configs" / "olmoe-1b-7b-0924.json"
CHECK = ["check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "4k"]


def _shell(cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


PLANNER = f"{sys.executable} -m planner.cli"


def test_a_reader_that_closes_the_pipe_is_not_a_verdict():
    """``planner check … | head -1`` exited 1 ("does not fit") for a plan that fits: rich exits 1
    on a closed pipe. The explain table is long enough to outgrow the pipe's buffer."""
    r = _shell(f"{PLANNER} {' '.join(CHECK)} --explain | head -1 > /dev/null; echo ${{PIPESTATUS[0]}}")
    assert r.stdout.strip() == str(PIPE_CLOSED), r
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    r = _shell(f"{PLANNER} check --help | head -1 > /dev/null; echo ${{PIPESTATUS[0]}}")
    assert r.stdout.strip() == str(PIPE_CLOSED), r


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_a_full_disk_and_a_closed_stdout_give_one_line(extra):
    for redirect in ("> /dev/full", ">&-"):
        r = _shell(f"{PLANNER} {' '.join(CHECK + extra)} {redirect}")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (redirect, r)
        assert "fix: " in lines[0]


def test_json_states_no_key_twice(tmp_path, capsys):
    cfg = json.loads(HF_CONFIG.read_text())
    text = json.dumps(cfg)[:-1] + f', "hidden_size": {cfg["hidden_size"] * 2}}}'
    (tmp_path / "config.json").write_text(text)
    line = one_line(["check", str(tmp_path / "config.json"), "--gpus", "8", "--seq-len", "4k"], capsys)
    assert "'hidden_size'" in line and "states the key twice (JSON would keep the last)" in line


def test_a_json_output_reads_back(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert cli.main(["import-hf", str(HF_CONFIG), "-o", str(out)]) == 0
    assert read_structured(out)["hidden_size"] == json.loads(HF_CONFIG.read_text())["hidden_size"]
    assert cli.main(["check", str(out), "--gpus", "8", "--seq-len", "4k"]) == 0
    write_yaml_atomic(tmp_path / "p.json", {"a": [1, 2], "b": {"c": "d"}})
    assert json.loads((tmp_path / "p.json").read_text()) == {"a": [1, 2], "b": {"c": "d"}}
    write_yaml_atomic(tmp_path / "p.yaml", {"a": [1, 2]})
    assert yaml.safe_load((tmp_path / "p.yaml").read_text()) == {"a": [1, 2]}


def test_no_verdict_against_a_negative_capacity(tmp_path, capsys):
    line = one_line(CHECK + ["--hbm-gib", "1"], capsys)
    assert "leaves no usable memory" in line and "--hbm-gib" in line
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "planner/profiles/clusters/h200.yaml").read_text())
    doc["memory"]["cuda_context_bytes"]["value"] = doc["topology"]["hbm_bytes"] + 1
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    line = one_line(CHECK + ["--cluster", str(tmp_path / "c.yaml")], capsys)
    assert "cluster.topology.hbm_bytes" in line and "leaves no usable memory" in line


def test_a_config_json_without_a_folder_in_its_path_is_named(tmp_path, capsys):
    folder = tmp_path / "OLMoE-1B-7B"
    folder.mkdir()
    shutil.copy(HF_CONFIG, folder / "config.json")
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        assert default_profile_name("config.json") == default_profile_name("./config.json") == "OLMoE-1B-7B"
        assert cli.main(["check", "config.json", "--gpus", "8", "--seq-len", "4k"]) == 0
        assert capsys.readouterr().out.startswith("OLMoE-1B-7B on 8 ")
    finally:
        os.chdir(cwd)
    long = tmp_path / ("y" * 200)
    long.mkdir()
    assert default_profile_name(long / "config.json") == "config"
    assert default_profile_name(tmp_path / "my-model.json") == "my-model"


def test_a_boolean_field_takes_true_or_false(tmp_path, capsys):
    assert cli.main(["import-hf", str(HF_CONFIG), "-o", str(tmp_path / "m.yaml")]) == 0
    doc = yaml.safe_load((tmp_path / "m.yaml").read_text())
    capsys.readouterr()
    for bad in ("yes", "t", 1):
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**doc, "tie_embeddings": bad}))
        line = one_line(["check", str(tmp_path / "bad.yaml"), "--gpus", "8", "--seq-len", "4k"], capsys)
        assert line.startswith("error: model.tie_embeddings") and "must be true or false" in line


def test_an_existing_file_is_read_as_a_file(tmp_path, capsys):
    assert cli.main(["import-hf", str(HF_CONFIG), "-o", str(tmp_path / "mymodel")]) == 0
    shutil.copy(tmp_path / "mymodel", tmp_path / "mymodel.YAML")
    os.mkfifo(tmp_path / "fifo")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for ref in ("mymodel", "mymodel.YAML"):
            assert cli.main(["check", ref, "--gpus", "8", "--seq-len", "4k"]) == 0, capsys.readouterr().err
        capsys.readouterr()
        assert "not a regular file" in one_line(["check", "fifo", "--gpus", "8", "--seq-len", "4k"], capsys)
    finally:
        os.chdir(cwd)


def test_import_hf_names_the_config_in_a_folder_and_refuses_an_empty_output(tmp_path, capsys):
    shutil.copy(HF_CONFIG, tmp_path / "config.json")
    assert f"fix: pass {tmp_path / 'config.json'}" in one_line(["import-hf", str(tmp_path)], capsys)
    assert "is an empty path" in one_line(["import-hf", str(HF_CONFIG), "-o", ""], capsys)
