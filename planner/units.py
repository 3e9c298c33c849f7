"""Units: GiB, dtype sizes, size parsing ("128k", "1m", "8GiB") and formatting.

Sizes of tokens use powers of two: ``128k`` = 131072, ``1m`` = 1048576 (DESIGN §10).
Byte sizes accept ``KiB/MiB/GiB/TiB`` (powers of two) and ``KB/MB/GB/TB`` (powers of ten).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
PAGE_BYTES = 4 * KiB
"""Host page size: ``cudaHostRegister`` pins page-aligned memory in 4 KiB pages."""

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "int32": 4, "int64": 8, "bool": 1}
"""Bytes per element of the dtypes the budget uses."""

_COUNT_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_BYTE_SUFFIX = {
    "": 1, "b": 1,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_NUM = re.compile(r"^([0-9]*\.?[0-9]+)([a-zA-Z]*)$", re.ASCII)
"""A size after surrounding whitespace is stripped (``' 128k '`` is ``128k``): digits, an optional
fraction, the suffix right after (``128 k`` is refused: a space inside reads as two arguments
pasted together)."""


def _exact(number: str, scale: int) -> Decimal:
    """``number · scale`` exactly (``Decimal``: no float round trip, so integers above 2^53 stay
    exact and ``1.5k`` is 1536)."""
    import decimal

    with decimal.localcontext() as dc:    # the default 28 digits would round a long number
        dc.prec = len(number) + 2 * len(str(scale)) + 4
        return Decimal(number) * scale


def _whole(number: str, text, field: str, example: str) -> None:
    """Refuse a fractional number before a token-count suffix (``1.5m``, ``0.5k``): the suffixes are
    powers of two, so ``1.5m`` would silently be 1,572,864; write ``1536k``."""
    from planner.errors import InvalidPlan

    if "." in number:
        raise InvalidPlan(field, text, "must be a whole number of its unit (no fraction)",
                          f"write e.g. {example}")


def parse_count(text: str | int, field: str = "size") -> int:
    """Parse a token or element count: ``131072``, ``128k``, ``1m``, ``100M`` (k/m/g are 2^10/2^20/2^30).

    Raises:
        InvalidPlan: the text is not a positive integer with an optional k/m/g suffix.
    """
    from planner.errors import InvalidPlan

    if isinstance(text, bool):
        raise InvalidPlan(field, text, "must be a positive integer", "write e.g. 131072 or 128k")
    if isinstance(text, int):
        value = text
    else:
        m = _NUM.match(str(text).strip())
        if not m or m.group(2).lower() not in _COUNT_SUFFIX:
            raise InvalidPlan(field, text, "is not a size", "write e.g. 131072, 128k or 1m")
        _whole(m.group(1), text, field, "128k")
        value = int(_exact(m.group(1), _COUNT_SUFFIX[m.group(2).lower()]))
    if value <= 0:
        raise InvalidPlan(field, text, "must be > 0", "give a positive size")
    return value


_PARAM_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


def parse_params(text: str | int, field: str = "params") -> int:
    """Parse a parameter count with decimal suffixes: ``100M`` = 10^8, ``1.5B`` = 1.5·10^9 exactly;
    a count that is not a whole number (``16.9``, ``1.0000000001k``) is refused.

    Raises:
        InvalidPlan: not a positive count.
    """
    from planner.errors import InvalidPlan

    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _NUM.match(str(text).strip())
        if not m or m.group(2).lower() not in _PARAM_SUFFIX:
            raise InvalidPlan(field, text, "is not a parameter count", "write e.g. 100M or 100000000")
        exact = _exact(m.group(1), _PARAM_SUFFIX[m.group(2).lower()])
        if exact != exact.to_integral_value():
            raise InvalidPlan(field, text, "must be a whole number of parameters",
                              "write e.g. 100M, 1.5B or 16")
        value = int(exact)
    if value <= 0:
        raise InvalidPlan(field, text, "must be > 0", "give a positive count")
    return value


def parse_bytes(text: str | int | float, field: str = "bytes") -> int:
    """Parse a byte size: ``8GiB``, ``16 GB``, ``1073741824``. A bare number is bytes.

    Raises:
        InvalidPlan: unparsable or negative.
    """
    from planner.errors import InvalidPlan

    if isinstance(text, float) and not math.isfinite(text):
        raise InvalidPlan(field, text, "must be a finite size", "give a size such as 8GiB")
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = Decimal(text)
    else:
        m = _NUM.match(str(text).strip())
        if not m or m.group(2).lower() not in _BYTE_SUFFIX:
            raise InvalidPlan(field, text, "is not a byte size", "write e.g. 8GiB or 17179869184")
        value = _exact(m.group(1), _BYTE_SUFFIX[m.group(2).lower()])
    if value < 0:
        raise InvalidPlan(field, text, "must be >= 0", "give a non-negative size")
    return int(value)


def gib(n_bytes: float) -> float:
    """Bytes to GiB (2^30)."""
    return float(n_bytes) / GiB


def fmt_gib(n_bytes: float, digits: int = 2) -> str:
    """Format bytes as ``12.34 GiB``."""
    return f"{gib(n_bytes):.{digits}f} GiB"


def fmt_share(x: float) -> str:
    """A fraction as a percentage with up to three significant digits: ``0.03`` → ``3%``,
    ``0.004`` → ``0.4%``, ``0.999`` → ``99.9%`` (``:.0%`` would print 0% and 100%)."""
    return f"{x * 100:.3g}%"


def fmt_count(n: int) -> str:
    """Format a token count compactly: 131072 -> ``128k``, 1048576 -> ``1m``."""
    for suffix, size in (("m", 1 << 20), ("k", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def round_up(n: int, multiple: int) -> int:
    """Round ``n`` up to a multiple of ``multiple`` (works on numpy integer arrays too)."""
    return -(-n // multiple) * multiple


def ceil_div(a, b):
    """``ceil(a / b)`` on integers or numpy integer arrays."""
    return -(-a // b)


def plural(n: int, word: str, words: str | None = None, *, grouped: bool = True) -> str:
    """``n`` and the noun in agreement: ``1 token``, ``2 tokens``, ``131,072 tokens`` (``words`` for
    an irregular plural; ``grouped=False`` writes ``131072``)."""
    number = f"{n:,}" if grouped else str(n)
    return f"{number} {word if n == 1 else (words or word + 's')}"
