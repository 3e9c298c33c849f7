"""``search --out --stack``, the ranking and collapse rule, why the closest plan fails, and the
cluster named by reference in plan files (issue 10, items 7 and 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner import api
from planner.schema.cluster_ref import cluster_checksum
from planner.schema.io import load_cluster
from planner.search.rank import collapse, rank_key
from planner.units import GiB

ROOT = Path(__file__).resolve().parents[2]
MODEL, W, S = "olmoe-1b-7b", "4", "32k"


def _run(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


@pytest.fixture(scope="module")
def report():
    return api.search(model=MODEL, gpus=int(W), seq_len=32768, top=50)


def test_ranking_is_strict_and_collapsed(report):
    top = report.result.top
    assert len(top) >= 3
    keys = [(c.step_s / c.tokens_per_step_per_rank, c.peak_bytes, c.host_bytes) for c in top]
    assert keys == sorted(keys), "ranked by seconds per token, then peak, then host bytes"
    classes = {(c.plan.composed.dispatch, c.plan.composed.vocab, c.plan.composed.optimizer,
                c.plan.composed.checkpoint, c.step_s / c.tokens_per_step_per_rank, c.peak_bytes) for c in top}
    assert len(classes) == len(top), "no two listed plans are equivalent"


SAME_RATIO_REL = 1e-12
"""Two float routes to one ratio (tokens/s over tokens/s, step over step) agree to this."""


def test_plans_that_train_different_tokens_are_ranked_per_token(report):
    """Without ``--global-batch-tokens`` a step is one micro-step, whose tokens differ between plans
    (``W/D`` sequences): the rank and the speedup are per token, not per step."""
    r = report.result
    top = r.top
    assert len({c.tokens_per_step_per_rank for c in top}) >= 2, "the listed plans differ in tokens per step"
    assert any(a.step_s > b.step_s for a, b in zip(top, top[1:])), \
        "a longer step that trains more tokens ranks first: step time alone would order these otherwise"
    tps = [c.tokens_per_step_per_rank / c.step_s for c in top]
    assert all(a >= b * (1 - SAME_RATIO_REL) for a, b in zip(tps, tps[1:])), "tokens/s/GPU never rises down the list"
    assert r.speedup == pytest.approx(top[0].tokens_per_s_per_gpu / r.baseline.tokens_per_s_per_gpu,
                                      rel=SAME_RATIO_REL)
    assert r.baseline.tokens_per_step_per_rank != top[0].tokens_per_step_per_rank


def test_at_a_fixed_global_batch_the_rank_is_the_step_time():
    r = api.search(model=MODEL, gpus=int(W), seq_len=32768, top=20, global_batch_tokens=int(W) * 32768).result
    assert {c.tokens_per_step_per_rank for c in r.top} == {r.baseline.tokens_per_step_per_rank} == {32768.0}
    steps = [c.step_s for c in r.top]
    assert steps == sorted(steps)
    assert r.speedup == pytest.approx(r.baseline.step_s / r.top[0].step_s, rel=SAME_RATIO_REL)


def test_collapse_keeps_the_least_host_representative():
    rows = [(1.0, 10, 7, ("a",), (2,), None, 0), (1.0, 10, 5, ("a",), (3,), None, 1),
            (1.0, 10, 5, ("b",), (1,), None, 2), (0.5, 20, 9, ("a",), (9,), None, 3)]
    kept = collapse(rows)
    assert [r[6] for r in kept] == [3, 1, 2]
    assert kept == sorted(kept, key=rank_key)


@pytest.mark.parametrize("stack", ["best", "composed", "fsdp2"])
def test_out_writes_the_requested_stack_and_check_accepts_it(stack, tmp_path, report):
    out = tmp_path / "plan.yaml"
    res = _run("search", MODEL, "--gpus", W, "--seq-len", S, "--stack", stack, "--out", str(out), "--no-progress",
               "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    r = report.result
    want = stack if stack != "best" else ("fsdp2" if r.baseline.tokens_per_s_per_gpu > r.top[0].tokens_per_s_per_gpu
                                          else "composed")
    assert doc["chosen_stack"] == want and doc["chosen_fits"] is True
    written = yaml.safe_load(out.read_text())
    assert written["plan"]["stack"] == want
    assert written["cluster"] == {"profile": "h200", "sha256": cluster_checksum(load_cluster("h200"))}
    expect = (doc["top"][0] if want == "composed" else doc["baseline"])
    chk = _run("check", "--plan", str(out), "--json", cwd=tmp_path)
    assert chk.returncode == 0, chk.stderr
    c = json.loads(chk.stdout)
    assert c["peak_bytes"] == expect["peak_bytes"]
    assert (c["tokens_per_step"], c["tokens_per_step_per_rank"]) == (expect["tokens_per_step"],
                                                                   expect["tokens_per_step_per_rank"])
    assert expect["tokens_per_step"] == expect["tokens_per_step_per_rank"] * int(W)
    # check resolves nothing new (the plan is written resolved) but the routing no one named: the
    # file leaves it out, so the check derives it from the plan's own operator
    assert written["plan"]["routing"] is None and c["routing"]["default"]
    assert c["plan"]["plan"] == {**written["plan"], "routing": c["routing"]["routing"]}


def test_nothing_fits_names_why(tmp_path):
    res = _run("search", MODEL, "--gpus", W, "--seq-len", S, "--hbm-gib", "4", "--no-progress", "--json",
               "--out", str(tmp_path / "p.yaml"))
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc["closest"]) == {"composed", "fsdp2"} and doc["chosen_fits"] is False
    for c in doc["closest"].values():
        assert not c["fits_hbm"] and c["why"].startswith("over HBM")
        assert c["binding_terms"][0]["name"] in c["why"]
    chk = _run("check", "--plan", str(tmp_path / "p.yaml"))
    assert chk.returncode == 1 and "DOES NOT FIT" in chk.stdout, chk.stderr
    host = _run("search", MODEL, "--gpus", W, "--seq-len", S, "--host-ram-gib", "2", "--no-progress")
    assert host.returncode == 1
    assert "over host RAM" in host.stdout and "process baselines" in host.stdout


def test_a_closest_plan_rejected_only_by_the_headroom_says_so():
    """A closest plan that fits HBM and host RAM failed only the search's headroom: the reason names
    that rule (it named host RAM, with a total below the usable host RAM)."""
    rep = api.search(model="gpt-oss-20b", cluster="h100", gpus=4, seq_len=1 << 20, stack="composed")
    c = rep.closest["composed"]
    assert c.report.fits_hbm and c.report.fits_host
    assert c.why().startswith("under the 3% headroom the search keeps (--min-headroom)"), c.why()
    assert "planner check says it fits" in c.why()


def test_cluster_flags_override_the_profile(tmp_path):
    base = json.loads(_run("check", MODEL, "--gpus", W, "--seq-len", S, "--json").stdout)
    small = json.loads(_run("check", MODEL, "--gpus", W, "--seq-len", S, "--json", "--hbm-gib", "100",
                            "--host-ram-gib", "512", "--gpus-per-node", "2").stdout)
    assert base["hbm_bytes"] != small["hbm_bytes"] == 100 * GiB
    assert small["host"]["ranks_per_node"] == 2
    assert small["capacity_bytes"] < min(base["capacity_bytes"], 100 * GiB)
    assert small["host"]["capacity_bytes"] < 512 * GiB < base["host"]["capacity_bytes"]
    ref = small["plan"]["cluster"]
    assert ref["topology"] == {"hbm_bytes": 100 * GiB, "host_ram_bytes": 512 * GiB, "gpus_per_node": 2}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(small["plan"]))
    again = json.loads(_run("check", "--plan", str(path), "--json").stdout)
    assert again["capacity_bytes"] == small["capacity_bytes"] and again["plan"] == small["plan"]
    for flag in ("--hbm-gib", "--host-ram-gib", "--gpus-per-node"):
        for cmd in ("check", "search", "sweep", "max-context", "max-batch"):
            assert flag in _run(cmd, "--help").stdout, (cmd, flag)


def test_old_plan_files_that_embed_the_profile_still_read(tmp_path):
    pf = api.build_planfile(model=MODEL, gpus=int(W), seq_len=32768)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(pf.model_dump(mode="json")))
    res = _run("check", "--plan", str(path), "--json")
    assert res.returncode in (0, 1), res.stderr
    assert "topology" in json.loads(res.stdout)["plan"]["cluster"], "an embedded profile stays embedded"


@pytest.mark.parametrize("bad, field", [("0000000000000000", "cluster.sha256"), ("zzz", "cluster.sha256")])
def test_checksum_mismatch_is_one_line_naming_the_fix(tmp_path, bad, field):
    doc = json.loads(_run("check", MODEL, "--gpus", W, "--seq-len", S, "--json").stdout)["plan"]
    doc["cluster"]["sha256"] = bad
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = _run("check", "--plan", str(path))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and field in line and "fix: re-run" in line


@pytest.mark.parametrize("flag, value", [("--hbm-gib", "0"), ("--hbm-gib", "nan"), ("--host-ram-gib", "-1"),
                                         ("--gpus-per-node", "0"), ("--hbm-gib", "1e300")])
def test_bad_cluster_flags_exit_2(flag, value):
    res = _run("check", MODEL, "--gpus", W, "--seq-len", S, flag, value)
    assert res.returncode == 2 and flag in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_load_planfile_reads_a_reference(tmp_path):
    """The runtime and ``validate`` read plan files through ``load_planfile``: a written plan with a
    cluster reference and overrides loads with the overrides applied."""
    from planner.schema.io import load_planfile

    out = tmp_path / "plan.yaml"
    res = _run("search", MODEL, "--gpus", W, "--seq-len", S, "--hbm-gib", "100", "--out", str(out), "--no-progress")
    assert res.returncode == 0, res.stderr
    pf = load_planfile(out)
    assert pf.cluster.topology.hbm_bytes == 100 * GiB and pf.cluster.name == "h200"
