"""Output targets that are not regular files: every atomic write (plan files, CSV, plots, profiles)
refuses them instead of replacing them; a symlink to a regular file is written through.

Real device nodes are never used: a FIFO and symlinks in ``tmp_path`` stand for them.
"""

from __future__ import annotations

import os
import stat

import pytest

from planner import cli
from planner.errors import InvalidPlan, UnwritableOutput
from planner.schema.io import check_writable, write_text_atomic, write_yaml_atomic

CLEAN_EXIT = 2
"""DESIGN §10: invalid input exits 2 with one ``error:`` line."""


def _fifo(tmp_path):
    p = tmp_path / "a_fifo"
    os.mkfifo(p)
    return p


def _assert_untouched_fifo(p):
    assert stat.S_ISFIFO(os.lstat(p).st_mode), "the FIFO was replaced"
    assert [q.name for q in p.parent.iterdir() if q.name.endswith(".tmp")] == []


@pytest.mark.parametrize("writer", [check_writable, lambda p, f: write_text_atomic(p, "x\n", f),
                                    lambda p, f: write_yaml_atomic(p, {"a": 1}, f)],
                         ids=["check_writable", "write_text_atomic", "write_yaml_atomic"])
def test_fifo_target_is_refused_not_replaced(writer, tmp_path):
    p = _fifo(tmp_path)
    with pytest.raises(UnwritableOutput) as e:
        writer(p, "--out")
    assert "--out" in str(e.value) and "not a regular file" in str(e.value) and "fix:" in str(e.value)
    _assert_untouched_fifo(p)


def test_symlink_to_a_fifo_is_refused(tmp_path):
    p = _fifo(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(p)
    with pytest.raises(InvalidPlan, match="not a regular file"):
        write_text_atomic(link, "x\n", "--csv")
    assert link.is_symlink()
    _assert_untouched_fifo(p)


def test_dangling_symlink_is_refused(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(InvalidPlan, match="symlink to nothing"):
        check_writable(link, "--out")
    with pytest.raises(InvalidPlan, match="symlink to nothing"):
        write_text_atomic(link, "x\n", "--out")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_symlink_to_a_regular_file_is_written_through(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "latest.yaml"
    link.symlink_to(real)
    check_writable(link, "--out")
    write_text_atomic(link, "new\n", "--out")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_cli_out_fifo_is_one_line_exit_2(tmp_path, capsys):
    p = _fifo(tmp_path)
    code = cli.main(["search", "olmoe-1b-7b", "--gpus", "2", "--seq-len", "8k", "--top", "1",
                     "--no-progress", "--out", str(p)])
    err = capsys.readouterr().err
    assert code == CLEAN_EXIT, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--out" in lines[0], err
    _assert_untouched_fifo(p)
