"""Errors and help (issue 10, item 11): JSON errors, --version, defaults in --help, a model folder,
import-hf on the planner's own files, calibrate's default output path."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner import __version__

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, cwd=None, env_extra=None) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp/planner-home", "COLUMNS": "200"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60)


@pytest.mark.parametrize("argv, field", [
    (["check", "no-such-model", "--gpus", "8", "--seq-len", "32k"], "MODEL"),
    (["check", "olmoe-1b-7b", "--gpus", "x", "--seq-len", "32k"], "--gpus"),
    (["check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "12x"], "--seq-len"),
    (["search", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "32k", "--stack", "nope"], "--stack"),
    (["max-context", "olmoe-1b-7b", "--gpus", "8", "--hbm-gib", "-3"], "--hbm-gib"),
])
def test_errors_are_json_under_json(argv, field):
    res = _run(*argv, "--json")
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    assert set(doc) == {"error", "field", "exit_code"} and doc["exit_code"] == 2 and doc["field"] == field
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_version():
    res = _run("--version")
    assert res.returncode == 0 and res.stdout.strip().endswith(__version__)


@pytest.mark.parametrize("cmd", ["check", "search", "sweep", "max-context", "max-batch", "min-gpus", "calibrate",
                                 "import-hf"])
def test_help_shows_every_flags_default(cmd):
    text = _run(cmd, "--help").stdout
    flag = re.compile(r"^│\s*\*?\s*(-\w\s+)?--(?!help\b)")
    blocks = re.split(r"\n(?=│\s*\*?\s*(?:-\w\s+)?--)", text)
    flags = [b for b in blocks if flag.match(b)]
    assert flags
    for b in flags:
        assert "[default:" in b or "[required]" in b, b.splitlines()[0]


def test_help_defaults_come_from_the_schema():
    from planner.schema.plan import ComposedKnobs

    text = _run("check", "--help").stdout
    assert f"[default: ({ComposedKnobs.model_fields['token_budget'].default})]" in text
    assert "[default: (h200)]" in text


def test_calibrate_default_out_does_not_depend_on_cwd(tmp_path):
    a = _run("calibrate", "--help", cwd=tmp_path).stdout
    b = _run("calibrate", "--help", cwd=ROOT).stdout
    assert a == b and "/tmp/planner-home/.config/moe-planner/clusters/measured.yaml" in a.replace("│", "").replace(
        " ", "").replace("\n", "") or "moe-planner" in a


def test_model_folder_says_pass_config_json(tmp_path):
    src = ROOT / "planner" / "profiles" / "hf-configs" / "olmoe-1b-7b-0924.json"
    (tmp_path / "config.json").write_text(src.read_text())
    res = _run("check", str(tmp_path), "--gpus", "8", "--seq-len", "32k")
    assert res.returncode == 2 and f"pass {tmp_path / 'config.json'}" in res.stderr


@pytest.mark.parametrize("path, words", [
    ("planner/profiles/models/olmoe-1b-7b.yaml", "already a planner model profile"),
    ("planner/profiles/clusters/h200.yaml", "cluster profile"),
])
def test_import_hf_on_planner_files_says_what_they_are(path, words):
    res = _run("import-hf", str(ROOT / path))
    assert res.returncode == 2 and words in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_import_hf_on_a_plan_file(tmp_path):
    doc = json.loads(_run("check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "32k", "--json").stdout)["plan"]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    res = _run("import-hf", str(p))
    assert res.returncode == 2 and "plan file" in res.stderr and "--plan" in res.stderr
