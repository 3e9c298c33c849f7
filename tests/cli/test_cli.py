"""CLI contract (DESIGN §10): what each command passes on, its exit codes and its JSON keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner import api, cli
from planner.units import GiB

JSON_KEYS = {"fits", "peak_bytes", "capacity_bytes", "headroom_bytes", "binding_phase", "binding_live_set",
             "binding_terms", "assumed", "provisional", "live_sets", "host", "plan"}


class _Stop(Exception):
    pass


def _capture(monkeypatch, name="check"):
    seen = {}

    def fake(**kw):
        seen.update(kw)
        raise _Stop

    monkeypatch.setattr(api, name, fake)
    return seen


def test_check_forwards_parsed_flags(monkeypatch):
    seen = _capture(monkeypatch)
    with pytest.raises(_Stop):
        cli.app(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--token-budget", "8k",
                 "--bucket-params", "200M", "--sco-host-gib", "8", "--routing", "80/16", "--dispatch", "llep",
                 "--vocab-blocks", "4", "--dispatch-bound", "expected"], standalone_mode=False)
    assert seen["model"] == "gpt-oss-20b" and seen["gpus"] == 8 and seen["seq_len"] == 131072
    ov = seen["overrides"]
    assert ov["token_budget"] == 8192 and ov["bucket_params"] == 200_000_000
    assert ov["sco_host_bytes"] == 8 * GiB and ov["routing"] == "80/16" and ov["dispatch"] == "llep"
    assert ov["vocab_blocks"] == 4 and ov["dispatch_bound"] == "expected"
    assert "stack" not in ov


def test_baseline_flags_select_fsdp2(monkeypatch):
    seen = _capture(monkeypatch)
    with pytest.raises(_Stop):
        cli.app(["check", "gpt-oss-20b", "--gpus", "16", "--seq-len", "1m", "--baseline", "--tp", "2",
                 "--cp", "4", "--expert-parallel", "2", "--ac", "selective", "--cpu-offload"], standalone_mode=False)
    ov = seen["overrides"]
    assert ov["stack"] == "fsdp2" and ov["tp"] == 2 and ov["cp"] == 4 and ov["expert_parallel"] == 2
    assert ov["ac"] == "selective" and ov["cpu_offload"] is True and seen["seq_len"] == 1 << 20
    assert seen["min_headroom"] is None                 # check's own flag, not a build argument
    pf = api.build_planfile(**{k: v for k, v in seen.items() if k not in ("overrides", "min_headroom")}, overrides=ov)
    assert pf.plan.baseline.ep == 2 and pf.plan.stack == "fsdp2"   # --expert-parallel means ep here


@pytest.mark.parametrize("argv, code", [
    (["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "12x"], 2),
    (["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--expert-parallel", "3"], 2),
    (["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--seq-parallel", "16"], 2),
    (["check", "no-such-model", "--gpus", "8", "--seq-len", "128k"], 2),
    (["check", "gpt-oss-20b", "--seq-len", "128k"], 2),
    (["check", "--plan", "/nonexistent/plan.yaml"], 2),
    (["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k", "--routing", "80/"], 2),
    (["check", "gpt-oss-20b", "--gpus", "0", "--seq-len", "128k"], 2),
])
def test_invalid_input_exits_2_with_one_line(argv, code, capsys):
    assert cli.main(argv) == code
    errtxt = capsys.readouterr().err.strip()
    assert "Traceback" not in errtxt
    assert errtxt.startswith("error:") and len(errtxt.splitlines()) == 1, errtxt


def test_internal_error_exits_3(monkeypatch, capsys):
    def boom(**kw):
        raise RuntimeError("bug")

    monkeypatch.setattr(api, "check", boom)
    assert cli.main(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "128k"]) == 3
    assert "Traceback" in capsys.readouterr().err


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("argv", [["gpt-oss-20b", "--gpus", "8", "--seq-len", "128k"],
                                  ["moe-667b", "--gpus", "64", "--seq-len", "1m"]])
def test_real_models_json(argv):
    res = _run("check", *argv, "--json")
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    assert JSON_KEYS <= set(doc)
    assert doc["fits"] == (res.returncode == 0)
    assert doc["headroom_bytes"] == doc["capacity_bytes"] - doc["peak_bytes"]
    assert doc["peak_bytes"] == max(ls["max_bytes"] for ls in doc["live_sets"].values()) or doc["peak_bytes"] >= 0
    for ls in doc["live_sets"].values():
        assert {"bytes", "max_bytes", "terms"} <= set(ls)
        for t in ls["terms"]:
            assert {"name", "bytes", "formula", "phases"} <= set(t)
    assert {"bytes", "capacity_bytes", "fits"} <= set(doc["host"])
    assert len(doc["binding_terms"]) == 3


def test_plan_file_roundtrip(tmp_path):
    """The resolved plan in --json, written back as a plan file, gives the same verdict."""
    import yaml

    res = _run("check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "64k", "--json")
    doc = json.loads(res.stdout)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc["plan"]))
    res2 = _run("check", "--plan", str(path), "--json")
    doc2 = json.loads(res2.stdout)
    assert doc2["peak_bytes"] == doc["peak_bytes"] and doc2["plan"] == doc["plan"]
    res3 = _run("check", "--plan", str(path), "--seq-len", "128k", "--json")
    assert json.loads(res3.stdout)["plan"]["workload"]["seq_len"] == 131072


def test_models_lists_shipped_profiles():
    res = _run("models", "--json")
    names = {r["name"] for r in json.loads(res.stdout)}
    assert {"gpt-oss-20b", "deepseek-v3", "moe-667b", "moe-120b", "moe-241b"} <= names
    assert len(names) == 14


def test_frontier_commands_forward_and_exit(monkeypatch):
    seen = _capture(monkeypatch, "max_context")
    with pytest.raises(_Stop):
        cli.app(["max-context", "gpt-oss-20b", "--gpus", "8", "--seq-step", "2k", "--max-seq-len", "4m",
                 "--token-budget", "8k"], standalone_mode=False)
    assert seen["seq_step"] == 2048 and seen["max_seq_len"] == 4 << 20 and seen["gpus"] == 8
    assert seen["overrides"]["token_budget"] == 8192


def test_max_context_json_real():
    res = _run("max-context", "olmoe-1b-7b", "--gpus", "8", "--max-seq-len", "256k", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == (0 if doc["max_seq_len"] else 1)
    fits = doc["grid"]["fits"]
    assert doc["max_seq_len"] == max(v for v, ok in zip(doc["grid"]["values"], fits) if ok)
