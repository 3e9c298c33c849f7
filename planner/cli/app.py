"""The typer application, its consoles, and what every command shares to print (JSON, progress)."""


import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from typer.core import TyperGroup


def _untyped_flags(cmd, ctx) -> None:
    """Show no value type beside a flag in ``--help``: typer >= 0.29 prints ``<bool>`` after every
    flag (``--version``, ``--help``, ``--json``), which reads as if the flag took a value
    (``--version true``). An empty metavar leaves the type column blank; nothing else reads it."""
    for p in cmd.get_params(ctx):
        if getattr(p, "is_flag", False) and getattr(p, "metavar", None) is None:
            p.metavar = ""


class _Group(TyperGroup):
    """The ``planner`` group: its own and every command's flags shown without a value type."""

    def format_help(self, ctx, formatter) -> None:
        _untyped_flags(self, ctx)
        super().format_help(ctx, formatter)

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _untyped_flags(cmd, ctx)
        return cmd


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Per-rank memory and step-time planner for long-context MoE training.")

_WIDTH = None if sys.stdout is not None and sys.stdout.isatty() else 160
"""Rich wraps at 80 columns when not on a terminal; pipes and logs get 160."""


def _reader_closed_the_pipe(console) -> None:
    """Rich exits 1 when the reader closes the pipe (``planner check … | head -1``), which reads as
    "does not fit": every console of the command line (ours and typer's help) raises instead, and
    ``planner.cli.main`` exits ``PIPE_CLOSED``."""
    raise BrokenPipeError


Console.on_broken_pipe = _reader_closed_the_pipe
out = Console(width=_WIDTH)
err = Console(stderr=True, width=_WIDTH)


def _version(value: bool) -> None:
    if value:
        from planner import __version__

        sys.stdout.write(f"planner (moe-planner) {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Per-rank memory and step-time planner for long-context MoE training."""


def print_json(doc) -> None:
    """One JSON object on stdout (plain: rich's highlighter is slow on large documents)."""
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")


def warn(lines) -> None:
    """One ``warning:`` line on stderr per entry."""
    for w in lines:
        err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)


class progress_bar:
    """``with progress_bar(label, enabled) as cb``: a rich progress bar on stderr; ``cb`` is the
    ``(done, total)`` callback (``None`` when disabled or not a terminal)."""

    def __init__(self, label: str, enabled: bool):
        self.prog = None
        if enabled and err.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self.prog = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=err, transient=True)
            self.task = self.prog.add_task(label, total=None)

    def __enter__(self):
        if self.prog is None:
            return None
        self.prog.start()
        return lambda done, total: self.prog.update(self.task, completed=done, total=total)

    def __exit__(self, *exc) -> None:
        if self.prog is not None:
            self.prog.stop()
