"""``planner calibrate`` and ``python3 -m calibration`` on bad input (no GPU here): one line naming
the flag, the value and the fix, exit 2, nothing written, no folder made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, *args, module=("planner.cli", "calibrate")):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", module[0], *module[1:], *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


@pytest.mark.parametrize("args, line", [
    (["--quick", "--sections", "bogus"], "error: --sections ('bogus') is not a calibration section"),
    (["--quick", "--sections", ""], "error: --sections ('') names no section"),
    (["--quick", "--sections", "sco,gemm"], "error: --sections ('sco') is not measured by the cpu-quick grid on this "
                                            "machine (no CUDA device)"),
    (["--quick", "--sections", "gemm", "--attention-budget-s", "30"],
     "error: --attention-budget-s (30.0) does not apply: attention_long is not among the sections run"),
    (["--quick", "--attention-budget-s", "0"], "error: --attention-budget-s (0.0) must be a positive finite number"),
    (["--quick", "--attention-budget-s", "1e309"], "error: --attention-budget-s (inf) must be a positive finite"),
    (["--quick", "--out", "."], "error: --out ('.') names a folder, not a file"),
    ([], "error: --quick (False) must be set on a machine without a CUDA device"),
])
def test_planner_calibrate_refuses_in_one_line(tmp_path, args, line):
    res = _run(tmp_path, *args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and res.stderr.startswith(line), res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []      # no profile, no default folder


@pytest.mark.parametrize("args, start", [
    (["--out", "p.yaml", "--quick", "--sections", ""], "error: --sections ('') names no section"),
    (["--out", "p.yaml", "--quick", "--attention-budget-s", "abc"], "error: argument --attention-budget-s: invalid float"),
    (["--out", "p.yaml", "--smoke", "--sections", "constants"], "error: --sections ('constants') is not measured"),
])
def test_module_entry_refuses_in_one_line(tmp_path, args, start):
    res = _run(tmp_path, *args, module=("calibration",))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith(start), res.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_the_recorded_command_names_the_subcommand(tmp_path):
    res = _run(tmp_path, "--quick", "--out", "cpu.yaml", "--no-progress")
    assert res.returncode == 0, res.stderr
    summary = (tmp_path / "cpu.summary.md").read_text()
    assert "- command: `planner calibrate --quick --out cpu.yaml --no-progress`" in summary
    assert "calibration.merge" not in res.stderr          # the merge tip is for a GPU profile
