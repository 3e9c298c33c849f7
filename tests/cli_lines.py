"""The one-line refusal every fuzz test of the command line asserts (DESIGN §10)."""

from __future__ import annotations

from planner import cli

CLEAN_EXIT = 2
"""DESIGN §10: invalid input exits 2 with one ``error:`` line."""


def one_line(argv, capsys) -> str:
    """Run the CLI on ``argv``; assert exit 2 with exactly one ``error:`` line and no traceback."""
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == CLEAN_EXIT, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]
