"""MTP layers as a model knob (issue 10, item 13): Θ with and without them, in check and models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from planner.schema.io import load_model

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["deepseek-v3", "--gpus", "64", "--seq-len", "32k"]


def _run(*args) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_default_trains_mtp_and_prints_both_totals():
    m = load_model("deepseek-v3")
    assert m.mtp_layers == 1 and m.mtp_trained is True
    with_, without = m.param_counts(mtp=True)["total"], m.param_counts(mtp=False)["total"]
    assert with_ > without and m.param_counts()["total"] == with_
    doc = json.loads(_run("check", *ARGS, "--json").stdout)
    assert doc["params"] == {"num_params": with_, "with_mtp": with_, "without_mtp": without, "mtp_layers": 1,
                             "mtp_trained": True}
    assert doc["derived"]["num_params"] == with_
    text = _run("check", *ARGS).stdout
    assert f"Θ = {with_ / 1e9:.1f}B" in text and f"{without / 1e9:.1f}B without" in text


def test_no_mtp_trained_drops_them_from_theta_and_memory(tmp_path):
    on = json.loads(_run("check", *ARGS, "--json").stdout)
    off = json.loads(_run("check", *ARGS, "--no-mtp-trained", "--json").stdout)
    assert off["derived"]["num_params"] == on["params"]["without_mtp"]
    assert off["live_sets"]["persistent"]["max_bytes"] < on["live_sets"]["persistent"]["max_bytes"]
    assert off["plan"]["model"]["mtp_trained"] is False
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(off["plan"]))
    again = json.loads(_run("check", "--plan", str(path), "--json").stdout)
    assert again["peak_bytes"] == off["peak_bytes"] and again["params"]["mtp_trained"] is False


def test_flag_refused_on_a_model_without_mtp():
    res = _run("check", "olmoe-1b-7b", "--gpus", "8", "--seq-len", "32k", "--no-mtp-trained")
    assert res.returncode == 2 and "--no-mtp-trained" in res.stderr and "no" in res.stderr


def test_models_lists_both_totals():
    rows = {r["name"]: r for r in json.loads(_run("models", "--json").stdout)}
    ds = rows["deepseek-v3"]
    assert ds["params"] == ds["params_with_mtp"] > ds["params_without_mtp"]
    assert rows["olmoe-1b-7b"]["params_with_mtp"] == rows["olmoe-1b-7b"]["params_without_mtp"]
