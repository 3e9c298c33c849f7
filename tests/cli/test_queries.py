"""Queries people ask (issue 10, item 9) and units and words (item 10)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner import api

ROOT = Path(__file__).resolve().parents[2]
MODEL = "olmoe-1b-7b"


def _run(*args) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_min_gpus_is_the_smallest_power_of_two_that_fits():
    res = _run("min-gpus", MODEL, "--seq-len", "256k", "--json", "--no-progress")
    doc = json.loads(res.stdout)
    W = doc["min_gpus"]
    assert res.returncode == 0 and W is not None and W & (W - 1) == 0
    rows = {r["world_size"]: r for r in doc["tried"]}
    assert rows[W]["composed_fit"] > 0
    assert all(rows[w]["composed_fit"] == 0 for w in rows if w < W)
    if W > 1:   # one less doubling does not fit: check the default and the searched plans agree
        assert api.search(model=MODEL, gpus=W // 2, seq_len=1 << 18, top=1).result.top == []
    assert api.search(model=MODEL, gpus=W, seq_len=1 << 18, top=1).result.top
    if doc["baseline_min_gpus"] is not None:
        assert rows[doc["baseline_min_gpus"]]["fsdp2_fit"] > 0
    text = _run("min-gpus", MODEL, "--seq-len", "256k", "--no-progress").stdout
    assert f"fits from W = {W} GPU{'s' if W != 1 else ''} at" in text and "FSDP2 baseline" in text


def test_check_reports_step_time_and_tokens_per_step():
    doc = json.loads(_run("check", MODEL, "--gpus", "8", "--seq-len", "32k", "--json").stdout)
    assert doc["step_s"] > 0 and doc["tokens_per_step"] == 8 * doc["tokens_per_step_per_rank"]
    assert doc["tokens_per_step"] == 8 // doc["derived"]["seq_parallel"] * 32768
    assert doc["tokens_per_s_per_gpu"] == pytest.approx(doc["tokens_per_step_per_rank"] / doc["step_s"])
    four = json.loads(_run("check", MODEL, "--gpus", "8", "--seq-len", "32k", "--seqs-per-microbatch", "4",
                           "--json").stdout)
    assert four["plan"]["workload"]["seqs_per_microbatch"] == 4
    assert four["tokens_per_step"] == 4 * doc["tokens_per_step"] and four["step_s"] > doc["step_s"]
    text = _run("check", MODEL, "--gpus", "8", "--seq-len", "32k").stdout
    assert "s per optimizer step" in text and f"{doc['tokens_per_step']:,} tokens per step" in text


def test_sweep_global_batch_tokens_sets_accumulation():
    one = json.loads(_run("sweep", MODEL, "--gpus", "8", "--seq-lens", "32k", "--json", "--no-progress").stdout)
    big = json.loads(_run("sweep", MODEL, "--gpus", "8", "--seq-lens", "32k", "--global-batch-tokens", "4m",
                          "--json", "--no-progress").stdout)
    assert one[0]["stack"] == big[0]["stack"] == "composed"
    assert big[0]["tokens_per_s_per_gpu"] != one[0]["tokens_per_s_per_gpu"]


def test_max_batch_words_are_its_own():
    text = _run("max-batch", MODEL, "--gpus", "8", "--seq-len", "32k").stdout
    assert "max batch" in text and "per sequence group" in text and "max context" not in text
    assert "1 sequences" not in text and "the peak is not monotone in S" not in text


def test_seq_step_is_total_context():
    doc = json.loads(_run("max-context", MODEL, "--gpus", "8", "--seq-step", "64k", "--max-seq-len", "512k",
                          "--json").stdout)
    vals = np.array(doc["grid"]["values"])
    assert doc["seq_step"] == 65536 and vals[0] == 65536 and vals[-1] == 512 * 1024
    assert (np.diff(vals) == 65536).all()


def test_100k_is_shown_exactly():
    text = _run("check", MODEL, "--gpus", "8", "--seq-len", "100k").stdout
    assert "(102,400 tokens)" in text


def test_binding_live_set_is_the_one_that_grew_into_the_binding_phase():
    rep = api.check(model=MODEL, gpus=8, seq_len=1 << 15)
    ev = rep.evaluation
    grown = {ls: int(ev.live_set_bytes(ls)[rep.binding] - ev.live_set_bytes(ls).min()) for ls in
             ("persistent", "boundaries", "attention", "dispatch", "gathered", "vocab", "optimizer_step",
              "workspace") if ls in rep.to_json()["live_sets"]}
    assert rep.binding_live_set == max(grown, key=grown.get)
    assert grown.get("persistent", 0) == 0 or rep.binding_live_set != "persistent"
    assert rep.to_json()["largest_live_set"] == max(rep.to_json()["live_sets"],
                                                    key=lambda n: rep.to_json()["live_sets"][n]["bytes"])


def test_dense_head_formula_does_not_reuse_c():
    doc = json.loads(_run("check", MODEL, "--gpus", "8", "--seq-len", "32k", "--baseline", "--json").stdout)
    formulas = [t["formula"] for t in doc["live_sets"]["vocab"]["terms"]]
    assert any("V_c" in f for f in formulas) and not any("N·c" in f for f in formulas)


def test_max_context_names_the_degrees_it_holds_fixed_and_when_cp_is_one():
    """The baseline resolves ``cp`` at the first grid length (1): the header names the degrees and a
    line names ``--cp``, which raises gpt-oss-20b's baseline frontier 8× (30,720 → 245,760)."""
    lines = _run("max-context", "gpt-oss-20b", "--gpus", "8", "--baseline").stdout.splitlines()
    assert lines[0].endswith("(FSDP2 baseline, tp=1 cp=1 dp_shard=8 ep=8 fixed): max context 30k (30,720 tokens)")
    assert any(ln.startswith("cp = 1 (resolved at the first length)") and "--cp N" in ln for ln in lines)
    lines = _run("max-context", "gpt-oss-20b", "--gpus", "8", "--baseline", "--cp", "8").stdout.splitlines()
    assert lines[0].endswith("(FSDP2 baseline, tp=1 cp=8 dp_shard=1 ep=8 fixed): max context 240k (245,760 tokens)")
    assert not any(ln.startswith("cp = 1") for ln in lines)
    assert "(composed stack, D=8 E_p=8 P=8 fixed)" in _run("max-context", "gpt-oss-20b", "--gpus", "8").stdout
