"""The ``planner`` console script: loads the command line and runs it. A Ctrl-C while the command
line's modules are still importing (typer, pydantic, numpy: about the first half second) exits 130
without a traceback, as one during a command does (``planner.cli.main``)."""

from __future__ import annotations

import sys

from planner.errors import INTERRUPTED


def main() -> int:
    try:
        from planner.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return INTERRUPTED
    return cli_main()
