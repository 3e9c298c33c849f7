"""User-facing error families (DESIGN §9, STYLE §4).

``PlanError`` is the base of everything the CLI reports as a one-line message:

- ``InvalidPlan`` (exit 2): bad input. The message names the field, the value and the fix. It is
  a ``ValueError`` too (the operators' Python API raises ``ValueError`` for a bad argument).
  ``UnwritableOutput`` is the one for an output path that cannot be written (also an ``OSError``).
- ``Infeasible`` (exit 1): a valid configuration that does not fit; carries the budget.
- ``ProfileGap`` (exit 2): the time model was asked about a shape outside a measured curve.

Bugs are not ``PlanError``: they are assertions and keep their tracebacks (exit 3).
"""

from __future__ import annotations

from typing import Any


INTERRUPTED = 130
"""Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""
PIPE_CLOSED = 141
"""Exit status of a command whose reader closed the pipe (``planner … | head -1``; 128 + SIGPIPE, as
shells report a writer the pipe stopped): never 0 or 1, which are verdicts."""


class PlanError(Exception):
    """Base of all user-facing planner errors."""

    exit_code = 2


class InvalidPlan(PlanError, ValueError):
    """Invalid input: one line naming the field, the value and the fix. Also a ``ValueError``, so
    ``except ValueError`` catches it as it catches the operators' argument errors.

    Args:
        field: dotted path of the offending field (``plan.composed.expert_parallel``).
        value: the value given.
        problem: what is wrong, phrased "must relation other (value)".
        fix: what to do instead.
    """

    exit_code = 2

    def __init__(self, field: str, value: Any, problem: str, fix: str = "") -> None:
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        msg = f"{shown(field, MAX_FIELD_CHARS)} ({shown(value_text(value), MAX_VALUE_CHARS)}) {shown(problem, MAX_TEXT_CHARS)}"
        if fix:
            msg += f"; fix: {shown(fix, MAX_TEXT_CHARS)}"
        super().__init__(msg)

    def renamed(self, field: str) -> InvalidPlan:
        """The same refusal with its value named ``field`` instead (the command-line flag that set
        a schema field: ``planner.cli.options.FLAG_OF_FIELD``); the old name is replaced where the
        problem or the fix repeats it."""
        return type(self)(field, self.value, self.problem.replace(self.field, field),
                          self.fix.replace(self.field, field))


MAX_FIELD_CHARS = 120
"""An error names at most this many characters of a field path (a 50 MB unknown key stays a line)."""
MAX_VALUE_CHARS = 120
"""... of the value it repeats."""
MAX_TEXT_CHARS = 600
"""... of its problem and of its fix."""
_CONTROL = {c: "?" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)}
"""Control characters (terminal escape sequences, newlines, C1 controls) and line separators."""


def value_text(value: Any) -> str:
    """``repr(value)``, or for an integer too long to print (Python refuses more than 4300 digits)
    its size: an error about an absurd number is still one line. ``None`` (a flag or key not given,
    or YAML's ``null``) reads "none given"."""
    if value is None:
        return "none given"
    try:
        return repr(value)
    except ValueError:
        if isinstance(value, int):
            import math

            v = abs(value)
            digits = int(math.log10(v)) + 1
            digits -= 10 ** (digits - 1) > v      # log10 rounds up just below a power of ten
            return f"an integer of {digits} digits"
        return f"a {type(value).__name__} that cannot be printed"


def shown(text: str, limit: int) -> str:
    """``text`` safe to echo on one terminal line: control characters replaced by ``?``, cut to
    ``limit`` characters with ``…`` and the count left out."""
    text = str(text)
    cut = len(text) > limit
    if cut:
        head = text[:limit]
        text = f"{head}… ({len(text) - limit} more characters)"
    return text.translate(_CONTROL)


class UnwritableOutput(InvalidPlan, OSError):
    """An output path that cannot be written (a directory, a read-only or missing folder): invalid
    input (exit 2) that is also the ``OSError`` the write raised, for callers that catch those."""


class Infeasible(PlanError):
    """A valid configuration that does not fit; ``report`` holds the budget that proves it."""

    exit_code = 1

    def __init__(self, message: str, report: Any = None) -> None:
        self.report = report
        super().__init__(message)


def _number(x: Any) -> str:
    """A curve coordinate as a user reads it: ``19947``, ``1.04858e+06``, ``∞`` (numpy scalars
    included), anything else by its ``repr``."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return repr(x)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "∞" if v > 0 else "−∞"
    return f"{v:.6g}"


class ProfileGap(PlanError):
    """The time model was asked for a value outside a measured curve (never extrapolated)."""

    exit_code = 2

    def __init__(self, curve: str, value: Any, lo: Any, hi: Any, fix: str = "") -> None:
        self.curve, self.value, self.lo, self.hi = curve, value, lo, hi
        msg = (f"profile curve {curve} has no measurement at {_number(value)} "
               f"(measured range {_number(lo)} to {_number(hi)})")
        super().__init__(msg + (f"; fix: {fix}" if fix else ""))

    @classmethod
    def missing(cls, curve: str, fix: str) -> "ProfileGap":
        """The profile has no ``curve`` at all (``value`` "any", no range)."""
        err = cls.summary(f"the profile has no {curve} curve; fix: {fix}")
        err.curve, err.value = curve, "any"
        return err

    @classmethod
    def summary(cls, message: str) -> "ProfileGap":
        """A gap reported as one prepared line (e.g. "no candidate could be timed: <first gap>"),
        when the structured fields were recorded as text by the time model."""
        err = cls.__new__(cls)
        err.curve = err.value = err.lo = err.hi = None
        PlanError.__init__(err, message)
        return err


def usage_exception_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage-error classes, abort classes) of every click flavour in use: typer >= 0.29 raises its
    vendored ``typer._click`` exceptions, older typer raises ``click``'s own."""
    import importlib

    usage: list[type] = []
    import typer

    aborts: list[type] = [typer.Abort]
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        usage.append(mod.ClickException)
        if hasattr(mod, "Abort"):
            aborts.append(mod.Abort)
    return tuple(usage), tuple(aborts)


def usage_line(e: Exception, program: str = "planner") -> str:
    """One ``error: …; fix: …`` line for a click/typer usage error (DESIGN §10)."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else program
    try:
        msg = e.format_message()
    except Exception:  # noqa: BLE001 - any click flavour: fall back to the plain message
        msg = str(e)
    cause = getattr(e, "__cause__", None)
    errors = getattr(cause, "errors", None)
    if callable(errors):                  # typer coerces through pydantic: name the value typed
        try:
            value = errors()[0].get("input")
        except Exception:  # noqa: BLE001
            value = None
        if value is not None and repr(value) not in msg:
            msg = f"{msg} (got {value!r})"
    msg = " ".join(msg.replace("Value error, ", "").split()).rstrip(".")
    msg = shown(msg, MAX_TEXT_CHARS)      # an unknown 100,000-character option stays one short line
    return f"error: {msg}; fix: see '{where} --help' for the commands and options"
