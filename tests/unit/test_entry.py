"""The console script's entry: a Ctrl-C while the command line's modules import exits 130 with one
line, no traceback; otherwise it runs the command line."""

from __future__ import annotations

import sys
import types

from planner import entry


def test_ctrl_c_during_imports_exits_130_without_a_traceback(monkeypatch, capsys):
    fake = types.ModuleType("planner.cli")

    def interrupted(name):
        raise KeyboardInterrupt

    fake.__getattr__ = interrupted
    monkeypatch.setitem(sys.modules, "planner.cli", fake)
    assert entry.main() == entry.INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err == "interrupted\n"


def test_the_entry_runs_the_command_line(monkeypatch, capsys):
    import pytest

    monkeypatch.setattr(sys, "argv", ["planner", "models", "--json"])
    with pytest.raises(SystemExit) as done:     # the command line exits with the command's code
        entry.main()
    assert done.value.code == 0
    assert '"gpt-oss-20b"' in capsys.readouterr().out
