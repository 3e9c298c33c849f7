"""Base class of every schema model: frozen, ``extra="forbid"``, field docstrings as descriptions."""

from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

SCHEMA_VERSION = 1
"""Version of the plan-file and profile schema this build reads and writes."""

# ---- upper bounds of the integer knobs -----------------------------------------------------------
# Far beyond any real job, and small enough that every per-rank byte count the budget forms stays
# inside numpy's int64 and every plan loop (divisors, chunks) stays short.
MAX_WORLD_SIZE = 1 << 20
"""Largest ``W`` and largest degree (``D``, ``E_p``, ``P``, ``tp``, ``cp``, ``dp_shard``, ``ep``):
2^20 = 1,048,576 ranks."""
MAX_TOKENS = 1 << 32
"""Largest token count (``S``, tokens per sequence group, ``c``, ``m``): 2^32 ≈ 4.3·10^9 tokens."""
MAX_CHUNKS = 1 << 12
"""Largest ``K_max``: 4096 dispatch chunks per layer."""
MAX_IMPORTS = 1 << 20
"""Largest ``n_import_max`` and ``B_v``."""
MAX_BUCKET_PARAMS = 1 << 40
"""Largest OffloadStreamAdamW bucket ``β``: 2^40 ≈ 1.1·10^12 parameters."""
MAX_STAGING_SLOTS = 64
"""Largest number of OffloadStreamAdamW staging slots ``s``."""
MAX_BYTES = 1 << 60
"""Largest byte size a plan may state (1 EiB)."""
MAX_BATCH_TOKENS = 1 << 62
"""Largest ``global_batch_tokens``."""

# ---- upper bounds of model fields (far beyond any real model; keep every count inside int64) ----
MAX_WIDTH = 1 << 20
"""Largest ``H``, ``I``, ``I_d``, shared-expert width, head widths and MLA ranks: 1,048,576."""
MAX_VOCAB = 1 << 24
"""Largest ``V``: 16,777,216 tokens (real vocabularies are below 2^18)."""
MAX_HEADS = 1 << 14
"""Largest number of attention heads: 16,384."""
MAX_EXPERTS = 1 << 14
"""Largest ``E``: 16,384 routed experts (real models have at most a few hundred)."""
MAX_MTP_LAYERS = 64
"""Largest number of multi-token-prediction layers."""
MAX_PARAMS = 1 << 50
"""Largest ``Θ``: 2^50 ≈ 1.1·10^15 parameters."""
MAX_NAME_CHARS = 128
"""Longest profile name (names are echoed in every report line)."""


class Frozen(BaseModel):
    """Immutable, strict-keyed pydantic model; every field is documented by its docstring."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    def __init__(self, /, **data) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_plan_in(exc) from None

    @classmethod
    def model_validate(cls, obj, **kwargs):
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise invalid_plan_in(exc) from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_int(cls, v, info: ValidationInfo):
        """Reject ``true``/``false`` where a number is expected (pydantic's lax mode reads them as
        1/0, so ``world_size: true`` would plan for one rank and ``value: true`` be 1.0), and a
        string where an integer is (``world_size: '8'``)."""
        if info.field_name is None:
            return v
        ann = cls.model_fields[info.field_name].annotation
        if isinstance(v, bool):
            if _wants_int(ann):
                raise PydanticCustomError("int_not_bool", "must be an integer, not a boolean")
            if _wants(ann, float):
                raise PydanticCustomError("float_not_bool", "must be a number, not a boolean")
        elif isinstance(v, (str, bytes)) and _wants_int(ann) and str not in typing.get_args(ann):
            # pydantic's lax mode reads "8" as 8: a quoted number in a file is a typo, not an int
            raise PydanticCustomError("int_not_str", "must be an integer, not a string")
        elif isinstance(v, float) and _wants_int(ann) and not _wants(ann, float):
            # lax mode reads 8.0 as 8 (and 1.31072e5 as 131072): an integer field takes an integer
            raise PydanticCustomError("int_not_float", "must be an integer, not a decimal number")
        elif _wants(ann, bool) and not isinstance(v, bool):
            # lax mode reads 'yes', 't', 'on' and 1 as true: a boolean field takes true or false
            raise PydanticCustomError("bool_not_other", "must be true or false")
        return v


def invalid_plan_in(exc: ValidationError) -> Exception:
    """The first ``InvalidPlan`` a validator raised inside ``exc``, else ``exc``. ``InvalidPlan`` is a
    ``ValueError``, which pydantic collects into a ``ValidationError``; constructing a schema object
    raises the planner's own one-line error, as ``validate`` does."""
    from planner.errors import InvalidPlan

    for err in exc.errors():
        found = (err.get("ctx") or {}).get("error")
        if isinstance(found, InvalidPlan):
            return found
    return exc


def check_name(v: str, field: str) -> str:
    """A profile name: 1 to ``MAX_NAME_CHARS`` characters, none of them a control character (names
    are echoed raw in reports, so an escape sequence would reach the terminal)."""
    from planner.errors import InvalidPlan

    if not 1 <= len(v) <= MAX_NAME_CHARS:
        raise InvalidPlan(field, v, f"must have 1 to {MAX_NAME_CHARS} characters (has {len(v)})",
                          "give a short name")
    if any(not ch.isprintable() for ch in v):
        raise InvalidPlan(field, v, "must not contain control characters",
                          "use letters, digits, '-', '.' and '_'")
    return v


def check_schema_version(v: int, field: str = "schema_version") -> int:
    """``v`` if it is this build's ``SCHEMA_VERSION``, else ``InvalidPlan`` (profiles and plan files
    of another version are never read silently)."""
    if v != SCHEMA_VERSION:
        from planner.errors import InvalidPlan

        raise InvalidPlan(field, v, f"must be {SCHEMA_VERSION}",
                          "regenerate the file with this version of planner")
    return v


def _wants(ann, kind: type) -> bool:
    """Whether a field annotation is ``kind`` or ``kind | None``."""
    return ann is kind or (kind in typing.get_args(ann) and bool not in typing.get_args(ann))


def _wants_int(ann) -> bool:
    """Whether a field annotation is ``int`` or ``int | None`` (not ``bool``)."""
    if ann is int:
        return True
    args = typing.get_args(ann)
    return bool(args) and int in args and bool not in args
