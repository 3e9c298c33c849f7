"""``min-gpus`` keeps ``--min-headroom`` free as ``search`` does, so the ``W`` it names is one at which
``search`` ranks a plan; ``check`` keeps its verdict against the usable capacity but says when a
plan that fits leaves less than that headroom free.

The case: gpt-oss-20b on h100 at S = 1m. At W = 4 the lowest composed peak is 67.20 GiB of
68.29 GiB usable (98.4%: 1.6% free), so it fits the capacity but not the 3% headroom; at W = 8 the
lowest peak is 34.3 GiB (50.3%)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner import api
from planner.api.build import build
from planner.budget.frontier import MIN_HEADROOM
from planner.errors import InvalidPlan
from planner.schema.cluster_ref import planfile_doc
from planner.search.rank import lowest_peak

ROOT = Path(__file__).resolve().parents[2]
MODEL, CLUSTER, S = "gpt-oss-20b", "h100", 1 << 20
ARGS = [MODEL, "--seq-len", "1m", "--cluster", CLUSTER]


def _run(*args) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _lowest(W: int, **kw):
    pf, ref = build(model=MODEL, cluster=CLUSTER, gpus=W, seq_len=S)
    plan, peak, n = lowest_peak(pf.model, pf.cluster, pf.workload, world_size=W, stack="composed", **kw)
    return pf.model_copy(update={"plan": plan}), ref, peak, n


@pytest.fixture(scope="module")
def at_4():
    """The lowest-peak composed plan at W = 4, its check and its fitting counts without and with headroom."""
    pf, ref, peak, n_bare = _lowest(4)
    _, _, peak_h, n_head = _lowest(4, min_headroom=MIN_HEADROOM)
    return pf, ref, api.check_planfile(pf), peak, peak_h, n_bare, n_head


def test_the_case_peaks_between_97_and_100_percent_at_w4(at_4):
    pf, _, rep, peak, peak_h, n_bare, n_head = at_4
    assert rep.peak_bytes == peak == peak_h == 72_160_401_088     # the lowest plan does not move with headroom
    assert rep.capacity_bytes == 73_330_201_429
    assert (1 - MIN_HEADROOM) * rep.capacity_bytes < peak <= rep.capacity_bytes
    assert n_bare == 525 and n_head == 0


def test_min_gpus_names_a_larger_w_under_the_headroom():
    bare = api.min_gpus(model=MODEL, cluster=CLUSTER, seq_len=S, min_headroom=0.0)
    kept = api.min_gpus(model=MODEL, cluster=CLUSTER, seq_len=S)
    assert (bare.composed, kept.composed) == (4, 8)
    assert bare.min_headroom == 0.0 and kept.min_headroom == MIN_HEADROOM == kept.to_json()["min_headroom"]
    rows = {r["world_size"]: r for r in kept.tried}
    assert rows[4]["composed_fit"] == 0 and rows[4]["composed_lowest_peak_bytes"] == 72_160_401_088
    assert rows[8]["composed_fit"] == 4230
    assert {r["world_size"]: r["composed_fit"] for r in bare.tried if "composed_fit" in r} == {1: 0, 2: 0, 4: 525}


@pytest.mark.slow
@pytest.mark.parametrize("headroom,W,n_fit", [(0.0, 4, 525), (None, 8, 4230)])
def test_search_ranks_a_plan_at_the_min_gpus_answer(headroom, W, n_fit):
    """At min-gpus' W the search, under the same headroom, ranks plans, and counts as many fitting
    candidates as min-gpus did."""
    assert api.min_gpus(model=MODEL, cluster=CLUSTER, seq_len=S, min_headroom=headroom).composed == W
    rep = api.search(model=MODEL, cluster=CLUSTER, gpus=W, seq_len=S, top=1, stack="composed",
                     min_headroom=headroom)
    assert rep.result.top and rep.result.tally.fit == n_fit
    assert "composed" not in rep.closest


@pytest.mark.slow
def test_search_closest_plan_is_the_lowest_peak_under_the_headroom(at_4):
    """Below min-gpus' W the search finds no composed plan; its closest plan is the lowest-peak one,
    rejected only by the headroom (the reason says so)."""
    pf, *_ = at_4
    rep = api.search(model=MODEL, cluster=CLUSTER, gpus=4, seq_len=S, top=1, stack="composed")
    assert not rep.result.top
    c = rep.closest["composed"]
    assert c.report.peak_bytes == 72_160_401_088 and c.plan == pf.plan
    assert c.why().startswith("under the 3% headroom the search keeps (--min-headroom)")


@pytest.mark.slow
def test_min_gpus_cli_reports_the_headroom():
    res = _run("min-gpus", *ARGS, "--json", "--no-progress")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["min_gpus"] == 8 and doc["min_headroom"] == MIN_HEADROOM
    bare = _run("min-gpus", *ARGS, "--json", "--no-progress", "--min-headroom", "0")
    assert bare.returncode == 0 and json.loads(bare.stdout)["min_gpus"] == 4
    text = _run("min-gpus", *ARGS, "--no-progress", "--max-gpus", "4")
    assert text.returncode == 1 and "does not fit up to W = 4" in text.stdout
    assert "W = 4: composed 0 fit (lowest peak 67.2 GiB)" in text.stdout
    assert "leaves 3% of the usable capacity free (--min-headroom" in text.stdout


@pytest.mark.parametrize("bad", ["-0.1", "1.0", "abc"])
def test_bad_min_headroom_of_min_gpus_is_one_line_exit_2(bad):
    res = _run("min-gpus", *ARGS, "--no-progress", "--min-headroom", bad)
    assert res.returncode == 2, res.stdout
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("error: ") and "--min-headroom" in res.stderr
    if bad != "abc":   # a range error, worded as search's (one check, ``api.frontier.min_headroom_of``)
        assert f"--min-headroom ({bad}) must be in [0, 1)" in res.stderr
        with pytest.raises(InvalidPlan, match=r"--min-headroom \(.*\) must be in \[0, 1\)"):
            api.min_gpus(model=MODEL, cluster=CLUSTER, seq_len=S, min_headroom=float(bad))


def test_check_says_when_a_fitting_plan_is_under_the_headroom(at_4, tmp_path):
    pf, ref, rep, *_ = at_4
    j = rep.to_json()
    assert j["fits"] and j["under_min_headroom"] is True and j["min_headroom"] == MIN_HEADROOM
    assert j["headroom_fraction"] == pytest.approx(1 - 72_160_401_088 / 73_330_201_429)
    assert 0.015 < j["headroom_fraction"] < 0.016
    path = tmp_path / "w4.yaml"
    path.write_text(yaml.safe_dump(planfile_doc(pf, ref)))
    res = _run("check", "--plan", str(path))
    assert res.returncode == 0, res.stderr        # the verdict is against the usable capacity: it fits
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "FITS"
    assert lines[-2] == ("headroom: 1.6% of the usable capacity free (1.09 GiB), under the 3% (--min-headroom) that "
                         "search, sweep, min-gpus, max-context and max-batch would keep")
    doc = json.loads(_run("check", "--plan", str(path), "--json").stdout)
    assert doc["under_min_headroom"] is True and doc["headroom_fraction"] == j["headroom_fraction"]
    # check takes --min-headroom as the other commands do: below this plan's 1.6% no line, the same verdict
    low = _run("check", "--plan", str(path), "--min-headroom", "0.01", "--json")
    assert low.returncode == 0, low.stderr
    doc = json.loads(low.stdout)
    assert doc["under_min_headroom"] is False and doc["min_headroom"] == 0.01 and doc["fits"]
    assert "headroom:" not in _run("check", "--plan", str(path), "--min-headroom", "0.01").stdout
    bad = _run("check", "--plan", str(path), "--min-headroom", "1")
    assert bad.returncode == 2 and "--min-headroom (1.0) must be in [0, 1)" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_check_of_a_plan_well_below_the_capacity_has_no_headroom_line(tmp_path):
    pf, ref, peak, _ = _lowest(8)
    rep = api.check_planfile(pf)
    assert rep.fits and not rep.under_min_headroom and rep.headroom_fraction > 0.4
    path = tmp_path / "w8.yaml"
    path.write_text(yaml.safe_dump(planfile_doc(pf, ref)))
    res = _run("check", "--plan", str(path))
    assert res.returncode == 0 and res.stdout.strip().splitlines()[-1] == "FITS"
    assert "headroom:" not in res.stdout and "under the 3%" not in res.stdout
    doc = json.loads(_run("check", "--plan", str(path), "--json").stdout)
    assert doc["under_min_headroom"] is False and doc["headroom_fraction"] == pytest.approx(1 - peak / rep.capacity_bytes)


def test_check_over_the_capacity_is_not_under_the_headroom():
    """``under_min_headroom`` is about plans that fit: one over the capacity does not fit, and says so."""
    rep = api.check(model=MODEL, cluster=CLUSTER, gpus=2, seq_len=S)
    assert not rep.fits_hbm and not rep.under_min_headroom and rep.headroom_fraction < 0
