"""``bench/calibrate_coverage.py --dry-run`` (CPU, tiny shapes, the GPU run's code paths) and its
conversion into a profile fragment (``calibration.coverage``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibration.coverage import fragment
from planner.schema.curves import Curves

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "calibrate_coverage.py"
DRY_SECTIONS = "attention,chunk_curves,sco"
"""The quick sections (dispatch widths and the host bench run the same code with more shapes)."""
DRY_TIMEOUT_S = 240


def _run(*args, timeout=DRY_TIMEOUT_S):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("coverage")
    p = _run("--dry-run", "--out", str(out), "--sections", DRY_SECTIONS, "--budget-s", "200")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, json.loads((out / "coverage.json").read_text()), p.stdout


def test_dry_run_writes_every_section(dry):
    out, doc, log = dry
    assert set(DRY_SECTIONS.split(",")) <= set(doc) and not doc["failed"]
    assert doc["provenance"]["device"] == "cpu" and "host_instance" in doc["provenance"]
    rows = doc["attention"]["rows"]
    assert {r["variant"] for r in rows} == {"flash128", "mla", "sinks64", "sliding64"}
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 for r in rows)
    assert doc["chunk_curves"]["curves"]["A"]["num_chunks"] == [1, 2]
    assert doc["sco"]["rows"][0]["plain_step_s"] > 0
    assert "attention" in log and "wrote" in log      # progress printed


def test_fragment_validates(dry):
    _, doc, _ = dry
    frag, held = fragment(doc)
    curves = Curves.model_validate(frag["curves"])
    assert set(curves.attention_long) == {"flash128", "mla", "sinks64", "sliding64"}
    mla = curves.attention_long["mla"]
    assert (mla.d_qk, mla.d_v) == (24, 16) and mla.seq_len[0] == 64
    assert curves.chunk_count is None and curves.sco.rows and held["A"]["num_chunks"] == [1, 2]


def test_fragment_cli_and_bad_input(dry, tmp_path):
    out, _, _ = dry
    frag = tmp_path / "frag.yaml"
    p = subprocess.run([sys.executable, "-m", "calibration.coverage", str(out / "coverage.json"), "--out", str(frag),
                        "--chunk-curves", str(tmp_path / "cc.json")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "attention_long" in yaml.safe_load(frag.read_text())["curves"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p = subprocess.run([sys.executable, "-m", "calibration.coverage", str(bad), "--out", str(tmp_path / "x.yaml")],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_bad_arguments_exit_2():
    p = _run("--dry-run", "--out", "/tmp/unused", "--sections", "attention,bogus", timeout=60)
    assert p.returncode == 2 and "bogus" in p.stderr and "Traceback" not in p.stderr


def test_combined_runs_keep_each_variants_own_provenance():
    """The profile's long-attention tables from the committed coverage runs: the 1M run extends MLA
    and the sink path to S = 1,048,576 and is their provenance; flash and the sliding window keep the
    first run's."""
    from calibration.coverage import combine

    res = ROOT / "bench" / "results" / "calibration" / "coverage"
    docs = [json.loads((res / f).read_text()) for f in ("coverage.json", "coverage_1m.json")]
    tables = Curves.model_validate(fragment(combine(docs))[0]["curves"]).attention_long
    for name in ("mla", "sinks64"):
        t = tables[name]
        assert t.seq_len[-1] == 1048576 and t.heads == [1, 8]
        assert t.provenance.date == docs[1]["provenance"]["date"] and "rows of:" in t.note
    for name in ("flash128", "sliding64"):
        assert tables[name].provenance.date == docs[0]["provenance"]["date"] and "rows of:" not in tables[name].note
    assert tables["mla"].bwd_s[-1][1] == docs[1]["attention"]["rows"][1]["bwd_s"]
    profile = yaml.safe_load((ROOT / "planner" / "profiles" / "clusters" / "h200.yaml").read_text())
    assert profile["curves"]["attention_long"]["mla"]["seq_len"] == tables["mla"].seq_len   # merged
