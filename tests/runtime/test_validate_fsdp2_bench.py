"""The CPU / dry path of ``bench/validate_fsdp2.py``: every case of the GPU matrix is a plan the
planner accepts, with a per-phase prediction, and the files are written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "validate_fsdp2.py"


def _load():
    spec = importlib.util.spec_from_file_location("validate_fsdp2", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_predicts_every_case(tmp_path):
    mod = _load()
    assert mod.main(["--dry-run", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "validate_fsdp2.json").read_text())
    cases = doc["cases"]
    assert len(cases) == len(mod.CASES)
    dry = [c for c in cases if c["status"] == "dry run"]
    assert len(dry) == len(cases), [c["status"] for c in cases if c["status"] != "dry run"]
    for c in dry:
        phases = c["predicted_phases"]
        assert {"head", "optimizer", "forward[1]", "backward[1]"} <= set(phases)
        assert max(phases.values()) == c["predicted_peak_bytes"] > 0
        assert (tmp_path / "plans" / f"{c['name']}.yaml").exists()
    assert (tmp_path / "validate_fsdp2.md").read_text().count("| dry run |") == len(cases)
