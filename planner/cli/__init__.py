"""``planner``: thin typer commands over ``planner.api`` (DESIGN §10).

Exit codes: 0 fits, 1 does not fit, 2 invalid input (one line, no traceback), 3 internal error.
The commands live in ``plan_commands`` (check, max-context, max-batch), ``search_commands``
(search, sweep, min-gpus) and ``tools`` (calibrate, validate, models, import-hf); their shared and
knob options in ``options``.
"""

import errno
import json
import os
import sys
import traceback

import typer

from planner.cli import plan_commands, search_commands, tools  # noqa: F401 - registers the commands
from planner.cli.app import app, err
from planner.cli.options import named_by_flag
from planner.errors import (INTERRUPTED, PIPE_CLOSED, InvalidPlan, PlanError, usage_exception_types,
                            usage_line)

__all__ = ["app", "main"]


def _json_error(message: str, field, code: int) -> None:
    """Under ``--json`` an error is one JSON object on stdout too (the line stays on stderr)."""
    if sys.stdout is None:
        return
    sys.stdout.write(json.dumps({"error": message, "field": None if field is None else str(field),
                                 "exit_code": code}) + "\n")


def _version_alone(args: list[str]) -> None:
    """``planner --version`` takes no value: ``--version 3`` or ``--version check …`` is refused
    (the eager flag would print the version and silently drop the rest)."""
    if args[:1] == ["--version"] and len(args) > 1:
        raise InvalidPlan("--version", " ".join(args[1:]), "takes no value and no other argument",
                          "run `planner --version` alone")


_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT}
"""Errors of a write to standard output (no file name) reported as one line, not a traceback."""


def _pipe_closed() -> int:
    """The reader went away: later writes (and the interpreter's last flush) go to /dev/null."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return PIPE_CLOSED


def _internal_error() -> int:
    traceback.print_exc()
    err.print("internal error: please report it with the traceback above", markup=False)
    return 3


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to exit codes (2 invalid input, 3 internal error with traceback).

    Usage errors (bad option values, unknown options or commands, missing values) exit 2 with one
    ``error:`` line; bare ``planner`` prints the help and exits 2 (click's convention). A refusal of
    a value typed as a flag names the flag, not the schema field it set (``options.named_by_flag``).
    """
    usage_types, abort_types = usage_exception_types()
    args = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in args
    try:
        if sys.stdout is None:
            raise InvalidPlan("standard output", "closed", "must be open for the command's output",
                              "redirect it to a file or /dev/null instead of closing it")
        _version_alone(args)
        rv = app(args=argv, prog_name="planner", standalone_mode=False)
        code = int(rv or 0)
        sys.stdout.flush()      # a closed pipe or a full disk is reported here, not at exit
    except BrokenPipeError:
        code = _pipe_closed()
    except PlanError as e:
        e = named_by_flag(e, args)
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        code = e.exit_code
        if as_json:
            _json_error(str(e), getattr(e, "field", None), code)
    except OSError as e:
        if e.filename is not None or e.errno not in _OUTPUT_ERRNOS:
            code = _internal_error()
        else:
            err.print(f"error: the output could not be written ({e.strerror}); fix: free space on its device or "
                      "redirect it elsewhere", markup=False, highlight=False, soft_wrap=True)
            code = 2
    except typer.Exit as e:
        code = e.exit_code
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except (KeyboardInterrupt, *abort_types):    # older click turns a Ctrl-C during a command into Abort
        code = INTERRUPTED
    except usage_types as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()
        else:
            err.print(usage_line(e), markup=False, highlight=False, soft_wrap=True)
            if as_json:
                param = getattr(e, "param", None)
                opts = getattr(param, "opts", None) or [getattr(param, "name", None)]
                _json_error(usage_line(e).removeprefix("error: "), opts[0] if param is not None else None, 2)
        code = 2
    except Exception:  # noqa: BLE001 - bugs
        code = _internal_error()
    if code == INTERRUPTED:      # typer >= 0.29 returns a Ctrl-C as exit code 130, silently
        err.print("interrupted", markup=False, highlight=False)
    if argv is None:
        sys.exit(code)
    return code
